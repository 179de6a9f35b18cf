package main_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/internal/relaymetrics"
	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/outbox/outboxsqlite"
)

// TestOutboxDrop: rows the receiver refused for good are dropped by id or
// all at once, and the rejected gauge of /metrics goes to 0; a pending row
// named stays and is said so; requeue says what it did with each id.
func TestOutboxDrop(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	store, err := outboxsqlite.Open(path, outboxsqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { store.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	var envs []postbox.Envelope
	for _, id := range []string{"evt_r1", "evt_r2", "evt_r3", "evt_p"} {
		envs = append(envs, postbox.Envelope{SchemaVersion: 1, EventID: id, Type: "t", TS: "2026-01-01T00:00:00Z",
			SessionID: "s", DeviceID: "pi-01", Payload: json.RawMessage(`{}`)})
	}
	if _, err := store.Insert(ctx, envs); err != nil {
		t.Fatal(err)
	}
	var refused []outbox.Outcome
	for _, id := range []string{"evt_r1", "evt_r2", "evt_r3"} {
		refused = append(refused, outbox.Outcome{EventID: id, Kind: outbox.Rejected, Error: "invalid_payload: no total"})
	}
	if err := store.Settle(ctx, refused); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	relaymetrics.Register(reg, store)
	rejected := func() float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "postbox_outbox_events" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "state" && l.GetValue() == "rejected" {
						return m.GetGauge().GetValue()
					}
				}
			}
		}
		t.Fatal("no postbox_outbox_events{state=\"rejected\"}")
		return 0
	}
	if n := rejected(); n != 3 {
		t.Fatalf("rejected gauge before the drop: %v, want 3", n)
	}

	for _, tc := range []struct {
		args []string
		code int
		want []string
	}{
		{[]string{"outbox", "drop"}, 2, []string{"name event ids or pass --all"}},
		{[]string{"outbox", "drop", "evt_r1", "--all"}, 2, []string{"not both"}},
		{[]string{"outbox", "drop", "evt_nope"}, 1, []string{"evt_nope: not in the outbox", "none of evt_nope is a rejected row"}},
		{[]string{"outbox", "drop", "evt_r1", "evt_p", "evt_nope"}, 0, []string{"evt_r1: dropped\n", "evt_p: pending, not rejected: nothing to drop", "evt_nope: not in the outbox", "1 rejected events dropped"}},
		{[]string{"outbox", "requeue", "evt_r2", "evt_r1", "evt_p"}, 0, []string{"evt_r2: requeued\n", "evt_r1: not in the outbox", "evt_p: pending, not rejected: nothing to requeue", "1 rejected events requeued", "2 of the 3 ids named are not rejected rows"}},
	} {
		out, code := run(t, append(tc.args, "--outbox", path)...)
		for _, w := range tc.want {
			if code != tc.code || !strings.Contains(out, w) {
				t.Errorf("postbox %s: exit %d (want %d), output %q, want it to contain %q", strings.Join(tc.args, " "), code, tc.code, out, w)
			}
		}
	}
	if n := rejected(); n != 1 {
		t.Fatalf("rejected gauge after one drop and one requeue: %v, want 1", n)
	}
	out, code := run(t, "outbox", "drop", "--all", "--json", "--outbox", path)
	var res struct{ Dropped []string }
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || len(res.Dropped) != 1 || res.Dropped[0] != "evt_r3" {
		t.Fatalf("outbox drop --all --json: exit %d, %s", code, out)
	}
	if n := rejected(); n != 0 {
		t.Fatalf("rejected gauge after outbox drop --all: %v, want 0", n)
	}
	if out, code := run(t, "outbox", "drop", "--all", "--outbox", path); code != 0 || !strings.Contains(out, "0 rejected events dropped") {
		t.Fatalf("outbox drop --all with nothing rejected: exit %d, %s", code, out)
	}
	if p, _, err := store.Counts(ctx); err != nil || p != 2 {
		t.Fatalf("pending after the drops: %d, %v; want 2 (evt_p and the requeued evt_r2)", p, err)
	}
}
