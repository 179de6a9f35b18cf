package outboxsqlite_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/outbox/outboxsqlite"
)

// oldEnvelopes are envelopes as an older postbox's agent queued them:
// given and filled-in fields, a seq, ts with an offset and a fraction,
// and payloads whose text JSON could lay out otherwise (escapes, numbers,
// a key given twice).
func oldEnvelopes() []postbox.Envelope {
	seven := int64(7)
	return []postbox.Envelope{
		{SchemaVersion: 1, EventID: "evt-old-1", Type: "sensor.reading", TS: "2026-03-04T05:06:07.123456789Z",
			SessionID: "sess_01J", DeviceID: "pi-01", Payload: json.RawMessage(`{"n":1}`)},
		{SchemaVersion: 1, EventID: "evt-old-2", Type: "door.opened", TS: "2026-03-04T07:06:07.5+02:00",
			SessionID: `sess "quoted" é`, DeviceID: "pi-01", Seq: &seven,
			Payload: json.RawMessage(`{"html":"<b>&</b>","esc":"\u00e9\ud83d\ude00\/\u2028","num":[1.50e+10,-0,123456789012345678901234567890,1E-7],"k":1,"k":2}`)},
		{SchemaVersion: 1, EventID: "evt-old-3", Type: "t", TS: "2026-03-04T05:06:07Z",
			SessionID: "s", DeviceID: "outbox", Payload: json.RawMessage(` { "spaced" : [ 1 , 2 ] } `)},
	}
}

