// Package httproute answers for a ServeMux what it would answer itself in
// plain text: which methods a path takes, so that a handler registered for
// "/" can say 405 (with Allow) or 404 in the JSON of its API.
package httproute

import "net/http"

// methods are the methods a route may take.
var methods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

// Allowed returns the methods for which mux routes r's path to a handler
// of its own, not to the one registered for "/": none when no route takes
// the path.
func Allowed(mux *http.ServeMux, r *http.Request) []string {
	var allow []string
	for _, m := range methods {
		other := *r
		other.Method = m
		if _, pattern := mux.Handler(&other); pattern != "" && pattern != "/" {
			allow = append(allow, m)
		}
	}
	return allow
}
