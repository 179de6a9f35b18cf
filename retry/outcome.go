package retry

import (
	"errors"
	"time"
)

// PermanentError is an error Permanent marked: retrying cannot help.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// TransientError is an error Transient marked: not the message's fault.
type TransientError struct{ Err error }

func (e *TransientError) Error() string { return e.Err.Error() }
func (e *TransientError) Unwrap() error { return e.Err }

// RetryAfterError is an error RetryAfter marked: the next attempt waits
// at least After.
type RetryAfterError struct {
	After time.Duration
	Err   error
}

func (e *RetryAfterError) Error() string { return e.Err.Error() }
func (e *RetryAfterError) Unwrap() error { return e.Err }

// Permanent marks err as final: the message is a dead letter at once,
// without further attempts. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// Transient marks err as not the message's fault (a dependency of the
// handler is down, a timeout): the message is retried, and the attempt
// does not count towards the maximum. Transient(nil) is nil.
func Transient(err error) error {
	if err == nil {
		return nil
	}
	return &TransientError{Err: err}
}

// RetryAfter makes the next attempt wait at least d; the caller bounds d
// by its longest wait, so that no error parks a message for a year.
// A d <= 0 asks for nothing more than the backoff. RetryAfter(d, nil)
// is nil.
func RetryAfter(d time.Duration, err error) error {
	if err == nil {
		return nil
	}
	return &RetryAfterError{After: d, Err: err}
}

// Outcome is what an attempt's error asks of the next attempt.
type Outcome struct {
	// Permanent: no further attempt (Permanent). It overrides the rest.
	Permanent bool
	// Transient: the attempt does not count towards the maximum
	// (Transient).
	Transient bool
	// After is the least wait before the next attempt (RetryAfter), 0 for
	// the backoff alone. With several in the chain, the outermost counts.
	After time.Duration
}

// Classify returns the Outcome of a handler's error: the markers found in
// its chain (errors.As). A nil or plain error is the zero Outcome: retried
// after the backoff, and counted.
func Classify(err error) Outcome {
	var o Outcome
	if err == nil {
		return o
	}
	var p *PermanentError
	if errors.As(err, &p) {
		return Outcome{Permanent: true}
	}
	var t *TransientError
	o.Transient = errors.As(err, &t)
	var r *RetryAfterError
	if errors.As(err, &r) && r.After > 0 {
		o.After = r.After
	}
	return o
}
