package outboxredis_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/postbox-events/postbox/outbox/outboxredis"
)

// fakeRedis speaks just enough RESP2 to stand in for a server of another
// version, or one in a state the shared test server must not be put in: it
// answers INFO with version, XADD with a new entry ID, other commands with
// OK, any command with the error set by fail, and records the commands it
// got.
type fakeRedis struct {
	version string
	ln      net.Listener

	mu   sync.Mutex
	cmds [][]string
	errs map[string]string // upper-case command name → error reply
	wg   sync.WaitGroup
}

func startFakeRedis(t *testing.T, version string) *fakeRedis {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeRedis{version: version, ln: ln}
	f.wg.Go(f.accept)
	t.Cleanup(func() { ln.Close(); f.wg.Wait() })
	return f
}

func (f *fakeRedis) accept() {
	var conns sync.WaitGroup
	var open []net.Conn
	defer func() {
		for _, c := range open { // the listener closed: the test is over
			c.Close()
		}
		conns.Wait()
	}()
	for {
		conn, err := f.ln.Accept()
		if err != nil {
			return
		}
		open = append(open, conn)
		conns.Go(func() { f.serve(conn) })
	}
}

func (f *fakeRedis) serve(conn net.Conn) {
	defer conn.Close()
	r := bufio.NewReader(conn)
	seq := 0
	for {
		cmd, err := readCommand(r)
		if err != nil {
			return
		}
		f.mu.Lock()
		f.cmds = append(f.cmds, cmd)
		errReply := f.errs[strings.ToUpper(cmd[0])]
		f.mu.Unlock()
		var reply string
		switch strings.ToUpper(cmd[0]) {
		case "HELLO":
			reply = "-ERR unknown command 'HELLO'\r\n"
		case "PING":
			reply = "+PONG\r\n"
		case "INFO":
			body := "# Server\r\nredis_version:" + f.version + "\r\nredis_mode:standalone\r\n"
			reply = fmt.Sprintf("$%d\r\n%s\r\n", len(body), body)
		case "XADD":
			seq++
			id := fmt.Sprintf("1700000000000-%d", seq)
			reply = fmt.Sprintf("$%d\r\n%s\r\n", len(id), id)
		default:
			reply = "+OK\r\n"
		}
		if errReply != "" {
			reply = "-" + errReply + "\r\n"
		}
		if _, err := io.WriteString(conn, reply); err != nil {
			return
		}
	}
}

// readCommand reads one RESP array of bulk strings.
func readCommand(r *bufio.Reader) ([]string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(line, "*") {
		return nil, fmt.Errorf("not an array: %q", line)
	}
	n, err := strconv.Atoi(strings.TrimSpace(line[1:]))
	if err != nil {
		return nil, err
	}
	out := make([]string, n)
	for i := range out {
		line, err := r.ReadString('\n')
		if err != nil {
			return nil, err
		}
		size, err := strconv.Atoi(strings.TrimSpace(line[1:]))
		if err != nil {
			return nil, err
		}
		buf := make([]byte, size+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		out[i] = string(buf[:size])
	}
	return out, nil
}

// fail makes every command name (XADD, INFO, …) from now on answer the
// error msg; "" makes it answer as usual again.
func (f *fakeRedis) fail(name, msg string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.errs == nil {
		f.errs = map[string]string{}
	}
	f.errs[strings.ToUpper(name)] = msg
}

func (f *fakeRedis) commands(name string) [][]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out [][]string
	for _, c := range f.cmds {
		if strings.EqualFold(c[0], name) {
			out = append(out, c)
		}
	}
	return out
}

