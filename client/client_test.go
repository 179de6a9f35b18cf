package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/client"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/servertest"
	"github.com/postbox-events/postbox/internal/testenv"
)

// startServer runs a real postbox server on a loopback port until the
// test ends (or stop is called) and returns its ws:// URL.
func startServer(t *testing.T) (srv *server.Server, url string, stop func()) {
	t.Helper()
	s := servertest.Start(t, server.Config{}, nil)
	return s.Srv, s.WS, s.Stop
}

func dial(t *testing.T, url string) *client.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, url, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func message(t testing.TB, id string, valid bool) client.Message {
	t.Helper()
	env := postbox.Envelope{
		SchemaVersion: postbox.SchemaVersion, EventID: id, Type: "test.event",
		TS: "2030-01-02T03:04:05Z", SessionID: "sess-1", DeviceID: "dev-1",
		Payload: json.RawMessage(`{"id":"` + id + `"}`),
	}
	if !valid {
		env.Type = "" // refused: missing_field type
	}
	m, err := client.Encode(env)
	if err != nil {
		t.Fatal(err)
	}
	if m.EventID != id {
		t.Fatalf("Encode: event id %q, want %q", m.EventID, id)
	}
	return m
}

func TestURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"ws://host:8000", "ws://host:8000/v1/ws"},
		{"ws://host:8000/", "ws://host:8000/v1/ws"},
		{"wss://host", "wss://host/v1/ws"},
		{"http://host:8000", "ws://host:8000/v1/ws"},
		{"https://host:8443", "wss://host:8443/v1/ws"},
		{"ws://host:8000/custom/ingest", "ws://host:8000/custom/ingest"},
		{"https://host/edge/ws", "wss://host/edge/ws"},
		{"ws://127.0.0.1:9/v1/ws", "ws://127.0.0.1:9/v1/ws"},
		{"grpc://host:9000", "grpc://host:9000"},
		{"grpcs://host:9443/", "grpcs://host:9443"},
	} {
		got, err := client.URL(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("URL(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{
		"ftp://host:21",
		"host:8000",              // no scheme: parsed as scheme "host"
		"//host:8000",            // no scheme
		"ws://",                  // no host
		"grpc://host:9000/v1/ws", // a gRPC url has no path
		"grpc://",                // no host
		"http:///v1/ws",          // no host
		"ws://host:8000%",        // does not parse
		"",
	} {
		if got, err := client.URL(bad); err == nil {
			t.Errorf("URL(%q) = %q, want an error", bad, got)
		}
	}
	if _, err := client.Dial(context.Background(), "ftp://host", client.Options{}); err == nil {
		t.Error("Dial with a bad URL succeeded")
	}
}

// TestNewAPIURL: the API's URL is a scheme, a host and a path prefix the
// client's paths are joined to: anything else is refused, naming it,
// and a password is not shown.
func TestNewAPIURL(t *testing.T) {
	for _, ok := range []string{"http://host:8000", "https://host/postbox/", "http://127.0.0.1:8000/"} {
		if _, err := client.NewAPI(ok, client.APIOptions{}); err != nil {
			t.Errorf("NewAPI(%q): %v", ok, err)
		}
	}
	for _, c := range []struct{ url, want string }{
		{"ws://host:8000", "want http://HOST:PORT"},
		{"http://host:8000?token=x", "no query"},
		{"http://host:8000/?", "no query"},
		{"http://host:8000/#top", "fragment"},
		{"http://me:s3cret@host:8000", "credentials in the URL"},
	} {
		_, err := client.NewAPI(c.url, client.APIOptions{})
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("NewAPI(%q) = %v, want an error saying %q (without the password)", c.url, err, c.want)
		}
	}
}

// TestSendConcurrentCallersGetTheirOwnReplies has many goroutines share one
// Conn. Every envelope has its own id and every tenth is invalid, so a
// reply handed to the wrong caller or the wrong position shows up as a
// wrong id or a wrong status.
func TestSendConcurrentCallersGetTheirOwnReplies(t *testing.T) {
	srv, url, _ := startServer(t)
	c := dial(t, url)
	const goroutines, sends = 24, 15
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	var mu sync.Mutex
	valid := 0
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := 0
			for s := range sends {
				size := 1 + (g+s)%9
				msgs := make([]client.Message, size)
				ok := make([]bool, size)
				for i := range msgs {
					id := fmt.Sprintf("evt-%02d-%02d-%d", g, s, i)
					ok[i] = (g+s+i)%10 != 0
					msgs[i] = message(t, id, ok[i])
				}
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				replies, err := c.Send(ctx, msgs)
				cancel()
				if err != nil {
					errs <- fmt.Errorf("goroutine %d send %d: %w", g, s, err)
					return
				}
				if len(replies) != len(msgs) {
					errs <- fmt.Errorf("goroutine %d send %d: %d replies to %d envelopes", g, s, len(replies), len(msgs))
					return
				}
				for i, r := range replies {
					switch {
					case r.EventID != msgs[i].EventID:
						errs <- fmt.Errorf("reply %d of %s: for %q", i, msgs[i].EventID, r.EventID)
						return
					case ok[i] && (!r.OK() || r.Duplicate || r.AckTS == ""):
						errs <- fmt.Errorf("valid %s: %+v, want a fresh ACK", msgs[i].EventID, r)
						return
					case !ok[i] && (r.OK() || r.Code != postbox.CodeMissingField || r.Field != "type" || r.Retryable):
						errs <- fmt.Errorf("invalid %s: %+v, want a NACK missing_field type", msgs[i].EventID, r)
						return
					}
					if ok[i] {
						n++
					}
				}
			}
			mu.Lock()
			valid += n
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	st, err := srv.Streams().Stats(context.Background(), server.DeviceSource)
	if err != nil {
		t.Fatal(err)
	}
	if stored := int(st.Events); stored != valid {
		t.Fatalf("server stored %d events, want the %d valid ones", stored, valid)
	}

	// Sent again, each is a duplicate, still matched to its own id.
	again := []client.Message{message(t, "evt-03-04-2", true), message(t, "evt-00-01-1", true), message(t, "evt-new", true)}
	replies, err := c.Send(context.Background(), again)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, true, false} {
		if replies[i].EventID != again[i].EventID || !replies[i].OK() || replies[i].Duplicate != want {
			t.Fatalf("resend reply %d: %+v, want %s duplicate=%v", i, replies[i], again[i].EventID, want)
		}
	}
}

func TestSendOnClosedConn(t *testing.T) {
	_, url, _ := startServer(t)
	c := dial(t, url)
	if _, err := c.Send(context.Background(), []client.Message{message(t, "evt-1", true)}); err != nil {
		t.Fatalf("send on an open conn: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	_, err := c.Send(context.Background(), []client.Message{message(t, "evt-2", true)})
	if !errors.Is(err, client.ErrClosed) {
		t.Fatalf("Send after Close = %v, want ErrClosed", err)
	}
	if !errors.Is(c.Err(), client.ErrClosed) {
		t.Fatalf("Err after Close = %v, want ErrClosed", c.Err())
	}
}

func TestSendAfterServerWentAway(t *testing.T) {
	_, url, stop := startServer(t)
	c := dial(t, url)
	if _, err := c.Send(context.Background(), []client.Message{message(t, "evt-1", true)}); err != nil {
		t.Fatal(err)
	}
	stop()
	testenv.Eventually(t, 30*time.Second, "the conn to notice that the server went away", func() bool { return c.Err() != nil })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Send(ctx, []client.Message{message(t, "evt-2", true)}); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("Send after the server went away = %v, want ErrClosed", err)
	}
}
