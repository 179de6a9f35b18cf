package server

import (
	"net"
	"net/http"
	"strings"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/ingress"
	"github.com/postbox-events/postbox/internal/intake"
)

// A web page the operator opens can send requests to a server on their
// loopback: a form or a no-cors fetch (CSRF), or, through a name that
// resolves to the page's host first and to 127.0.0.1 later, requests it
// can read the answers of (DNS rebinding). browserGuard keeps both away
// from the operator API, the console and /metrics, whether an API token
// is set or not:
//
//   - a Host that is neither an IP address, localhost, the host of
//     Config.Addr nor one of Config.AllowedHosts is answered 421: a
//     rebinding page reaches the server under its own name, never under
//     an IP address (a browser that asks an IP address sends it as Host);
//   - a state-changing request (POST, PUT, PATCH, DELETE) from another
//     origin, as the browser says with Sec-Fetch-Site or Origin, is
//     answered 403, unless the origin is one of Config.AllowedOrigins;
//   - a state-changing request with a body that is not JSON is answered
//     415: a page can send text/plain or a form without asking the
//     server first, but not application/json.
//
// Intake stays open to every sender: webhooks (POST /webhooks...), the
// WebSocket ingress (whose library checks Origin itself), /health and
// /ready, which probes reach under names the server cannot know.
type browserGuard struct {
	anyHost bool
	hosts   []string // lowercase names; ".example.com" takes its subdomains
	origins *http.CrossOriginProtection
}

func newBrowserGuard(cfg Config) (*browserGuard, error) {
	g := &browserGuard{origins: http.NewCrossOriginProtection()}
	if host, _, err := net.SplitHostPort(cfg.Addr); err == nil && host != "" {
		g.hosts = append(g.hosts, strings.ToLower(host))
	}
	for _, h := range cfg.AllowedHosts {
		h = strings.ToLower(strings.TrimSpace(h))
		switch {
		case h == "":
		case h == "*":
			g.anyHost = true
		case strings.ContainsAny(h, ":/ ") && net.ParseIP(h) == nil:
			return nil, configErrorf("Config.AllowedHosts: %q is not a host name (write postbox.example.com or .example.com, without a scheme or port)", h)
		default:
			g.hosts = append(g.hosts, strings.TrimSuffix(h, "."))
		}
	}
	for _, o := range cfg.AllowedOrigins {
		if o = strings.TrimSpace(o); o == "" {
			continue
		}
		if err := g.origins.AddTrustedOrigin(o); err != nil {
			return nil, configErrorf("Config.AllowedOrigins: %q is not an origin (write scheme://host[:port], e.g. https://ops.example.com): %v", o, err)
		}
	}
	return g, nil
}

// wrap returns h behind the guard. routed reports whether a route takes
// the request: one no route takes is left to h's 404 or 405.
func (g *browserGuard) wrap(h http.Handler, routed func(*http.Request) bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if isIntake(r) {
			h.ServeHTTP(w, r)
			return
		}
		if !g.hostAllowed(r.Host) {
			writeError(w, api.CodeHostNotAllowed, "host %q is not one this server answers the operator API under: "+
				"use its IP address or localhost, or start serve with --allowed-hosts %s (POSTBOX_ALLOWED_HOSTS)",
				r.Host, hostname(r.Host))
			return
		}
		if err := g.origins.Check(r); err != nil {
			origin := r.Header.Get("Origin")
			if origin == "" {
				origin = "a page of another site (Sec-Fetch-Site: " + r.Header.Get("Sec-Fetch-Site") + ")"
			}
			writeError(w, api.CodeCrossOrigin, "%s %s from %s refused: only the console at the server's own origin may change postbox "+
				"from a browser; serve --allowed-origins ORIGIN (POSTBOX_ALLOWED_ORIGINS) lets another", r.Method, r.URL.Path, origin)
			return
		}
		if changes(r) && r.ContentLength != 0 && !intake.IsJSONMediaType(r.Header.Get("Content-Type")) && routed(r) {
			ct := r.Header.Get("Content-Type")
			if ct == "" {
				ct = "none"
			}
			writeError(w, api.CodeUnsupportedMediaType, "%s %s takes a JSON body (Content-Type: application/json), not Content-Type %s",
				r.Method, r.URL.Path, ct)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// hostAllowed reports whether the Host header names this server under a
// name no page can rebind: an IP address, localhost, the listen address's
// host or an allowed one.
func (g *browserGuard) hostAllowed(hostport string) bool {
	if g.anyHost || hostport == "" { // HTTP/1.0 without Host: no browser
		return true
	}
	host := strings.TrimSuffix(hostname(hostport), ".")
	if net.ParseIP(host) != nil || host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	for _, h := range g.hosts {
		if host == h || (strings.HasPrefix(h, ".") && strings.HasSuffix(host, h)) {
			return true
		}
	}
	return false
}

// hostname is the lowercase host of a Host header, without its port or
// an IPv6 address's brackets.
func hostname(hostport string) string {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	return strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"))
}

// isIntake reports whether r is one of the routes senders use, open to any
// origin and host.
func isIntake(r *http.Request) bool {
	p := r.URL.Path
	switch {
	case r.Method == http.MethodPost && (p == "/webhooks" || strings.HasPrefix(p, "/webhooks/")):
		return true
	case p == ingress.WSPath || p == "/health" || p == "/ready":
		return true
	}
	return false
}

// changes reports whether r's method may change state.
func changes(r *http.Request) bool {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return false
	}
	return true
}
