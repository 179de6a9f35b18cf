// Command inbox-runner is a runtime that pulls the items of an inbox from
// postbox serve and handles them with the Go client's runner
// (client.API.Inbox(...).Run): it leases batches, runs the handler on up
// to -concurrency items at once, extends the lease of a job that runs
// long, acks what the handler completes and nacks what fails, to be
// tried again later or, for retry.Permanent errors, dead-lettered at once.
//
// Against a running server, until Ctrl-C:
//
//	postbox serve &
//	go run ./examples/inbox-runner -server http://127.0.0.1:8000 -inbox webhooks
//	curl -X POST localhost:8000/webhooks -H 'Content-Type: application/json' -H 'Idempotency-Key: order-1' -d '{"order": 1}'
//
// Alone, it starts a server of its own in the process (a SQLite file in a
// temporary directory), sends it -n webhooks, handles them and exits:
//
//	go run ./examples/inbox-runner -n 100
//
// The handler reads each webhook's JSON body: {"order": N} is an order
// to ship (it takes -work, a stand-in for real work), {"order": N,
// "slow": true} a job that runs past the visibility timeout (its lease is
// extended meanwhile), and a body that is not an order is refused for good.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/client"
	"github.com/postbox-events/postbox/retry"
	"github.com/postbox-events/postbox/server"
)

// config is what the example runs with.
type config struct {
	Server      string // "": a server of its own
	Token       string
	Inbox       string
	N           int // webhooks sent to a server of its own
	Concurrency int
	Work        time.Duration // how long an order takes
	Visibility  time.Duration
	Out         io.Writer
	Log         *slog.Logger
}

// summary is what a run did.
type summary struct {
	Shipped, Refused, Slow int64
}

func main() {
	cfg := config{Out: os.Stdout, Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	flag.StringVar(&cfg.Server, "server", "", "the `URL` of postbox serve; empty: start one in this process and send it -n webhooks")
	flag.StringVar(&cfg.Token, "token", os.Getenv("POSTBOX_API_TOKEN"), "the server's API `token`, if it has one [POSTBOX_API_TOKEN]")
	flag.StringVar(&cfg.Inbox, "inbox", "webhooks", "the `inbox` to handle")
	flag.IntVar(&cfg.N, "n", 100, "without -server: how many webhooks to send and handle")
	flag.IntVar(&cfg.Concurrency, "concurrency", 10, "handlers running at once")
	flag.DurationVar(&cfg.Work, "work", 10*time.Millisecond, "how long shipping an order takes")
	flag.DurationVar(&cfg.Visibility, "visibility", 2*time.Second, "the visibility timeout of a lease (a slow job takes twice as long)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	sum, err := run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "inbox-runner:", err)
		os.Exit(1)
	}
	fmt.Fprintf(cfg.Out, "shipped %d orders (%d slow), refused %d webhooks\n", sum.Shipped, sum.Slow, sum.Refused)
}

// run handles the inbox until ctx ends or, with a server of its own,
// until the N webhooks it sent are handled.
func run(ctx context.Context, cfg config) (summary, error) {
	var sum summary
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	base := cfg.Server
	if base == "" {
		srvBase, stopServer, err := startServer(ctx)
		if err != nil {
			return sum, err
		}
		defer stopServer()
		base = srvBase
		go func() {
			if err := sendWebhooks(ctx, base, cfg.N); err != nil && ctx.Err() == nil {
				cfg.Log.Error("sending webhooks failed", "err", err)
				cancel()
			}
		}()
	}
	c, err := client.NewAPI(base, client.APIOptions{Token: cfg.Token})
	if err != nil {
		return sum, err
	}
	out := &lockedWriter{w: cfg.Out} // handlers run concurrently
	var handled atomic.Int64
	handle := func(ctx context.Context, it api.Item) error {
		defer func() {
			if n := handled.Add(1); cfg.Server == "" && n == int64(cfg.N) {
				cancel() // every webhook sent was handled: stop
			}
		}()
		var order struct {
			Order *int `json:"order"`
			Slow  bool `json:"slow"`
		}
		if err := json.Unmarshal(it.Payload, &order); err != nil || order.Order == nil {
			atomic.AddInt64(&sum.Refused, 1)
			return retry.Permanent(fmt.Errorf("webhook %s is not an order: %.80s", it.EventID, it.Payload))
		}
		work := cfg.Work
		if order.Slow {
			work = 2 * cfg.Visibility // past the visibility timeout: the runner extends the lease
			atomic.AddInt64(&sum.Slow, 1)
		}
		select {
		case <-time.After(work):
		case <-ctx.Done():
			return context.Cause(ctx) // the runner is stopping, or the lease was lost
		}
		atomic.AddInt64(&sum.Shipped, 1)
		fmt.Fprintf(out, "shipped order %d (item %d, attempt %d)\n", *order.Order, it.ID, it.Attempts)
		return nil
	}
	r := c.Inbox(cfg.Inbox, client.RunnerConfig{Concurrency: cfg.Concurrency, VisibilityTimeout: cfg.Visibility, Logger: cfg.Log})
	if err := r.Run(ctx, handle); err != nil {
		return sum, err
	}
	return sum, nil
}

// lockedWriter is a writer for concurrent handlers.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// startServer runs a postbox server in the process on a loopback port,
// its SQLite file in a temporary directory, and returns its URL and a
// function that stops it.
func startServer(ctx context.Context) (string, func(), error) {
	dir, err := os.MkdirTemp("", "inbox-runner-")
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})) // the server's errors only
	srv, err := server.New(server.Config{Listener: ln, DBPath: filepath.Join(dir, "postbox.db"), Logger: quiet})
	if err != nil {
		ln.Close()
		os.RemoveAll(dir)
		return "", nil, err
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	base := "http://" + ln.Addr().String()
	stop := func() {
		cancel()
		<-done
		os.RemoveAll(dir)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		resp, err := http.Get(base + "/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return base, stop, nil
			}
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, errors.New("the server in the process was not ready within 30s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// sendWebhooks posts n webhooks to base: orders, every 25th a slow one,
// and every 50th something that is not an order.
func sendWebhooks(ctx context.Context, base string, n int) error {
	for i := range n {
		body := fmt.Sprintf(`{"order": %d}`, i)
		switch {
		case i%50 == 49:
			body = `{"greeting": "not an order"}`
		case i%25 == 24:
			body = fmt.Sprintf(`{"order": %d, "slow": true}`, i)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/webhooks", strings.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", fmt.Sprint("order-", i))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			return fmt.Errorf("webhook %d: %s", i, resp.Status)
		}
	}
	return nil
}