// writeOldOutbox creates an outbox file at path with the first schema
// only, holding envs as that schema's code stored them (the envelope JSON
// as payload_json); the row of rejectedID is rejected. It returns each
// row's stored text by event id.
func writeOldOutbox(t *testing.T, path string, envs []postbox.Envelope, rejectedID string) map[string][]byte {
	t.Helper()
	db, err := sqlitedb.Open(path, sqlitedb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	first, err := os.ReadFile(filepath.Join("migrations", "0001_outbox.sql"))
	if err != nil {
		t.Fatal(err)
	}
	if err := sqlitedb.Migrate(context.Background(), db, "outbox", fstest.MapFS{"0001_outbox.sql": {Data: first}}); err != nil {
		t.Fatal(err)
	}
	stored := map[string][]byte{}
	queued := "2026-03-04T05:06:08.000000Z"
	for _, env := range envs {
		body, err := json.Marshal(env)
		if err != nil {
			t.Fatal(err)
		}
		stored[env.EventID] = body
		if _, err := db.Exec(`INSERT INTO outbox (event_id, event_type, payload_json, created_at, next_attempt_at) VALUES (?, ?, ?, ?, ?)`,
			env.EventID, env.Type, string(body), queued, queued); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Exec(`UPDATE outbox SET state = 'rejected', rejected_at = ?, last_error = 'conflict: payload', attempt_count = 3 WHERE event_id = ?`,
		queued, rejectedID); err != nil {
		t.Fatal(err)
	}
	return stored
}

// recorder is a Publisher that ACKs everything and keeps, per event, the
// message and the envelope client.Publisher would send for it.
type recorder struct {
	mu   sync.Mutex
	msgs map[string]outbox.Message
	sent map[string][]byte
}

func (r *recorder) Publish(ctx context.Context, msgs []outbox.Message) ([]postbox.Reply, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	replies := make([]postbox.Reply, len(msgs))
	for i, m := range msgs {
		b, err := json.Marshal(m.Envelope())
		if err != nil {
			return nil, err
		}
		r.msgs[m.EventID], r.sent[m.EventID] = m, b
		replies[i] = postbox.Ack(m.EventID, time.Now(), false)
	}
	return replies, nil
}

// An outbox file an older postbox filled with envelopes is converted when
// opened: its rows keep their state, hand out the payload byte for byte
// with the envelope's fields beside it, and relay as the very envelopes
// they held.
func TestMigrateEnvelopeRows(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	envs := oldEnvelopes()
	stored := writeOldOutbox(t, path, envs, "evt-old-3")

	s, err := outboxsqlite.Open(path, outboxsqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { s.Run(ctx) })
	defer func() { cancel(); wg.Wait(); s.Close() }()

	if p, r, err := s.Counts(ctx); err != nil || p != 2 || r != 1 {
		t.Fatalf("after the migration: %d pending, %d rejected, %v; want 2, 1", p, r, err)
	}
	rejected, err := s.List(ctx, outbox.StateRejected, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(rejected) != 1 || rejected[0].EventID != "evt-old-3" || rejected[0].Attempts != 3 || rejected[0].LastError != "conflict: payload" ||
		string(rejected[0].Payload) != `{"spaced":[1,2]}` || rejected[0].CorrelationID != "s" || rejected[0].TenantID != "outbox" {
		b, _ := json.Marshal(rejected)
		t.Fatalf("the rejected row after the migration: %s", b)
	}
	if n, err := s.Requeue(ctx, nil); err != nil || n != 1 {
		t.Fatalf("Requeue: %d, %v", n, err)
	}

	rec := &recorder{msgs: map[string]outbox.Message{}, sent: map[string][]byte{}}
	relay, err := outbox.NewRelay(s, rec, outbox.RelayConfig{PollInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() { relay.Run(ctx) })
	testenv.Eventually(t, 10*time.Second, "the old rows to be relayed", func() bool {
		p, r, err := s.Counts(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return p == 0 && r == 0
	})
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, env := range envs {
		m, ok := rec.msgs[env.EventID]
		if !ok {
			t.Fatalf("%s was not relayed", env.EventID)
		}
		old, err := postbox.ParseEnvelope(stored[env.EventID], postbox.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(m.Body, old.Payload) {
			t.Errorf("%s: Body %s, want the payload as stored %s", env.EventID, m.Body, old.Payload)
		}
		if m.Type != env.Type || m.CorrelationID != env.SessionID || m.TenantID != env.DeviceID ||
			!slices.Equal(ptr(m.SourceSeq), ptr(env.Seq)) || m.CreatedAt.Format(time.RFC3339Nano) != env.TS {
			t.Errorf("%s: message %+v; want the fields of %+v", env.EventID, m, env)
		}
		if !bytes.Equal(rec.sent[env.EventID], stored[env.EventID]) {
			t.Errorf("%s: relayed to a postbox server as\n%s\nwant the envelope it held\n%s", env.EventID, rec.sent[env.EventID], stored[env.EventID])
		}
	}

	// A migrated row is still known by its payload: the same event again
	// is a duplicate, another payload a conflict.
	again := envs[1]
	again.EventID = "evt-old-1"
	again.Payload = json.RawMessage(`{"n":2}`)
	res, err := s.Insert(ctx, []postbox.Envelope{envs[0]})
	if err != nil || res[0].Err != nil || res[0].Duplicate {
		t.Fatalf("insert after delivery: %+v %v; want queued (delivered rows are deleted)", res, err)
	}
	res, err = s.Insert(ctx, []postbox.Envelope{envs[0], again})
	if err != nil || !res[0].Duplicate || res[1].Err == nil {
		t.Fatalf("insert again: %+v %v; want a duplicate, then a conflict", res, err)
	}
}

// A file migrated already opens unchanged.
func TestMigrateTwice(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	writeOldOutbox(t, path, oldEnvelopes(), "")
	var lists [2][]outbox.Row
	for i := range lists {
		s, err := outboxsqlite.Open(path, outboxsqlite.Config{})
		if err != nil {
			t.Fatal(err)
		}
		lists[i], err = s.List(context.Background(), "", 10)
		s.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(lists[0]) != 3 || !slices.EqualFunc(lists[0], lists[1], func(a, b outbox.Row) bool {
		return a.EventID == b.EventID && bytes.Equal(a.Payload, b.Payload) && a.CorrelationID == b.CorrelationID && a.TenantID == b.TenantID
	}) {
		t.Fatalf("opened once:\n%+v\nand again:\n%+v", lists[0], lists[1])
	}
}

func ptr(p *int64) []int64 {
	if p == nil {
		return nil
	}
	return []int64{*p}
}

// What the agent queues relays to a postbox server as the envelope it
// received, byte for byte (its payload compacted, as before), but for a ts
// not in Go's RFC 3339 layout, which is sent as the same instant and
// offset in that layout.
func TestRelaysTheEnvelopeItQueued(t *testing.T) {
	s, err := outboxsqlite.Open(filepath.Join(t.TempDir(), "outbox.db"), outboxsqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { s.Run(ctx) })
	defer func() { cancel(); wg.Wait(); s.Close() }()

	envs := oldEnvelopes()
	other := envs[0]
	other.EventID, other.TS = "evt-ms", "2026-03-04T05:06:07.100+00:00"
	if _, err := s.Insert(ctx, append(envs, other)); err != nil {
		t.Fatal(err)
	}
	msgs, err := s.Due(ctx, time.Now(), 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != len(envs)+1 {
		t.Fatalf("Due: %d messages, want %d", len(msgs), len(envs)+1)
	}
	for i, env := range envs {
		want, _ := json.Marshal(env)
		got, err := json.Marshal(msgs[i].Envelope())
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: sent as\n%s (%v)\nwant\n%s", env.EventID, got, err, want)
		}
	}
	sent := msgs[len(envs)].Envelope()
	if !sent.Time().Equal(other.Time()) || sent.TS != "2026-03-04T05:06:07.1Z" && sent.TS != "2026-03-04T05:06:07.1+00:00" {
		t.Errorf("ts %q sent as %q, want the same instant", other.TS, sent.TS)
	}
}
