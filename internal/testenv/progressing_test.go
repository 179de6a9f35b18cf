package testenv_test

import (
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/testenv"
)

// fatalTB records the failure of a helper run on it and ends the helper's
// goroutine, as testing.T's Fatalf does.
type fatalTB struct {
	testing.TB
	failure string
}

func (f *fatalTB) Helper() {}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.failure = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// progressing runs testenv.Progressing on a fatalTB and returns its
// failure, "" if none.
func progressing(stall time.Duration, cond func() (bool, int64)) string {
	tb := &fatalTB{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		testenv.Progressing(tb, stall, "the work", cond)
	}()
	<-done
	return tb.failure
}

// TestProgressing: a wait for work that keeps moving outlasts its stall
// timeout many times over; one for work that stops fails, naming where it
// stopped.
func TestProgressing(t *testing.T) {
	const stall = 200 * time.Millisecond
	start := time.Now()
	if f := progressing(stall, func() (bool, int64) {
		n := int64(time.Since(start) / (stall / 4)) // a step every quarter of the stall
		return n >= 12, n
	}); f != "" {
		t.Fatalf("work that kept moving for 3 stall timeouts: %s", f)
	}
	var calls atomic.Int64
	f := progressing(stall, func() (bool, int64) {
		return false, min(calls.Add(1), 3)
	})
	if !strings.Contains(f, "no progress in the last 200ms (stuck at 3)") || !strings.Contains(f, "the work") {
		t.Fatalf("work that stopped: failure %q", f)
	}
}
