package console_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/postbox-events/postbox/internal/console"
)

// TestHandler checks the console's files without a browser: each is
// served under /ui/ with its type and a Content-Security-Policy, every file
// index.html and the modules refer to is there, and none loads anything
// from another host.
func TestHandler(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle("GET "+console.Path, console.Handler())
	srv := httptest.NewServer(mux)
	defer srv.Close()

	get := func(path string) (*http.Response, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	resp, index := get("/ui/")
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET /ui/: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	refs := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?:src|href)="([^"#:]+)"`).FindAllStringSubmatch(index, -1) {
		refs[m[1]] = true
	}
	if !refs["app.js"] || !refs["style.css"] {
		t.Fatalf("index.html refers to %v, want app.js and style.css among them", refs)
	}
	types := map[string]string{".js": "text/javascript", ".css": "text/css"}
	for ref := range refs {
		resp, body := get("/ui/" + ref)
		if resp.StatusCode != 200 {
			t.Errorf("GET /ui/%s: %d", ref, resp.StatusCode)
			continue
		}
		for ext, want := range types {
			if strings.HasSuffix(ref, ext) && !strings.HasPrefix(resp.Header.Get("Content-Type"), want) {
				t.Errorf("GET /ui/%s: Content-Type %q, want %s", ref, resp.Header.Get("Content-Type"), want)
			}
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") || !strings.Contains(csp, "connect-src 'self'") {
			t.Errorf("GET /ui/%s: Content-Security-Policy %q", ref, csp)
		}
		if strings.HasSuffix(ref, ".js") {
			for _, m := range regexp.MustCompile(`from '\./([^']+)'`).FindAllStringSubmatch(body, -1) {
				if r, _ := get("/ui/" + m[1]); r.StatusCode != 200 {
					t.Errorf("%s imports %s: %d", ref, m[1], r.StatusCode)
				}
			}
		}
		if m := regexp.MustCompile(`(?:src|href|from|import)\s*=?\s*["'(]?https?://`).FindString(body); m != "" {
			t.Errorf("%s loads from another host: %q", ref, m)
		}
	}
	if resp, _ := get("/ui/nope.js"); resp.StatusCode != 404 {
		t.Errorf("GET /ui/nope.js: %d, want 404", resp.StatusCode)
	}
}