// With a server that says it is 8.6, every XADD carries IDMP with the
// event id; with an older one, none does. The version is read once.
// (A fake server: the machine this was written on has no Redis 8.6.)
func TestPublishUsesIDMPFromRedis86(t *testing.T) {
	for version, want := range map[string]bool{"8.6.0": true, "8.4.2": false, "7.0.15": false} {
		t.Run(version, func(t *testing.T) {
			f := startFakeRedis(t, version)
			c := redis.NewClient(&redis.Options{Addr: f.ln.Addr().String(), Protocol: 2, DisableIdentity: true, MaxRetries: -1})
			defer c.Close()
			p := newPublisher(t, c, outboxredis.Config{Stream: "orders", ProducerID: "relay", MaxLen: 50})
			msgs := messages("evt", 4)
			var wg sync.WaitGroup
			for i := range 2 { // concurrent first publishes read the version once
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					replies, err := p.Publish(ctx, msgs[2*i:2*i+2])
					if err != nil {
						t.Error(err)
						return
					}
					for _, r := range replies {
						if !r.OK() {
							t.Errorf("reply %+v", r)
						}
					}
				})
			}
			wg.Wait()
			if n := len(f.commands("INFO")); n != 1 {
				t.Errorf("INFO sent %d times, want once", n)
			}
			xadds := f.commands("XADD")
			if len(xadds) != len(msgs) {
				t.Fatalf("%d XADDs, want %d", len(xadds), len(msgs))
			}
			for _, cmd := range xadds {
				eventID := ""
				for i := 0; i+1 < len(cmd); i++ {
					if cmd[i] == outboxredis.FieldEventID {
						eventID = cmd[i+1]
					}
				}
				head := strings.Join(cmd[:3], " ")
				if want {
					head = strings.Join(cmd[:9], " ")
					if wantHead := "xadd orders idmp relay " + eventID + " maxlen ~ 50 *"; head != wantHead {
						t.Errorf("XADD starts %q, want %q", head, wantHead)
					}
				} else if head != "xadd orders maxlen" {
					t.Errorf("XADD %v carries IDMP on Redis %s", cmd, version)
				}
			}
		})
	}
}

// outages are the replies with which a server refuses every write for
// now, as Redis words them.
var outages = []string{
	"OOM command not allowed when used memory > 'maxmemory'.",
	"MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk. Commands that may modify the data set are disabled, because this instance is configured to report errors during writes if RDB snapshotting fails (stop-writes-on-bgsave-error option). Please check the Redis logs for details about the RDB error.",
	"BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
	"LOADING Redis is loading the dataset in memory",
	"READONLY You can't write against a read only replica.",
	"MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
	"ERR max number of clients reached",
	"NOAUTH Authentication required.",
	"WRONGPASS invalid username-password pair or user is disabled.",
}

// A server that refuses every write for now (out of memory, a failed RDB
// save, a long script, loading, a read-only replica after a failover, too
// many clients, a lost password) fails the whole Publish: an outage the
// Relay waits out, never a NACK that counts towards parking events.
func TestPublishServerThatTakesNoWritesIsAnOutage(t *testing.T) {
	for _, msg := range outages {
		f := startFakeRedis(t, "7.0.15")
		f.fail("XADD", msg)
		c := redis.NewClient(&redis.Options{Addr: f.ln.Addr().String(), MaxRetries: -1})
		defer c.Close()
		p, err := outboxredis.NewPublisher(c, outboxredis.Config{Stream: "s", IDMP: outboxredis.IDMPOff})
		if err != nil {
			t.Fatal(err)
		}
		replies, err := p.Publish(context.Background(), messages("outage", 3))
		if err == nil || replies != nil || !strings.Contains(err.Error(), msg) {
			t.Fatalf("%s: Publish = %v, %v; want an error naming it and no replies", msg, replies, err)
		}
	}
}

// A command Redis refuses, an ACL's NOPERM included, is a NACK of the
// event: the Relay retries it and parks it after MaxAttempts.
func TestPublishRefusalsAreNacks(t *testing.T) {
	for _, msg := range []string{
		"NOPERM User relay has no permissions to run the 'xadd' command",
		"ERR syntax error",
		"BUSYKEY Target key name already exists.",
	} {
		f := startFakeRedis(t, "7.0.15")
		f.fail("XADD", msg)
		c := redis.NewClient(&redis.Options{Addr: f.ln.Addr().String(), MaxRetries: -1})
		defer c.Close()
		p := newPublisher(t, c, outboxredis.Config{Stream: "s", IDMP: outboxredis.IDMPOff})
		replies, err := p.Publish(context.Background(), messages("refused", 2))
		if err != nil || len(replies) != 2 {
			t.Fatalf("%s: Publish = %v, %v; want two NACKs", msg, replies, err)
		}
		for _, r := range replies {
			if r.OK() || !r.Retryable || !strings.Contains(r.Message, msg) {
				t.Fatalf("%s: reply %+v, want a retryable NACK naming it", msg, r)
			}
		}
	}
}

