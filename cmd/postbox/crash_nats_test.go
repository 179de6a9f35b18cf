package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-events/postbox/internal/natstest"
	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/stream"
	"github.com/postbox-events/postbox/stream/streamnats"
)

// TestCrashServerJetStream kills postbox serve --streams nats://... with
// SIGKILL at random moments while agents stream events and restarts it;
// once in the run it restarts the NATS server under the running postbox
// instead (an in-process JetStream server, on the same store and port). At the end every event an agent
// accepted is in the JetStream stream exactly once, offsets dense, every
// outbox is drained, and a subscription created afterwards from the
// earliest event (with the CLI, which shows the JetStream streams,
// consumers and inbox as on SQLite) gets every event once.
func TestCrashServerJetStream(t *testing.T) {
	ns := natstest.StartServer(t, natstest.Options{})
	crashJetStream(t, ns.URL(), ns)
}

// TestCrashServerJetStreamServer is TestCrashServerJetStream against the
// NATS of POSTBOX_TEST_NATS, under a prefix of its own that it deletes
// afterwards; that NATS is not restarted.
func TestCrashServerJetStreamServer(t *testing.T) {
	crashJetStream(t, testenv.URL(t, testenv.NATS), nil)
}

// crashJetStream runs the crash test on the NATS at natsURL; with ns, the
// third crash restarts that NATS server instead of postbox.
func crashJetStream(t *testing.T, natsURL string, ns *natstest.Server) {
	if testing.Short() {
		t.Skip("crash test runs the real binary")
	}
	prefix := fmt.Sprintf("CRASH_%d_%d_", os.Getpid(), time.Now().UnixNano()%1e9)
	t.Cleanup(func() { deleteJetStreams(t, natsURL, prefix) })
	streams := natsURL + "?prefix=" + prefix
	crashes := 0
	crashRunOn(t, 3, []string{"--streams", streams}, nil,
		func(srv *proc, srvURL string, _ map[string]*proc) {
			crashes++
			if ns != nil && crashes == 3 {
				// NATS goes down under a running postbox and comes back
				// on the same store and port: postbox reconnects.
				ns.Restart()
				waitHTTP(t, srvURL+"/ready", srv)
				return
			}
			srv.kill()
			time.Sleep(time.Duration(rand.IntN(300)) * time.Millisecond) // down for a random while
			srv.restart()
			waitHTTP(t, srvURL+"/ready", srv)
		},
		auditFromEarliest(t, streamnats.BackendName),
		func(t *testing.T, dbPath string, producers []*producer) {
			checkAudited(t, dbPath, producers)
			checkJetStream(t, natsURL, prefix, dbPath)
		})
}

// auditFromEarliest returns a crash run's check: a subscription audit,
// created with the CLI after the crashes from the earliest event, catches
// up with the devices stream; the CLI shows the streams on backend, the
// consumer and the inbox.
func auditFromEarliest(t *testing.T, backend string) func(srvURL, dbPath string) {
	return func(srvURL, _ string) {
		// A subscription made now, from the earliest event, must get
		// every event the stream holds once. The CLI makes it and
		// shows the streams and consumers.
		cli := func(args ...string) string {
			t.Helper()
			out, code := run(t, append(args, "--server", srvURL)...)
			if code != 0 {
				t.Fatalf("postbox %s: exit %d: %s", strings.Join(args, " "), code, out)
			}
			return out
		}
		cli("subscriptions", "create", "audit", "--source", "devices", "--start", "earliest")
		deadline := time.Now().Add(60 * time.Second)
		for !caughtUp(srvURL) {
			if time.Now().After(deadline) {
				t.Fatal("subscription audit did not catch up with the stream")
			}
			time.Sleep(50 * time.Millisecond)
		}
		var streams []struct{ Stream, Backend string }
		if err := json.Unmarshal([]byte(cli("streams", "--json")), &streams); err != nil || len(streams) == 0 {
			t.Fatalf("postbox streams --json: %v %+v", err, streams)
		}
		for _, s := range streams {
			if s.Backend != backend {
				t.Errorf("postbox streams: stream %s on backend %q, want %q", s.Stream, s.Backend, backend)
			}
		}
		if out := cli("streams"); !regexp.MustCompile(`(?m)^devices +` + backend + ` `).MatchString(out) {
			t.Errorf("postbox streams shows no stream devices on %s:\n%s", backend, out)
		}
		if out := cli("consumers"); !strings.Contains(out, "audit") {
			t.Errorf("postbox consumers shows no consumer audit:\n%s", out)
		}
		if out := cli("inbox", "list", "audit", "--limit", "5"); strings.Count(out, "evt_pi-") != 5 {
			t.Errorf("postbox inbox list audit --limit 5 shows not 5 events:\n%s", out)
		}
	}
}

