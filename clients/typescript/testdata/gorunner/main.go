// Command gorunner runs the Go client's runner with a do-nothing handler
// over the inbox webhooks of a postbox serve until the server counts -n
// items completed, and prints the rate as JSON: the Go figure beside the
// TypeScript runner's in bench/bench.js (node bench/bench.js runner --go),
// against the same server binary.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/client"
)

func main() {
	server := flag.String("server", "", "the URL of postbox serve")
	n := flag.Int64("n", 20000, "items waiting in the inbox webhooks")
	conc := flag.Int("concurrency", 64, "the runner's concurrency")
	flag.Parse()
	if err := run(*server, *n, *conc); err != nil {
		fmt.Fprintln(os.Stderr, "gorunner:", err)
		os.Exit(1)
	}
}

func run(server string, n int64, conc int) error {
	c, err := client.NewAPI(server, client.APIOptions{})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		done <- c.Inbox("webhooks", client.RunnerConfig{Concurrency: conc, Wait: time.Second}).Run(ctx, func(context.Context, api.Item) error { return nil })
	}()
	for {
		in, err := c.Inboxes(ctx)
		if err != nil {
			return err
		}
		if completed(in) == n {
			break
		}
		time.Sleep(time.Millisecond)
	}
	secs := time.Since(start).Seconds()
	cancel()
	if err := <-done; err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]any{
		"bench": "go-runner", "concurrency": conc, "items": n, "seconds": secs, "items_per_s": int(float64(n) / secs),
	})
}

func completed(in []api.InboxCounts) int64 {
	for _, c := range in {
		if c.Inbox == "webhooks" {
			return c.Completed
		}
	}
	return 0
}
