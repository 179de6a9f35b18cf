package server

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// HeaderRequestID names a request for logs: taken from the request when
// it has a usable one, generated otherwise, and echoed in the response.
const HeaderRequestID = "X-Request-ID"

// maxRequestID bounds a request id taken from a client.
const maxRequestID = 128

type requestIDKey struct{}

// RequestID returns the request id of a request's context, or "".
func RequestID(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey{}).(string)
	return id
}

// validRequestID reports whether a client's request id is usable in a
// header and a log line: 1 to maxRequestID printable ASCII characters.
func validRequestID(id string) bool {
	if id == "" || len(id) > maxRequestID {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			return false
		}
	}
	return true
}

// newRequestID returns 16 random bytes in hex.
func newRequestID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// withRequestID gives every request an id (its X-Request-ID when usable,
// else a new one), sets it on the response, puts it in the request's
// context (RequestID) and logs the request once it is answered: at debug
// level, at warn level when it failed with a 5xx status. The id is not
// added to the request's headers, so a webhook keeps only an id its
// sender gave.
func withRequestID(h http.Handler, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(HeaderRequestID)
		if !validRequestID(id) {
			id = newRequestID()
		}
		w.Header().Set(HeaderRequestID, id)
		r = r.WithContext(context.WithValue(r.Context(), requestIDKey{}, id))
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		h.ServeHTTP(sw, r)
		level := slog.LevelDebug
		if sw.status >= 500 {
			level = slog.LevelWarn
		}
		if log.Enabled(r.Context(), level) {
			log.Log(r.Context(), level, "http request", "request_id", id, "method", r.Method, "path", r.URL.Path,
				"status", sw.status, "bytes", sw.bytes, "took", time.Since(start), "remote_addr", r.RemoteAddr)
		}
	})
}

// statusWriter records the status and size of a response. It passes
// Flush and Hijack (WebSocket upgrades) through, and Unwrap for
// http.ResponseController.
type statusWriter struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(p)
	w.bytes += int64(n)
	return n, err
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.status == 0 {
		w.status = http.StatusSwitchingProtocols
	}
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
