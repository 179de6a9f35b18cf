package main_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-events/postbox/internal/natstest"
)

// TestBenchStreamsNATS runs bench small on an in-process JetStream server,
// through postbox and raw: every event acked and stored exactly once, and
// afterwards the server holds no stream or bucket of the runs.
func TestBenchStreamsNATS(t *testing.T) {
	url := natstest.Start(t)
	for _, mode := range []struct {
		args   []string
		server string
	}{{nil, "in-process"}, {[]string{"--raw"}, "raw-jetstream"}} {
		args := append([]string{"bench", "--streams", url, "--devices", "4", "--events", "600", "--json"}, mode.args...)
		out, err := exec.Command(binary, args...).Output()
		if err != nil {
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			t.Fatalf("postbox %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr)
		}
		var res struct {
			Events     int     `json:"events"`
			Acked      int64   `json:"acked"`
			Stored     int64   `json:"stored"`
			Duplicates int64   `json:"duplicates_stored"`
			EventsPerS float64 `json:"events_per_s"`
			Server     string  `json:"server"`
			Streams    string  `json:"streams"`
		}
		lastJSON(t, out, &res)
		if res.Events != 600 || res.Acked != 600 || res.Stored != 600 || res.Duplicates != 0 || res.EventsPerS <= 0 {
			t.Errorf("%v: want 600 events acked and stored once each, got %+v", mode.args, res)
		}
		if res.Server != mode.server || res.Streams != "nats" {
			t.Errorf("%v: want server %q on streams nats, got %q on %q", mode.args, mode.server, res.Server, res.Streams)
		}
	}

	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	names := js.StreamNames(ctx)
	var left []string
	for n := range names.Name() {
		left = append(left, n)
	}
	if err := names.Err(); err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Errorf("the bench runs left streams behind: %v", left)
	}
}

// TestBenchRawSQLite: --raw with the default streams inserts the events
// into a fresh SQLite database without a server (the ceiling), every one
// stored once; with --rate it is a usage error.
func TestBenchRawSQLite(t *testing.T) {
	out, err := exec.Command(binary, "bench", "--raw", "--devices", "4", "--events", "600", "--json").Output()
	if err != nil {
		t.Fatalf("bench --raw: %v\n%s", err, out)
	}
	var res struct {
		Acked       int64  `json:"acked"`
		Stored      int64  `json:"stored"`
		Duplicates  int64  `json:"duplicates_stored"`
		Server      string `json:"server"`
		Synchronous string `json:"synchronous"`
	}
	lastJSON(t, out, &res)
	if res.Server != "raw-sqlite" || res.Synchronous != "FULL" || res.Acked != 600 || res.Stored != 600 || res.Duplicates != 0 {
		t.Errorf("bench --raw: want raw-sqlite, FULL, 600 acked and stored once each, got %+v", res)
	}
	out, err = exec.Command(binary, "bench", "--raw", "--rate", "1000", "--events", "10").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--rate") {
		t.Errorf("bench --raw --rate: %v, want a usage error naming --rate, got:\n%s", err, out)
	}
}