// checkAudited asserts that the inbox of subscription audit holds every
// accepted id exactly once, and no id twice.
func checkAudited(t *testing.T, dbPath string, producers []*producer) {
	t.Helper()
	db, err := sqlitedb.Open(dbPath, sqlitedb.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	items := map[string]int{}
	rows, err := db.Query(`SELECT source_native_id FROM inbox_items WHERE subscription_id = 'audit'`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		items[id]++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	total := 0
	for _, pr := range producers {
		total += len(pr.accepted)
		for _, id := range pr.accepted {
			if items[id] != 1 {
				t.Errorf("%s: accepted by the agent, %d items in inbox audit, want 1", id, items[id])
			}
		}
	}
	for id, n := range items {
		if n != 1 {
			t.Errorf("%s: %d items in inbox audit (stored %d times in the stream)", id, n, n)
		}
	}
	t.Logf("%d events accepted by agents, %d distinct events in inbox audit", total, len(items))
	if total == 0 {
		t.Fatal("no event was accepted: the test proved nothing")
	}
}

// checkJetStream asserts that the JetStream stream devices holds exactly
// the events inbox audit got, at the dense offsets 1..n.
func checkJetStream(t *testing.T, natsURL, prefix, dbPath string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := streamnats.ParseURL(natsURL + "?prefix=" + prefix)
	if err != nil {
		t.Fatal(err)
	}
	b, err := streamnats.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	checkStreamAudited(t, b, dbPath)
}

// checkStreamAudited asserts that the devices stream of b holds exactly
// the events inbox audit got, at the dense offsets 1..n.
func checkStreamAudited(t *testing.T, b stream.Backend, dbPath string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := b.Stats(ctx, "devices")
	if err != nil {
		t.Fatal(err)
	}
	db, err := sqlitedb.Open(dbPath, sqlitedb.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var items, distinct, lo, hi int64
	if err := db.QueryRow(`SELECT count(*), count(DISTINCT "offset"), coalesce(min("offset"), 0), coalesce(max("offset"), 0)
		FROM inbox_items WHERE subscription_id = 'audit'`).Scan(&items, &distinct, &lo, &hi); err != nil {
		t.Fatal(err)
	}
	if st.Events != items || distinct != items || st.FirstOffset != 1 || st.LastOffset != st.Events || lo != 1 || hi != st.Events {
		t.Fatalf("stream devices: %d events at offsets %d..%d; inbox audit: %d items at %d distinct offsets %d..%d; want the same events at offsets 1..n",
			st.Events, st.FirstOffset, st.LastOffset, items, distinct, lo, hi)
	}
	t.Logf("stream devices holds %d events at offsets 1..%d", st.Events, st.LastOffset)
}

// deleteJetStreams deletes every JetStream stream (consumer buckets
// included) whose name begins with prefix.
func deleteJetStreams(t *testing.T, natsURL, prefix string) {
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Logf("clean up %s: %v", prefix, err) // an in-process server may be down already
		return
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Errorf("clean up %s: %v", prefix, err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var doomed []string
	names := js.StreamNames(ctx)
	for n := range names.Name() {
		if strings.HasPrefix(n, prefix) || strings.HasPrefix(n, "KV_"+prefix) {
			doomed = append(doomed, n)
		}
	}
	for _, n := range doomed {
		if err := js.DeleteStream(ctx, n); err != nil {
			t.Errorf("clean up stream %s: %v", n, err)
		}
	}
}
