package agent_test

import (
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/agent"
	"github.com/postbox-events/postbox/internal/server"
)

// churnProxy forwards TCP connections to a target and cuts each one
// abruptly (RST on both sides) 100–300 ms after it was accepted: a link
// that works, but never for long.
type churnProxy struct {
	ln     net.Listener
	target string
	cuts   atomic.Int64
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

func newChurnProxy(t *testing.T, target string) *churnProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &churnProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

func (p *churnProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			s.Close()
			continue
		}
		p.conns[c], p.conns[s] = struct{}{}, struct{}{}
		p.mu.Unlock()
		life := 100*time.Millisecond + rand.N(200*time.Millisecond)
		cut := time.AfterFunc(life, func() {
			if p.cut(c, s) {
				p.cuts.Add(1)
			}
		})
		p.wg.Go(func() { pipe(s, c) })
		p.wg.Go(func() {
			pipe(c, s)
			cut.Stop()
			p.cut(c, s)
		})
	}
}

func pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// cut closes both sides with an RST; it reports whether they were open.
func (p *churnProxy) cut(conns ...net.Conn) bool {
	open := false
	for _, c := range conns {
		p.mu.Lock()
		_, ok := p.conns[c]
		delete(p.conns, c)
		p.mu.Unlock()
		if !ok {
			continue
		}
		open = true
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		c.Close()
	}
	return open
}

func (p *churnProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	p.closed = true
	var all []net.Conn
	for c := range p.conns {
		all = append(all, c)
	}
	p.mu.Unlock()
	p.cut(all...)
	p.wg.Wait()
}

// TestAgentsDrainThroughAFlakyLink: five agents with the default window
// send through a link that cuts every connection after 100–300 ms. Each
// connection must make progress: every outbox drains within a generous
// deadline (it takes seconds, a minute or two on a loaded machine under
// -race; with a fixed window of 4096 the same oldest rows were resent on
// every connection and the outboxes never drained), the server stores every
// event once, and no event is delivered more than a few dozen times
// (the server counts deliveries; under the race detector a connection
// carries a few dozen events before its cut).
func TestAgentsDrainThroughAFlakyLink(t *testing.T) {
	if testing.Short() {
		t.Skip("sends thousands of events through a flaky link")
	}
	srv := startServer(t, server.Config{})
	px := newChurnProxy(t, srv.addr)
	// Enough events that a connection cannot carry them all before its
	// cut: the race detector slows the server about tenfold.
	agents, n, per := 5, 20_000, 1000
	if raceDetector {
		n, per = 600, 200
	}
	tas := make([]*testAgent, agents)
	ids := make([][]string, agents)
	for i := range tas {
		// The default window and batch: only the timings are shortened.
		tas[i] = startAgent(t, agent.Config{Server: "ws://" + px.ln.Addr().String(), DeviceID: fmt.Sprintf("dev-churn-%d", i)})
	}
	var wg sync.WaitGroup
	for i, ta := range tas {
		wg.Go(func() {
			for j := 0; j < n; j += per {
				ids[i] = append(ids[i], ta.postBatch(t, smallEvents(per, j))...)
			}
		})
	}
	wg.Wait()
	start := time.Now()
	drainedAll := func() bool {
		if !srv.has(t, int64(agents*n)) {
			return false
		}
		for _, ta := range tas {
			if !ta.empty(t) {
				return false
			}
		}
		return true
	}
	for tick := time.NewTicker(10 * time.Millisecond); !drainedAll(); <-tick.C {
		if time.Since(start) > 300*time.Second {
			var stored int64
			srv.srv.Store().ReadDB().QueryRow(`SELECT count(*) FROM stream_events`).Scan(&stored)
			var pending []int64
			for _, ta := range tas {
				p, _ := ta.counts(t)
				pending = append(pending, p)
			}
			t.Fatalf("after %s the server stores %d of %d events and the outboxes hold %v pending (%d connections cut)",
				time.Since(start).Round(time.Second), stored, agents*n, pending, px.cuts.Load())
		}
	}
	drained := time.Since(start)

	var total, distinct, deliveries, most int64
	err := srv.srv.Store().ReadDB().QueryRow(`SELECT count(*), count(DISTINCT source_native_id), coalesce(sum(attempt_count), 0), coalesce(max(attempt_count), 0)
		FROM stream_events`).Scan(&total, &distinct, &deliveries, &most)
	if err != nil {
		t.Fatal(err)
	}
	if total != int64(agents*n) || distinct != int64(agents*n) {
		t.Fatalf("server holds %d events, %d distinct; want %d each", total, distinct, agents*n)
	}
	stored := map[string]bool{}
	rows, err := srv.srv.Store().ReadDB().Query(`SELECT source_native_id FROM stream_events`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		stored[id] = true
	}
	rows.Close()
	for i := range ids {
		for _, id := range ids[i] {
			if !stored[id] {
				t.Fatalf("agent %d: event %s is missing at the server", i, id)
			}
		}
	}
	if px.cuts.Load() == 0 {
		t.Fatal("the proxy cut no connection; the test wants a flaky link")
	}
	if most > 50 {
		t.Errorf("an event was delivered %d times; want a few at most", most)
	}
	t.Logf("drained %d events from %d agents in %s through %d cut connections; %d deliveries (%d redeliveries), at most %d for one event",
		agents*n, agents, drained.Round(time.Millisecond), px.cuts.Load(), deliveries, deliveries-total, most)
}
