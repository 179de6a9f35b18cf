package groupcommit_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/groupcommit"
)

// gatedSync is a Config.Sync that waits for a receive on release before
// it returns, and counts its calls.
type gatedSync struct {
	release chan error
	mu      sync.Mutex
	calls   int
	covered []int // ObserveSync's flushes per call
}

func (g *gatedSync) sync() error {
	err := <-g.release
	g.mu.Lock()
	g.calls++
	g.mu.Unlock()
	return err
}

func (g *gatedSync) observe(flushes int, _ time.Duration, _ error) {
	g.mu.Lock()
	g.covered = append(g.covered, flushes)
	g.mu.Unlock()
}

// TestSyncAnswersAfterSync: a caller is answered only after a Sync that
// began after its flush; the writer commits the next batch while a Sync
// waits on the disk, but not a third before that Sync returns: the items
// queued meanwhile go in one batch.
func TestSyncAnswersAfterSync(t *testing.T) {
	rec := newRecorder()
	g := &gatedSync{release: make(chan error)}
	w := groupcommit.New(rec.flush, groupcommit.Config{MaxBatch: 1, Sync: g.sync, ObserveSync: g.observe})
	stop := run(w)
	defer stop()

	answered := make(chan int, 10)
	enqueue := func(i int) {
		if err := w.Enqueue(context.Background(), []int{i}, func(err error) {
			if err != nil {
				t.Errorf("item %d: %v", i, err)
			}
			answered <- i
		}); err != nil {
			t.Fatal(err)
		}
	}
	waitFlushed := func(n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for len(rec.flushed()) < n {
			if time.Now().After(deadline) {
				t.Fatalf("flushed %d batches, want %d", len(rec.flushed()), n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	enqueue(0)
	waitFlushed(1) // its Sync begins and is held
	for i := 1; i < 5; i++ {
		enqueue(i)
	}
	waitFlushed(2) // the writer goes on while the disk syncs
	time.Sleep(20 * time.Millisecond)
	if n := len(rec.flushed()); n != 2 {
		t.Fatalf("%d batches flushed while the first Sync was held, want 2", n)
	}
	select {
	case i := <-answered:
		t.Fatalf("item %d answered before any Sync returned", i)
	default:
	}
	got := map[int]bool{}
	for len(got) < 5 {
		select {
		case i := <-answered:
			got[i] = true
		case g.release <- nil:
		case <-time.After(10 * time.Second):
			t.Fatalf("answered %d of 5 after the syncs were released", len(got))
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	sum := 0
	for _, n := range g.covered {
		sum += n
	}
	if sum != 5 {
		t.Fatalf("syncs covered %v flushes, want 5 in all", g.covered)
	}
}

// TestSyncErrorAnswersCallers: a failed Sync is each covered caller's
// error; the next flush and Sync go on.
func TestSyncErrorAnswersCallers(t *testing.T) {
	rec := newRecorder()
	g := &gatedSync{release: make(chan error, 2)}
	w := groupcommit.New(rec.flush, groupcommit.Config{Sync: g.sync})
	stop := run(w)
	defer stop()

	disk := errors.New("disk on fire")
	g.release <- disk
	if err := w.Do(context.Background(), []int{1, 2}); !errors.Is(err, disk) {
		t.Fatalf("Do after a failed Sync = %v, want %v", err, disk)
	}
	g.release <- nil
	if err := w.Do(context.Background(), []int{3}); err != nil {
		t.Fatalf("Do after a good Sync = %v", err)
	}
}

// TestSyncFlushErrorNotSynced: a failed flush is answered at once with its
// error, without waiting for a Sync.
func TestSyncFlushErrorNotSynced(t *testing.T) {
	rec := newRecorder()
	bad := errors.New("constraint")
	rec.fail = func([]int) error { return bad }
	g := &gatedSync{release: make(chan error)} // never released
	w := groupcommit.New(rec.flush, groupcommit.Config{Sync: g.sync})
	stop := run(w)
	defer stop()
	if err := w.Do(context.Background(), []int{1}); !errors.Is(err, bad) {
		t.Fatalf("Do = %v, want %v", err, bad)
	}
}

// TestSyncOnShutdown: what the last flushes committed is synced and
// answered before Run returns.
func TestSyncOnShutdown(t *testing.T) {
	rec := newRecorder()
	g := &gatedSync{release: make(chan error, 100)}
	for range 100 {
		g.release <- nil
	}
	w := groupcommit.New(rec.flush, groupcommit.Config{MaxBatch: 2, Sync: g.sync})
	var mu sync.Mutex
	answered := 0
	for i := range 10 {
		if err := w.Enqueue(context.Background(), []int{i}, func(err error) {
			if err != nil {
				t.Errorf("item %d: %v", i, err)
			}
			mu.Lock()
			answered++
			mu.Unlock()
		}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // Run writes what is queued, then returns
	if err := w.Run(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if answered != 10 {
		t.Fatalf("%d of 10 answered when Run returned", answered)
	}
	if g.calls == 0 {
		t.Fatal("no Sync before Run returned")
	}
}
