package delivery

import "sync"

// testSignals are the channels delivery sends on when it finished a step,
// for tests to wait on instead of sleeping, as River's services' test
// signals (JobRescuerTestSignals). Outside tests they are nil
// (Config.testSignals), and each signal is one nil check. A signal no
// test reads is dropped once its buffer is full: a test drains the
// buffer, then causes the step and reads its signals.
type testSignals struct {
	// dispatched receives the end of each round of an inbox's dispatcher
	// that leased items (those of a probe another process holds are
	// handed back at once), paused (its endpoint's breaker or limits) or
	// found nothing due. A round that failed to read or lease is not
	// signalled.
	dispatched chan dispatchRound
	// stopping is closed once Run has stopped its loops and waits for the
	// attempts in flight.
	stopping     chan struct{}
	stoppingOnce sync.Once
}

// dispatchRound is one round of an inbox's dispatcher.
type dispatchRound struct {
	Inbox  string
	Leased int // items leased for the workers; 0 when paused or when none was due
}

func newTestSignals() *testSignals {
	return &testSignals{dispatched: make(chan dispatchRound, 64), stopping: make(chan struct{})}
}

// roundEnded signals a round of inbox's dispatcher that leased n items.
func (s *testSignals) roundEnded(inbox string, n int) {
	if s == nil {
		return
	}
	select {
	case s.dispatched <- dispatchRound{Inbox: inbox, Leased: n}:
	default:
	}
}

// stop signals that Run stopped its loops.
func (s *testSignals) stop() {
	if s == nil {
		return
	}
	s.stoppingOnce.Do(func() { close(s.stopping) })
}
