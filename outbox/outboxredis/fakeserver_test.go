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
// version: it answers INFO with version, XADD with a new entry ID (or
// with xaddErr when set), and records the commands it got.
type fakeRedis struct {
	version string
	ln      net.Listener

	mu      sync.Mutex
	cmds    [][]string
	xaddErr string
	wg      sync.WaitGroup
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
		xaddErr := f.xaddErr
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
			if xaddErr != "" {
				reply = "-" + xaddErr + "\r\n"
				break
			}
			seq++
			id := fmt.Sprintf("1700000000000-%d", seq)
			reply = fmt.Sprintf("$%d\r\n%s\r\n", len(id), id)
		default:
			reply = "+OK\r\n"
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

// failXAdd makes every XADD from now on answer the error msg.
func (f *fakeRedis) failXAdd(msg string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.xaddErr = msg
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
			p := newPublisher(t, c, outboxredis.PublisherConfig{Stream: "orders", ProducerID: "relay", MaxLen: 50})
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

// A server that refuses every write for now (out of memory, loading,
// a read-only replica after a failover) fails the whole Publish: an outage
// the Relay waits out, never a NACK that counts towards parking events.
func TestPublishServerThatTakesNoWritesIsAnOutage(t *testing.T) {
	for _, msg := range []string{
		"OOM command not allowed when used memory > 'maxmemory'.",
		"LOADING Redis is loading the dataset in memory",
		"READONLY You can't write against a read only replica.",
	} {
		f := startFakeRedis(t, "7.0.15")
		f.failXAdd(msg)
		c := redis.NewClient(&redis.Options{Addr: f.ln.Addr().String(), MaxRetries: -1})
		defer c.Close()
		p, err := outboxredis.NewPublisher(c, outboxredis.PublisherConfig{Stream: "s", IDMP: outboxredis.IDMPOff})
		if err != nil {
			t.Fatal(err)
		}
		replies, err := p.Publish(context.Background(), messages("outage", 3))
		if err == nil || replies != nil || !strings.Contains(err.Error(), strings.Fields(msg)[0]) {
			t.Fatalf("%s: Publish = %v, %v; want an error naming it and no replies", msg, replies, err)
		}
	}
}