// An INFO that meets an outage fails the Publish, sends no XADD, and
// leaves the version to the next Publish, which uses IDMP on a Redis 8.6:
// only a server that refuses INFO itself gets plain XADDs for good.
func TestPublishReadsTheVersionAgainAfterAnOutage(t *testing.T) {
	for _, msg := range outages {
		f := startFakeRedis(t, "8.6.0")
		f.fail("INFO", msg)
		c := redis.NewClient(&redis.Options{Addr: f.ln.Addr().String(), MaxRetries: -1})
		defer c.Close()
		p := newPublisher(t, c, outboxredis.Config{Stream: "s"})
		replies, err := p.Publish(context.Background(), messages("during", 2))
		if err == nil || replies != nil || !strings.Contains(err.Error(), msg) {
			t.Fatalf("INFO answered %q: Publish = %v, %v; want an error naming it and no replies", msg, replies, err)
		}
		if n := len(f.commands("XADD")); n != 0 {
			t.Fatalf("INFO answered %q: %d XADDs sent", msg, n)
		}
		f.fail("INFO", "")
		publish(t, p, messages("after", 2))
		for _, cmd := range f.commands("XADD") {
			if cmd[2] != "idmp" {
				t.Fatalf("INFO answered %q, then 8.6.0: XADD %v without IDMP", msg, cmd[:3])
			}
		}
		if n := len(f.commands("INFO")); n != 2 {
			t.Fatalf("INFO answered %q: INFO sent %d times, want twice", msg, n)
		}
	}

	f := startFakeRedis(t, "8.6.0")
	f.fail("INFO", "ERR unknown command 'INFO', with args beginning with: 'server' ")
	c := redis.NewClient(&redis.Options{Addr: f.ln.Addr().String(), MaxRetries: -1})
	defer c.Close()
	p := newPublisher(t, c, outboxredis.Config{Stream: "s"})
	publish(t, p, messages("one", 2))
	publish(t, p, messages("two", 2))
	if n := len(f.commands("INFO")); n != 1 {
		t.Errorf("INFO refused: sent %d times, want once", n)
	}
	for _, cmd := range f.commands("XADD") {
		if cmd[2] == "idmp" {
			t.Fatalf("INFO refused: XADD %v carries IDMP", cmd[:3])
		}
	}
}

// A server that takes no writes for now is an outage for a Consumer too:
// Run keeps trying to create its group instead of returning, and returns
// nil when its context ends. A refusal (an ACL) ends Run with the error.
func TestConsumerWaitsOutAServerThatTakesNoWrites(t *testing.T) {
	handler := func(context.Context, outboxredis.Message) error { return nil }
	for _, msg := range outages {
		f := startFakeRedis(t, "7.0.15")
		f.fail("XGROUP", msg)
		c := redis.NewClient(&redis.Options{Addr: f.ln.Addr().String(), MaxRetries: -1})
		defer c.Close()
		con := newConsumer(t, c, outboxredis.ConsumerConfig{Stream: "s", Group: "g", Handler: handler})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- con.Run(ctx) }()
		deadline := time.Now().Add(10 * time.Second)
		for len(f.commands("XGROUP")) < 3 {
			select {
			case err := <-done:
				cancel()
				t.Fatalf("XGROUP answered %q: Run = %v after %d tries; want it to keep trying", msg, err, len(f.commands("XGROUP")))
			case <-time.After(5 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				t.Fatalf("XGROUP answered %q: %d tries in 10s", msg, len(f.commands("XGROUP")))
			}
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("XGROUP answered %q: Run = %v at the end of its context, want nil", msg, err)
		}
	}

	f := startFakeRedis(t, "7.0.15")
	f.fail("XGROUP", "NOPERM User consumer has no permissions to run the 'xgroup|create' command")
	c := redis.NewClient(&redis.Options{Addr: f.ln.Addr().String(), MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := newConsumer(t, c, outboxredis.ConsumerConfig{Stream: "s", Group: "g", Handler: handler}).Run(ctx); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("XGROUP refused by an ACL: Run = %v, want the NOPERM error", err)
	}
}
