package names_test

import (
	"strings"
	"testing"

	"github.com/postbox-events/postbox/internal/names"
)

// TestValid: the names Valid takes and those it refuses.
func TestValid(t *testing.T) {
	for _, c := range []struct {
		name string
		ok   bool
	}{
		{"devices", true}, {"gh.events_1-x", true}, {"a", true}, {strings.Repeat("a", 128), true}, {".a", true},
		{"", false}, {".", false}, {"..", false}, {"...", false}, {"a/b", false}, {"a b", false}, {"é", false},
		{strings.Repeat("a", 129), false},
	} {
		if got := names.Valid(c.name); got != c.ok {
			t.Errorf("Valid(%q) = %v, want %v", c.name, got, c.ok)
		}
	}
}
