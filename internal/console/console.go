// Package console is the web console of postbox serve: pages of HTML, CSS
// and ES modules, embedded in the binary with go:embed and served under
// /ui/, with no build step.
//
// The pages hold no data and no secret of their own. They call the
// operator API (/v1/…, /webhooks, /health) from the browser with the same
// API token as the CLI: asked for when the API answers 401, kept in the
// browser's sessionStorage for the tab's session and sent only in the
// Authorization header, never in a URL. The static files need no token.
package console

import (
	"embed"
	"io/fs"
	"net/http"
)

// Path is where postbox serve serves the console.
const Path = "/ui/"

//go:embed static
var static embed.FS

// csp lets the pages load their own files and call their own origin,
// nothing else: no inline script, no other host.
const csp = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"

// Handler serves the console's files for requests under Path.
func Handler() http.Handler {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embedded tree always has static/
	}
	files := http.FileServerFS(sub)
	return http.StripPrefix(Path[:len(Path)-1], http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	}))
}
