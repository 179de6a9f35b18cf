// Package logsample bounds how many lines a busy path logs: the lines of
// one message go out at most N a second, and the next line of it that goes
// out says how many were left out before it. postbox logs every event it
// stores and every delivery it starts and ends at INFO through a Sampler,
// so that a quiet server logs each and a busy one is not drowned.
package logsample

import (
	"cmp"
	"sync"
	"time"
)

// Sampler lets at most a number of lines of each message through in each
// second. The zero value lets DefaultPerSecond through; New sets another
// number.
type Sampler struct {
	per int
	now func() time.Time

	mu    sync.Mutex
	byMsg map[string]*window
}

// window is one message's second: since when, how many went out in it,
// and how many were left out since the last that went out.
type window struct {
	start   time.Time
	out     int
	skipped int
}

// DefaultPerSecond is the lines a second of one message New(0) lets
// through.
const DefaultPerSecond = 10

// New returns a Sampler that lets perSecond lines of each message through
// in each second (DefaultPerSecond when perSecond is 0 or less).
func New(perSecond int) *Sampler {
	if perSecond <= 0 {
		perSecond = DefaultPerSecond
	}
	return &Sampler{per: perSecond}
}

// Allow reports whether a line of msg goes out now, and how many lines of
// msg were left out since the last that went out (to be logged with it,
// as "skipped"). A nil Sampler allows every line.
func (s *Sampler) Allow(msg string) (ok bool, skipped int) {
	if s == nil {
		return true, 0
	}
	now := time.Now()
	if s.now != nil {
		now = s.now()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byMsg == nil {
		s.byMsg = map[string]*window{}
	}
	w := s.byMsg[msg]
	if w == nil {
		w = &window{start: now}
		s.byMsg[msg] = w
	}
	if now.Sub(w.start) >= time.Second {
		w.start, w.out = now, 0
	}
	if w.out >= cmp.Or(s.per, DefaultPerSecond) {
		w.skipped++
		return false, 0
	}
	w.out++
	skipped, w.skipped = w.skipped, 0
	return true, skipped
}
