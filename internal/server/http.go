package server

import (
	"encoding/json"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of the HTTP limits (Config).
const (
	// DefaultReadTimeout bounds how long a request's body may take to
	// arrive after its headers.
	DefaultReadTimeout = 30 * time.Second
	// DefaultReadHeaderTimeout bounds how long a request's headers may
	// take to arrive (or ReadTimeout when that is shorter).
	DefaultReadHeaderTimeout = 10 * time.Second
	// DefaultIdleTimeout closes a keep-alive connection that sends no
	// request for this long.
	DefaultIdleTimeout = 60 * time.Second
	// DefaultMaxHeaderBytes bounds a request's headers: larger ones get 431.
	DefaultMaxHeaderBytes = 64 << 10
	// DefaultMaxConnections bounds the open TCP connections, HTTP and
	// WebSocket alike.
	DefaultMaxConnections = 10000
)

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// connLimit counts the open connections of a listener and closes new
// ones at once while max are open (see limitListener).
type connLimit struct {
	max     int64
	open    atomic.Int64
	refused prometheus.Counter
}

func newConnLimit(reg prometheus.Registerer, max int) *connLimit {
	l := &connLimit{max: int64(max), refused: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "postbox_http_connections_refused_total",
		Help: "TCP connections closed at once because --max-connections were open.",
	})}
	reg.MustRegister(l.refused, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "postbox_http_connections",
		Help: "Open TCP connections to the server (HTTP, WebSocket and TLS alike).",
	}, func() float64 { return float64(l.open.Load()) }))
	return l
}

// limitListener is a listener that holds at most max connections open:
// connection max+1 is accepted and closed at once, counted in
// postbox_http_connections_refused_total, so that the backlog does not
// fill with clients that wait. It counts every TCP connection the server
// holds: plain HTTP, keep-alives, WebSocket sessions after their upgrade.
type limitListener struct {
	net.Listener
	l *connLimit
}

func (ln *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := ln.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if ln.l.open.Add(1) > ln.l.max {
			ln.l.open.Add(-1)
			ln.l.refused.Inc()
			c.Close()
			continue
		}
		return &countedConn{Conn: c, l: ln.l}, nil
	}
}

// countedConn gives its place back when it is closed.
type countedConn struct {
	net.Conn
	l    *connLimit
	once sync.Once
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.open.Add(-1) })
	return err
}
