package groupcommit_test

import (
	"context"
	"testing"

	"github.com/postbox-events/postbox/internal/groupcommit"
)

// TestEnqueueWhole: a request queued with EnqueueWhole is flushed in one
// batch even where MaxBatch would split it; the same request queued with
// Enqueue is split.
func TestEnqueueWhole(t *testing.T) {
	for _, whole := range []bool{false, true} {
		rec := newRecorder()
		w := groupcommit.New(rec.flush, groupcommit.Config{MaxBatch: 4, QueueSize: 100})
		ctx := context.Background()
		// Queued before Run: three items ahead, then a request of five.
		if err := w.Enqueue(ctx, []int{1, 2, 3}, nil); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		enqueue := w.Enqueue
		if whole {
			enqueue = w.EnqueueWhole
		}
		if err := enqueue(ctx, []int{10, 11, 12, 13, 14}, func(err error) { done <- err }); err != nil {
			t.Fatal(err)
		}
		runCtx, stop := context.WithCancel(ctx)
		ran := make(chan error, 1)
		go func() { ran <- w.Run(runCtx) }()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		stop()
		<-ran
		var split bool
		for _, b := range rec.flushed() {
			has := map[int]bool{}
			for _, it := range b {
				has[it] = true
			}
			if has[10] != has[14] {
				split = true
			}
		}
		if split == whole {
			t.Errorf("whole=%v: batches %v", whole, rec.flushed())
		}
	}
}
