package outboxsqlite

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/retry"
)

// fill makes the database full for real: max_page_count at its current
// size (SQLite answers SQLITE_FULL to any write that needs another page),
// and a trigger that makes every delete of an outbox row write a 64 KiB
// row, as a delete on a full disk needs room in the log. room gives the
// space back.
func fill(t *testing.T, s *Store) (room func()) {
	t.Helper()
	for _, q := range []string{
		`CREATE TABLE filler (b BLOB)`,
		`CREATE TRIGGER needs_room BEFORE DELETE ON outbox BEGIN INSERT INTO filler VALUES (zeroblob(65536)); END`,
	} {
		if _, err := s.db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	var pages int
	if err := s.db.QueryRow(`PRAGMA page_count`).Scan(&pages); err != nil {
		t.Fatal(err)
	}
	// The pool's one connection is the store's: the limit applies to it.
	if _, err := s.db.Exec(fmt.Sprintf(`PRAGMA max_page_count = %d`, pages)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.db.Exec(`DELETE FROM outbox WHERE event_id = 'none'`); err != nil {
		t.Fatalf("a delete of nothing failed: %v", err)
	}
	if err := s.Settle(context.Background(), []outbox.Outcome{{EventID: "evt-0", Kind: outbox.Delivered}}); !noSpace(err) {
		t.Fatalf("settling a delivered row on the full database: %v, want SQLITE_FULL", err)
	}
	return func() {
		if _, err := s.db.Exec(`PRAGMA max_page_count = 1073741823`); err != nil {
			t.Fatal(err)
		}
	}
}

func walSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path + "-wal")
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// failCounter counts the Settle calls the store refused.
type failCounter struct {
	*Store
	failed atomic.Int64
}

func (f *failCounter) Settle(ctx context.Context, outcomes []outbox.Outcome) error {
	err := f.Store.Settle(ctx, outcomes)
	if err != nil {
		f.failed.Add(1)
	}
	return err
}

// TestFullDiskKeepsAckedRowsUntilTheDeleteSucceeds: on a full database the
// relay's deletes of ACKed rows fail. The relay keeps the ACKed ids in
// memory and records them again, without sending the rows again; the
// failed writes truncate the write-ahead log; when space returns the rows
// go, each sent once.
func TestFullDiskKeepsAckedRowsUntilTheDeleteSucceeds(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	s, _ := open(t, path, Config{})
	const n = 50
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("evt-%d", i)
	}
	insertOK(t, s, ids...)
	if walSize(t, path) == 0 {
		t.Fatal("the inserts left an empty write-ahead log; the test wants one to truncate")
	}
	room := fill(t, s)

	var mu sync.Mutex
	sends := map[string]int{}
	pub := publishFunc(func(ctx context.Context, msgs []outbox.Message) ([]postbox.Reply, error) {
		out := make([]postbox.Reply, len(msgs))
		mu.Lock()
		defer mu.Unlock()
		for i, m := range msgs {
			sends[m.EventID]++
			out[i] = postbox.Ack(m.EventID, time.Now(), false)
		}
		return out, nil
	})
	sent := func() (distinct, total int) {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range sends {
			total += c
		}
		return len(sends), total
	}
	fc := &failCounter{Store: s}
	relay, err := outbox.NewRelay(fc, pub, outbox.RelayConfig{
		PollInterval: 5 * time.Millisecond,
		Reconnect:    retry.Backoff{Base: time.Millisecond, Max: 5 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	defer func() { cancel(); <-done }()

	// Every row sent and ACKed, and the deletes refused over and over:
	// the relay has swept the outbox many times meanwhile.
	testenv.Eventually(t, 30*time.Second, "every row sent and 20 refused settles", func() bool {
		d, _ := sent()
		return d == n && fc.failed.Load() >= 20
	})
	if d, total := sent(); total != d {
		t.Fatalf("while the deletes failed, %d rows were sent %d times: ACKed rows were sent again", d, total)
	}
	wantCounts(t, s, n, 0)
	testenv.Eventually(t, 10*time.Second, "the write-ahead log truncated after the writes that failed for space", func() bool {
		return walSize(t, path) == 0
	})

	room()
	testenv.Eventually(t, 30*time.Second, "the ACKed rows deleted once space returned", func() bool {
		p, r, err := s.Counts(context.Background())
		return err == nil && p == 0 && r == 0
	})
	if d, total := sent(); d != n || total != n {
		t.Fatalf("%d rows sent %d times, want %d once each", d, total, n)
	}
}

// TestIdleWALIsTruncated: a store that wrote nothing for
// CheckpointInterval truncates its write-ahead log.
func TestIdleWALIsTruncated(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	s, _ := open(t, path, Config{CheckpointInterval: 20 * time.Millisecond})
	insertOK(t, s, "evt-1", "evt-2")
	if walSize(t, path) == 0 {
		t.Fatal("the inserts left an empty write-ahead log; the test wants one to truncate")
	}
	testenv.Eventually(t, 10*time.Second, "the idle store to truncate its write-ahead log", func() bool {
		return walSize(t, path) == 0
	})
	wantCounts(t, s, 2, 0)
}

type publishFunc func(ctx context.Context, msgs []outbox.Message) ([]postbox.Reply, error)

func (f publishFunc) Publish(ctx context.Context, msgs []outbox.Message) ([]postbox.Reply, error) {
	return f(ctx, msgs)
}
