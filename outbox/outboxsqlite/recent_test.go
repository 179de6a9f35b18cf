package outboxsqlite

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/outbox"
)

// TestDueFromMemoryIsDueFromTheFile: whatever happens to the outbox —
// inserts with duplicates and conflicts, every kind of outcome, requeues,
// rows another connection inserts — Due (which takes the rows this store
// inserted from memory) returns what reading the file returns.
func TestDueFromMemoryIsDueFromTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	c := newClock()
	s, _ := open(t, path, Config{Now: c.Now})
	other, err := sqlitedb.Open(path, sqlitedb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	next := 0
	var known []string
	fromMemory := 0
	for step := range 200 {
		switch op := rng.IntN(10); {
		case op < 4: // inserts, some of them again
			var envs []postbox.Envelope
			for range 1 + rng.IntN(9) {
				id := fmt.Sprintf("evt-%d", next)
				payload := `{"n":1}`
				if len(known) > 0 && rng.IntN(5) == 0 {
					id = known[rng.IntN(len(known))]
					if rng.IntN(2) == 0 {
						payload = `{"n":2}` // a conflict
					}
				} else {
					next++
					known = append(known, id)
				}
				e := env(id, payload)
				if rng.IntN(3) == 0 {
					seq := int64(rng.IntN(100))
					e.Seq, e.TS = &seq, "not a time"
				}
				envs = append(envs, e)
			}
			if _, err := s.Insert(ctx, envs); err != nil {
				t.Fatal(err)
			}
		case op < 7: // outcomes of rows due now
			msgs, err := s.Due(ctx, c.Now(), 0, 1+rng.IntN(20))
			if err != nil {
				t.Fatal(err)
			}
			var outs []outbox.Outcome
			for _, m := range msgs {
				o := outbox.Outcome{EventID: m.EventID, Seq: m.Seq, Kind: outbox.Delivered}
				if rng.IntN(20) == 0 {
					o.Seq = 0 // not from a Message: found by id
				}
				switch rng.IntN(12) {
				case 0:
					o.Kind, o.Error = outbox.Rejected, "refused"
				case 1:
					o.Kind, o.Error, o.RetryAt = outbox.Retry, "busy", c.Now().Add(time.Duration(rng.IntN(3))*time.Second)
				case 2:
					o.Kind, o.Error = outbox.Unanswered, "reset"
				}
				outs = append(outs, o)
			}
			if err := s.Settle(ctx, outs); err != nil {
				t.Fatal(err)
			}
		case op < 8:
			if _, err := s.Requeue(ctx, nil); err != nil {
				t.Fatal(err)
			}
		case op < 9: // another connection inserts
			tx, err := other.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			id := fmt.Sprintf("other-%d", step)
			if err := Insert(ctx, tx, outbox.Event{ID: id, Type: "t", Payload: json.RawMessage(`{}`), TenantID: "dev-1"}); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
		default:
			c.Add(time.Second)
		}
		// Every cursor a relay may pass, every limit.
		file, err := s.dueFile(ctx, c.Now(), 0, 10_000, nil)
		if err != nil {
			t.Fatal(err)
		}
		afters := []int64{0}
		for i, m := range file {
			if i%max(1, len(file)/15) == 0 || i == len(file)-1 {
				afters = append(afters, m.Seq) // a sample of the cursors a relay may pass
			}
		}
		for _, after := range afters {
			for _, limit := range []int{1, 3, 10_000} {
				want, err := s.dueFile(ctx, c.Now(), after, limit, nil)
				if err != nil {
					t.Fatal(err)
				}
				if _, _, ok := s.recent.due(c.Now(), after, limit); ok {
					fromMemory++
				}
				got, err := s.Due(ctx, c.Now(), after, limit)
				if err != nil {
					t.Fatal(err)
				}
				if len(got) == 0 && len(want) == 0 {
					continue
				}
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("step %d, after %d, limit %d:\nDue      %+v\nthe file %+v", step, after, limit, got, want)
				}
			}
		}
	}
	if fromMemory == 0 {
		t.Fatal("Due never took rows from memory; the test compared the file with itself")
	}
	t.Logf("%d of the Due calls served from memory", fromMemory)
}
