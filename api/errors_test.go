package api_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/postbox-events/postbox/api"
)

// TestCodes: each code is in the table once, with an error status and a
// meaning, and Status answers it; a code not in the table is a 500.
func TestCodes(t *testing.T) {
	seen := map[api.Code]bool{}
	for _, c := range api.Codes() {
		if seen[c.Code] {
			t.Errorf("%s: twice in the table", c.Code)
		}
		seen[c.Code] = true
		if c.Status < 400 || c.Status > 599 || http.StatusText(c.Status) == "" {
			t.Errorf("%s: status %d is not an HTTP error status", c.Code, c.Status)
		}
		if c.When == "" {
			t.Errorf("%s: no meaning", c.Code)
		}
		if got := c.Code.Status(); got != c.Status {
			t.Errorf("%s.Status() = %d, want %d", c.Code, got, c.Status)
		}
	}
	if len(seen) < 10 {
		t.Fatalf("%d codes in the table", len(seen))
	}
	if got := api.Code("no_such_code").Status(); got != http.StatusInternalServerError {
		t.Errorf("an unknown code's status: %d, want 500", got)
	}
	if got := api.CodeNotFound.Status(); got != http.StatusNotFound {
		t.Errorf("not_found: %d, want 404", got)
	}
}

// TestErrorJSON: a typed code travels as the plain string it always was.
func TestErrorJSON(t *testing.T) {
	data, err := json.Marshal(api.ErrorResponse{Error: api.Error{Code: api.CodeLeaseLost, Message: "m"}})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"error":{"code":"lease_lost","message":"m"}}`; string(data) != want {
		t.Errorf("got %s, want %s", data, want)
	}
}
