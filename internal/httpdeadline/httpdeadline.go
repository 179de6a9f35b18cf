// Package httpdeadline bounds how long a request's body may take to
// arrive, for the server's HTTP API and webhooks and the agent's intake:
// a client that sends a body a byte at a time, or announces one and sends
// nothing, is cut off, and the handler reads an error that wraps
// os.ErrDeadlineExceeded (answered 408 request_timeout).
package httpdeadline

import (
	"io"
	"net/http"
	"time"
)

// Body gives the body of each request h serves d to arrive, counted from
// the end of its headers: a client that sends a body a byte at a time
// is cut off (the handler reads a timeout error, the connection closes).
//
// This is a per-request read deadline rather than http.Server.ReadTimeout
// because ReadTimeout's deadline stays on the connection after the body:
// it would cancel a long-polling request (whose body is read at once and
// whose answer may take long) and end a WebSocket session,
// whose hijacked connection keeps the deadline. Requests without a body
// (GET, the WebSocket upgrade) get no deadline; a body's deadline is
// cleared once it was read to its end.
func Body(h http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody || r.Header.Get("Upgrade") != "" {
			h.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		if err := rc.SetReadDeadline(time.Now().Add(d)); err == nil {
			r.Body = &deadlineBody{ReadCloser: r.Body, rc: rc}
		}
		h.ServeHTTP(w, r)
	})
}

// deadlineBody clears the connection's read deadline once the body was
// read to its end, so that net/http's watch for a closed connection does
// not time out while the handler works (a long-polling lease).
type deadlineBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	done bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.done {
		b.done = true
		b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}
