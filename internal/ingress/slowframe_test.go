package ingress_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/postbox-events/postbox/client"
	"github.com/postbox-events/postbox/internal/ingress"
	"github.com/postbox-events/postbox/internal/testenv"
)

// rawConn is a WebSocket connection written by hand, so that a test can
// send a frame's header and then its body as slowly as it likes.
type rawConn struct {
	net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, url string) *rawConn {
	t.Helper()
	host := strings.TrimPrefix(url, "ws://")
	conn, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: %s\r\n\r\n", host, ingress.Subprotocol)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %s, want 101", resp.Status)
	}
	return &rawConn{Conn: conn, br: br}
}

// startFrame sends the header of a text frame of size bytes, masked with
// a zero key (so its body is sent as is).
func (c *rawConn) startFrame(t *testing.T, size int) {
	t.Helper()
	h := []byte{0x81, 0x80 | 127}
	h = binary.BigEndian.AppendUint64(h, uint64(size))
	h = append(h, 0, 0, 0, 0)
	if _, err := c.Write(h); err != nil {
		t.Fatal(err)
	}
}

// closed waits until the server closes c, reading what it sends first,
// and reports whether it did before timeout (a bound on a failing test,
// not on the server).
func (c *rawConn) closed(timeout time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(timeout))
	_, err := io.Copy(io.Discard, c.br)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// TestSlowFramesDoNotStallOthers: peers that start frames and send their
// bodies a byte at a time hold buffer only for the bytes that arrived, so
// they do not stop a healthy connection from being read and answered,
// even with a buffer of a single frame's size.
func TestSlowFramesDoNotStallOthers(t *testing.T) {
	const slow, frameBytes = 8, 1 << 20
	st := newStore()
	st.letGo()
	reg := prometheus.NewRegistry()
	_, url := serve(t, st, ingress.Config{MaxFrameBytes: frameBytes, MaxBufferedBytes: frameBytes, PingInterval: -1,
		Metrics: ingress.NewMetrics(reg)})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	for range slow {
		c := dialRaw(t, url)
		c.startFrame(t, frameBytes/2)
		if _, err := c.Write([]byte(`[{"schema_version":1,"event_id":"slow"`)); err != nil {
			t.Fatal(err)
		}
		go func() { // the rest of the body, a byte at a time, until the test ends
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
					if _, err := c.Write([]byte(" ")); err != nil {
						return
					}
				}
			}
		}()
	}
	testenv.Eventually(t, 30*time.Second, "every slow frame to be read and buffered", func() bool {
		return metric(t, reg, "postbox_ingress_frames_total") == slow && metric(t, reg, "postbox_ingress_buffered_bytes") > 0
	})

	c, err := client.Dial(ctx, url, client.Options{PingInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sendCtx, cancelSend := context.WithTimeout(ctx, 30*time.Second) // bounds a failing test
	defer cancelSend()
	rs, err := c.Send(sendCtx, msgs(t, "healthy", "pi-1", 10))
	if err != nil {
		t.Fatalf("a healthy connection beside %d slow frames: %v, want its envelopes answered", slow, err)
	}
	for _, r := range rs {
		if !r.OK() {
			t.Errorf("%s: %+v, want an ACK", r.EventID, r)
		}
	}
	if got := metric(t, reg, "postbox_ingress_buffered_bytes"); got > frameBytes {
		t.Errorf("buffered %v bytes, over the %d allowed", got, frameBytes)
	}
}

// TestFrameTimeoutClosesTheConnection: a frame whose body does not arrive
// within FrameTimeout closes its connection and frees its buffer, while a
// connection idle between frames for longer stays open and is answered.
func TestFrameTimeoutClosesTheConnection(t *testing.T) {
	st := newStore()
	st.letGo()
	reg := prometheus.NewRegistry()
	_, url := serve(t, st, ingress.Config{FrameTimeout: 200 * time.Millisecond, PingInterval: -1, Metrics: ingress.NewMetrics(reg)})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	idle, err := client.Dial(ctx, url, client.Options{PingInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()

	slow := dialRaw(t, url)
	slow.startFrame(t, 64<<10)
	if _, err := slow.Write(bytes.Repeat([]byte(" "), 1000)); err != nil {
		t.Fatal(err)
	}
	if !slow.closed(30 * time.Second) {
		t.Fatal("the connection of a frame whose body did not arrive is still open")
	}
	testenv.Eventually(t, 10*time.Second, "the closed connection's buffer to be freed", func() bool {
		return metric(t, reg, "postbox_ingress_buffered_bytes") == 0
	})
	if got := metric(t, reg, "postbox_ingress_frames_total"); got != 1 {
		t.Fatalf("frames read %v, want the slow one only", got)
	}

	// The idle connection has waited longer than the frame timeout.
	rs, err := idle.Send(ctx, msgs(t, "idle", "pi-1", 3))
	if err != nil || len(rs) != 3 {
		t.Fatalf("a connection idle past the frame timeout: %v %+v, want it open and answered", err, rs)
	}
	for _, r := range rs {
		if !r.OK() {
			t.Errorf("%s: %+v, want an ACK", r.EventID, r)
		}
	}
}
