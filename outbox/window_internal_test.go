package outbox

import (
	"fmt"
	"testing"
)

// TestWindow follows the window (RelayConfig.MaxInFlight) through
// publishes, answers, settles and outages: after each step, its size and
// the room it gives the next publish.
func TestWindow(t *testing.T) {
	type step struct {
		op         string // publish, reply, release, answer, outage
		n          int
		size, room int // after the step
	}
	// answers answers n messages k times, the window then of size.
	answers := func(k, n, size int) []step {
		var s []step
		for range k {
			s = append(s, step{"answer", n, size, size})
		}
		return s
	}
	for _, tc := range []struct {
		name              string
		floor, max, batch int
		steps             []step
	}{
		{name: "starts at MinInFlight and doubles each round trip up to MaxInFlight", floor: 32, max: 4096, batch: 256, steps: []step{
			{"answer", 0, 32, 32},
			{"answer", 32, 64, 64}, {"answer", 64, 128, 128}, {"answer", 128, 256, 256},
			{"answer", 1000, 1256, 1256}, {"answer", 3000, 4096, 4096}, {"answer", 4096, 4096, 4096},
		}},
		{name: "an outage starts again from what was answered since the previous one", floor: 32, max: 4096, batch: 256, steps: []step{
			{"answer", 32, 64, 64}, {"answer", 64, 128, 128},
			{"outage", 0, 96, 96},
			// from the new threshold on by about MinInFlight a round
			// trip, added a batch at a time
			{"answer", 10, 96, 96},
			{"outage", 0, 32, 32}, // 10 answered: never below MinInFlight
			{"outage", 0, 32, 32},
		}},
		{name: "an outage after a long good connection keeps MaxInFlight", floor: 100, max: 1000, batch: 50, steps: []step{
			{"answer", 900, 1000, 1000}, {"answer", 2100, 1000, 1000},
			{"outage", 0, 1000, 1000},
			{"answer", 10, 1000, 1000},
			{"outage", 0, 100, 100},
		}},
		{name: "beyond the threshold it grows by MinInFlight a round trip, in steps of BatchSize", floor: 32, max: 4096, batch: 256, steps: append(append(append([]step{
			{"answer", 100, 132, 132},
			{"outage", 0, 100, 100}},
			answers(7, 100, 100)...), // 7 × 32 slots grown, not yet a batch
			step{"answer", 100, 356, 356}), // the 8th makes 256: added at once
			step{"answer", 1, 356, 356}, // at least one slot per answer
		)},
		{name: "the last step fills the window up to MaxInFlight", floor: 32, max: 300, batch: 256, steps: append(append([]step{
			{"answer", 100, 132, 132},
			{"outage", 0, 100, 100}},
			answers(6, 100, 100)...), // 192 slots grown: less than the 200 left
			step{"answer", 100, 300, 300},
		)},
		{name: "at least one slot per answer", floor: 32, max: 101, batch: 256, steps: []step{
			{"answer", 100, 101, 101},
			{"outage", 0, 100, 100},
			{"answer", 1, 101, 101}, // 1 × 32 / 100 rounds to 0
		}},
		{name: "answered messages leave the window, up to another MaxInFlight of them", floor: 100, max: 100, batch: 50, steps: []step{
			{"publish", 100, 100, 0},
			{"reply", 100, 100, 100}, // the store records them: out of the window
			{"publish", 100, 100, 0},
			{"reply", 100, 100, 0},  // 200 waiting for the store: no room
			{"release", 30, 100, 0}, // 30 free: less than a batch
			{"release", 20, 100, 50},
			{"publish", 50, 100, 0},
			{"release", 150, 100, 50},
			{"reply", 50, 100, 100},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWindow(RelayConfig{MinInFlight: tc.floor, MaxInFlight: tc.max, BatchSize: tc.batch})
			if w.size != tc.floor || w.room() != tc.floor {
				t.Fatalf("new window %d with room %d, want %d", w.size, w.room(), tc.floor)
			}
			for i, s := range tc.steps {
				switch s.op {
				case "publish":
					w.publish(s.n)
				case "reply":
					w.reply(s.n)
				case "release":
					w.release(s.n)
				case "answer":
					w.answer(s.n)
				case "outage":
					w.outage()
				default:
					panic(s.op)
				}
				what := fmt.Sprintf("step %d (%s %d)", i, s.op, s.n)
				if w.size != s.size {
					t.Fatalf("%s: window %d, want %d", what, w.size, s.size)
				}
				if r := w.room(); r != s.room {
					t.Fatalf("%s: room %d, want %d", what, r, s.room)
				}
			}
		})
	}
}
