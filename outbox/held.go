package outbox

import "time"

// heldOutcomes are answered outcomes (Delivered, Rejected) the store
// could not record (Stats.Unrecorded). Their rows stay in flight, never
// sent again, and the outcomes are recorded again every PollInterval, one
// retry at a time, until the store takes them.
type heldOutcomes struct {
	every    time.Duration // PollInterval
	outs     []Outcome
	retryAt  time.Time
	retrying bool // outcomes taken are being recorded again
}

// hold keeps outs, to be recorded again a poll interval from now, or with
// those already held, when their retry is due earlier or under way.
func (h *heldOutcomes) hold(now time.Time, outs []Outcome) {
	if len(outs) == 0 {
		return
	}
	if len(h.outs) == 0 && !h.retrying {
		h.retryAt = now.Add(h.every)
	}
	h.outs = append(h.outs, outs...)
}

// take returns the outcomes to record again at now: all of them once
// their retry is due, unless a retry is under way. The retry is under way
// until retried; what it could not record comes back through hold.
func (h *heldOutcomes) take(now time.Time) []Outcome {
	if len(h.outs) == 0 || h.retrying || now.Before(h.retryAt) {
		return nil
	}
	outs := h.outs
	h.outs, h.retrying = nil, true
	return outs
}

// retried ends the retry that take started.
func (h *heldOutcomes) retried() { h.retrying = false }

// wait shortens wait, the time until the relay's next turn, to the time
// until the next retry is due.
func (h *heldOutcomes) wait(now time.Time, wait time.Duration) time.Duration {
	if len(h.outs) == 0 || h.retrying {
		return wait
	}
	return max(0, min(wait, h.retryAt.Sub(now)))
}

// count returns the number of outcomes held and not being recorded.
func (h *heldOutcomes) count() int { return len(h.outs) }
