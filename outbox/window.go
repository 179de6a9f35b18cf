package outbox

// window is the Relay's adaptive window (RelayConfig.MaxInFlight): it
// bounds the messages published and not yet answered. It starts at
// MinInFlight and grows with what is answered, by one message per
// message answered (doubling each round trip while whole windows are
// answered) up to a threshold, and from the threshold on by about
// MinInFlight per round trip, in steps of BatchSize, up to MaxInFlight.
// After an outage it starts again from the number of messages answered
// since the previous outage, never below MinInFlight, and that is the new
// threshold: a connection that ends loses little more than the last one
// carried.
//
// It also counts the messages it bounds, and the answered ones whose
// outcome the store is recording: those leave the window, so that the
// next batches do not wait for the store, but at most another MaxInFlight
// of them may wait beyond it.
type window struct {
	floor, max, batch int // MinInFlight, MaxInFlight, BatchSize

	size      int // the window
	threshold int // below it the window grows by one per answer
	answered  int // messages answered since the last outage
	grown     int // slots the window has grown by beyond threshold, not yet added

	unanswered int // messages published and not yet answered: what size bounds
	settling   int // messages answered whose outcome is not yet recorded
}

// newWindow returns the window of cfg, which NewRelay has completed.
func newWindow(cfg RelayConfig) window {
	return window{
		floor: cfg.MinInFlight, max: cfg.MaxInFlight, batch: cfg.BatchSize,
		size: cfg.MinInFlight, threshold: cfg.MaxInFlight,
	}
}

// room returns how many messages may be published now. When the answered
// messages waiting for the store hold the room back, it is taken a whole
// batch at a time, or each settle's few freed slots would be sent as a
// small batch, and stay one.
func (w *window) room() int {
	room := w.size - w.unanswered
	if spare := 2*w.max - w.unanswered - w.settling; spare < room {
		room = spare
		if room < min(w.batch, w.size) {
			room = 0
		}
	}
	return room
}

// publish counts n messages published.
func (w *window) publish(n int) { w.unanswered += n }

// reply counts n published messages answered, or failed, whose outcome
// the store now records: out of the window, still in flight.
func (w *window) reply(n int) { w.unanswered, w.settling = w.unanswered-n, w.settling+n }

// release counts n messages whose outcome the store recorded, or that
// are due again.
func (w *window) release(n int) { w.settling -= n }

// answer grows the window by n messages answered (delivered, rejected or
// retried) by a publish without an outage.
func (w *window) answer(n int) {
	if n <= 0 {
		return
	}
	w.answered += n
	if w.size < w.threshold {
		w.size = min(w.size+n, w.threshold)
	} else {
		// About MinInFlight a round trip, in steps of a whole batch: the
		// room a step of a few slots makes is sent as a batch of its own,
		// and its answer frees only as much again, so every such step
		// would stay a small batch for as long as the window stays full.
		w.grown += max(1, n*w.floor/w.size)
		if w.grown >= min(w.batch, w.max-w.size) {
			w.size, w.grown = w.size+w.grown, 0
		}
	}
	w.size = min(w.size, w.max)
}

// outage starts the window again: the next connection is sent what this
// one managed.
func (w *window) outage() {
	w.size, w.answered, w.grown = min(max(w.answered, w.floor), w.max), 0, 0
	w.threshold = w.size
}
