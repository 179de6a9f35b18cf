package logsample

import (
	"testing"
	"time"
)

// TestSampler: PerSecond lines of a message go out in a second, the rest
// are counted and reported with the next that goes out; each message has
// its own second.
func TestSampler(t *testing.T) {
	s := New(3)
	at := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)
	s.now = func() time.Time { return at }
	out := 0
	for range 10 {
		if ok, skipped := s.Allow("stored"); ok {
			out++
			if skipped != 0 {
				t.Fatalf("skipped %d before the second's first lines", skipped)
			}
		}
	}
	if out != 3 {
		t.Fatalf("%d of 10 lines out in one second, want 3", out)
	}
	if ok, _ := s.Allow("completed"); !ok {
		t.Fatal("another message shares the first's second")
	}
	at = at.Add(time.Second)
	ok, skipped := s.Allow("stored")
	if !ok || skipped != 7 {
		t.Fatalf("first line of the next second: out=%v skipped=%d, want out, 7 skipped", ok, skipped)
	}
	if ok, skipped := s.Allow("stored"); !ok || skipped != 0 {
		t.Fatalf("second line: out=%v skipped=%d, want out, none skipped since the last", ok, skipped)
	}
	var zero Sampler
	for i := range DefaultPerSecond + 1 {
		if ok, _ := zero.Allow("x"); ok != (i < DefaultPerSecond) {
			t.Fatalf("the zero Sampler's line %d: out=%v", i, ok)
		}
	}
	var none *Sampler
	if ok, _ := none.Allow("x"); !ok {
		t.Fatal("a nil Sampler held a line back")
	}
}
