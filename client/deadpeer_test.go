package client_test

import (
	"context"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-events/postbox/client"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/servertest"
	"github.com/postbox-events/postbox/internal/testenv"
)

// blackhole is a TCP proxy that can stop forwarding without closing
// anything: to both ends, the other has silently vanished.
type blackhole struct {
	ln      net.Listener
	target  string
	dead    atomic.Bool
	carried atomic.Int64 // bytes forwarded, both ways
	mu      sync.Mutex
	conns   []net.Conn
}

func newBlackhole(t *testing.T, target string) *blackhole {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{ln: ln, target: target}
	t.Cleanup(func() {
		ln.Close()
		b.mu.Lock()
		for _, c := range b.conns {
			c.Close()
		}
		b.mu.Unlock()
	})
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			b.mu.Lock()
			b.conns = append(b.conns, in, out)
			b.mu.Unlock()
			go b.pipe(in, out)
			go b.pipe(out, in)
		}
	}()
	return b
}

// pipe copies until the blackhole goes dead, then swallows everything.
func (b *blackhole) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		if !b.dead.Load() {
			dst.Write(buf[:n])
			b.carried.Add(int64(n))
		}
	}
}

// TestDeadPeerIsNoticed: when the network silently drops everything, both
// the client and the server notice through unanswered pings and let the
// connection go, instead of holding it forever.
func TestDeadPeerIsNoticed(t *testing.T) {
	// Pings are frequent, and their timeout long enough that a healthy
	// connection on a loaded machine under the race detector keeps up.
	srv := servertest.Start(t, server.Config{PingInterval: 50 * time.Millisecond, PingTimeout: 2 * time.Second}, nil)
	hole := newBlackhole(t, srv.Addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := client.Dial(ctx, "ws://"+hole.ln.Addr().String(), client.Options{PingInterval: 50 * time.Millisecond, PingTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Send(ctx, []client.Message{message(t, "evt_before_the_hole", true)}); err != nil {
		t.Fatalf("send before the network died: %v", err)
	}
	// Pings and pongs pass while the network works: wait for a few
	// hundred bytes of them.
	carried := hole.carried.Load()
	testenv.Eventually(t, 30*time.Second, "pings and pongs to pass", func() bool { return hole.carried.Load() > carried+200 })
	if err := conn.Err(); err != nil {
		t.Fatalf("a healthy connection broke: %v", err)
	}
	if got := connections(t, srv); got != 1 {
		t.Fatalf("server has %d connections, want 1", got)
	}

	hole.dead.Store(true)
	testenv.Eventually(t, 30*time.Second, "the client to notice the dead peer", func() bool { return conn.Err() != nil })
	if err := conn.Err(); !strings.Contains(err.Error(), "ping") {
		t.Errorf("client error %q does not say a ping went unanswered", err)
	}
	testenv.Eventually(t, 30*time.Second, "the server to drop the connection", func() bool { return connections(t, srv) == 0 })
}

// connections reads postbox_ingress_connections from /metrics.
func connections(t *testing.T, srv *servertest.Server) int {
	t.Helper()
	resp, err := srv.HTTP.Get(srv.Base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, "postbox_ingress_connections "); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return int(n)
		}
	}
	t.Fatal("no postbox_ingress_connections in /metrics")
	return -1
}
