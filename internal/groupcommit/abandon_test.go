package groupcommit_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/postbox-events/postbox/internal/groupcommit"
)

// TestEnqueueWhileDropsWhatNobodyWaitsFor: items queued with EnqueueWhile
// whose ctx ended before the writer took them are not written, and their
// caller is told so; a request the writer already started is written whole,
// and other callers' items are written as usual.
func TestEnqueueWhileDropsWhatNobodyWaitsFor(t *testing.T) {
	rec := newRecorder()
	rec.gate = make(chan struct{})
	rec.entered = make(chan struct{}, 8)
	w := groupcommit.New(rec.flush, groupcommit.Config{MaxBatch: 2})
	stop := run(w)
	defer stop()

	// The writer is busy with item 0 while the others queue up.
	busy := make(chan error, 1)
	if err := w.Enqueue(context.Background(), []int{0}, func(err error) { busy <- err }); err != nil {
		t.Fatal(err)
	}
	<-rec.entered

	gone, leave := context.WithCancel(context.Background())
	stays, keep := context.WithCancel(context.Background())
	defer keep()
	answers := map[string]chan error{"gone": make(chan error, 1), "kept": make(chan error, 1), "plain": make(chan error, 1)}

	if err := w.EnqueueWhile(gone, []int{1, 2, 3}, func(err error) { answers["gone"] <- err }); err != nil {
		t.Fatal(err)
	}
	if err := w.EnqueueWhile(stays, []int{4}, func(err error) { answers["kept"] <- err }); err != nil {
		t.Fatal(err)
	}
	if err := w.Enqueue(gone, []int{5}, func(err error) { answers["plain"] <- err }); err != nil {
		t.Fatal(err)
	}
	leave() // the caller of 1, 2, 3 went away; Enqueue's ctx only bounds its wait for room

	rec.gate <- struct{}{} // item 0 commits; then {1, 2} is all dropped, no flush
	<-rec.entered          // {3, 4}: 3 dropped, 4 written
	rec.gate <- struct{}{}
	<-rec.entered // {5}
	close(rec.gate)
	if err := <-busy; err != nil {
		t.Fatalf("item 0: %v", err)
	}
	if err := <-answers["gone"]; !errors.Is(err, context.Canceled) {
		t.Errorf("items whose caller went away: %v, want context.Canceled", err)
	}
	if err := <-answers["kept"]; err != nil {
		t.Errorf("item 4: %v", err)
	}
	if err := <-answers["plain"]; err != nil {
		t.Errorf("item 5 (Enqueue): %v", err)
	}
	if got := fmt.Sprint(rec.flushed()); got != "[[0] [4] [5]]" {
		t.Errorf("flushed %s, want [[0] [4] [5]]: items of a caller that went away are not written", got)
	}
}

// TestEnqueueWhileWritesAStartedRequestWhole: a request split over two
// batches is written whole even when its ctx ends between them, so its
// caller never hears "not written" about items that were.
func TestEnqueueWhileWritesAStartedRequestWhole(t *testing.T) {
	rec := newRecorder()
	rec.gate = make(chan struct{})
	rec.entered = make(chan struct{})
	w := groupcommit.New(rec.flush, groupcommit.Config{MaxBatch: 2})
	stop := run(w)
	defer stop()

	ctx, cancel := context.WithCancel(context.Background())
	answer := make(chan error, 1)
	if err := w.EnqueueWhile(ctx, []int{1, 2, 3}, func(err error) { answer <- err }); err != nil {
		t.Fatal(err)
	}
	<-rec.entered // the writer took 1 and 2
	cancel()
	rec.gate <- struct{}{}
	<-rec.entered // and then 3
	rec.gate <- struct{}{}
	if err := <-answer; err != nil {
		t.Fatalf("a request the writer started: %v, want it written", err)
	}
	if !rec.isCommitted([]int{1, 2, 3}) {
		t.Errorf("flushed %v, want 1, 2, 3", rec.flushed())
	}
}
