package outbox

import (
	"fmt"
	"reflect"
	"testing"
	"time"
)

// TestHeldOutcomes follows answered outcomes the store could not record:
// when they are recorded again, one retry at a time, and how long the
// relay may wait before its next turn.
func TestHeldOutcomes(t *testing.T) {
	const every = time.Second
	type step struct {
		at  time.Duration // since the start
		op  string        // hold, take, retried, wait
		ids []string      // hold: held; take: taken
		// wait: the wait asked for and the one returned
		wait, want time.Duration
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{name: "recorded again a poll interval later", steps: []step{
			{at: 0, op: "wait", wait: 5 * time.Second, want: 5 * time.Second}, // nothing held
			{at: 0, op: "hold", ids: []string{"a"}},
			{at: 0, op: "take"},
			{at: 0, op: "wait", wait: 5 * time.Second, want: every},
			{at: 300 * time.Millisecond, op: "wait", wait: 5 * time.Second, want: 700 * time.Millisecond},
			{at: 300 * time.Millisecond, op: "wait", wait: 100 * time.Millisecond, want: 100 * time.Millisecond},
			{at: 999 * time.Millisecond, op: "take"},
			{at: every, op: "take", ids: []string{"a"}},
			{at: every, op: "take"},
		}},
		{name: "an overdue retry waits for nothing", steps: []step{
			{at: 0, op: "hold", ids: []string{"a"}},
			{at: 3 * time.Second, op: "wait", wait: 5 * time.Second, want: 0},
			{at: 3 * time.Second, op: "take", ids: []string{"a"}},
		}},
		{name: "later outcomes join the held ones, at their time", steps: []step{
			{at: 0, op: "hold", ids: []string{"a"}},
			{at: 500 * time.Millisecond, op: "hold", ids: []string{"b", "c"}},
			{at: every, op: "take", ids: []string{"a", "b", "c"}},
		}},
		{name: "a failed retry is retried a poll interval after it failed", steps: []step{
			{at: 0, op: "hold", ids: []string{"a"}},
			{at: every, op: "take", ids: []string{"a"}},
			{at: 1500 * time.Millisecond, op: "retried"},
			{at: 1500 * time.Millisecond, op: "hold", ids: []string{"a"}},
			{at: 2 * time.Second, op: "take"},
			{at: 2500 * time.Millisecond, op: "take", ids: []string{"a"}},
		}},
		{name: "one retry at a time; outcomes held meanwhile go with its leftovers", steps: []step{
			{at: 0, op: "hold", ids: []string{"a"}},
			{at: every, op: "take", ids: []string{"a"}},
			{at: every, op: "hold", ids: []string{"b"}}, // another publish's outcomes, while a's retry runs
			{at: 1100 * time.Millisecond, op: "take"},
			{at: 1100 * time.Millisecond, op: "wait", wait: 5 * time.Second, want: 5 * time.Second},
			{at: 1200 * time.Millisecond, op: "retried"}, // a's retry failed
			{at: 1200 * time.Millisecond, op: "hold", ids: []string{"a"}},
			{at: 1200 * time.Millisecond, op: "wait", wait: 5 * time.Second, want: 0},
			{at: 1200 * time.Millisecond, op: "take", ids: []string{"b", "a"}},
		}},
		{name: "holding nothing holds nothing", steps: []step{
			{at: 0, op: "hold"},
			{at: 0, op: "wait", wait: 5 * time.Second, want: 5 * time.Second},
			{at: every, op: "take"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
			h := heldOutcomes{every: every}
			for i, s := range tc.steps {
				now := start.Add(s.at)
				what := fmt.Sprintf("step %d (%s at %v)", i, s.op, s.at)
				switch s.op {
				case "hold":
					var outs []Outcome
					for _, id := range s.ids {
						outs = append(outs, Outcome{EventID: id, Kind: Delivered})
					}
					h.hold(now, outs)
				case "take":
					var got []string
					for _, o := range h.take(now) {
						got = append(got, o.EventID)
					}
					if !reflect.DeepEqual(got, s.ids) {
						t.Fatalf("%s: took %q, want %q", what, got, s.ids)
					}
				case "retried":
					h.retried()
				case "wait":
					if got := h.wait(now, s.wait); got != s.want {
						t.Fatalf("%s: wait %v for %v, want %v", what, got, s.wait, s.want)
					}
				default:
					panic(s.op)
				}
			}
		})
	}
}
