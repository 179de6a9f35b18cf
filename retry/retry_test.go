package retry_test

import (
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/postbox-events/postbox/retry"
)

func TestCeiling(t *testing.T) {
	b := retry.Backoff{Base: 100 * time.Millisecond, Max: 5 * time.Second}
	want := []time.Duration{100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000}
	for n, w := range want {
		if got := b.Ceiling(n); got != w*time.Millisecond {
			t.Errorf("Ceiling(%d) = %s, want %s", n, got, w*time.Millisecond)
		}
	}
	for _, n := range []int{62, 63, 64, 1000, 1 << 40} {
		if got := b.Ceiling(n); got != b.Max {
			t.Errorf("Ceiling(%d) = %s, want Max %s", n, got, b.Max)
		}
	}
	if got := b.Ceiling(-3); got != b.Base {
		t.Errorf("Ceiling(-3) = %s, want Base", got)
	}
	if got := (retry.Backoff{Base: time.Minute, Max: time.Second}).Ceiling(0); got != time.Second {
		t.Errorf("Ceiling(0) with Base over Max = %s, want Max", got)
	}
	if got := (retry.Backoff{}).Delay(3); got != 0 {
		t.Errorf("zero Backoff: Delay(3) = %s, want 0", got)
	}
}

func TestJitterModes(t *testing.T) {
	for _, tc := range []struct {
		jitter    retry.Jitter
		low, high func(c time.Duration) time.Duration // want d in [low, high), or d == low when equal
	}{
		{retry.FullJitter, func(time.Duration) time.Duration { return 0 }, func(c time.Duration) time.Duration { return c }},
		{retry.EqualJitter, func(c time.Duration) time.Duration { return c / 2 }, func(c time.Duration) time.Duration { return c }},
		{retry.NoJitter, func(c time.Duration) time.Duration { return c }, func(c time.Duration) time.Duration { return c }},
	} {
		t.Run(tc.jitter.String(), func(t *testing.T) {
			b := retry.Backoff{Base: 100 * time.Millisecond, Max: 5 * time.Second, Jitter: tc.jitter}
			for n := range 10 {
				c := b.Ceiling(n)
				lo, hi := tc.low(c), tc.high(c)
				seen := map[bool]bool{}
				for range 500 {
					d := b.Delay(n)
					if lo == hi {
						if d != lo {
							t.Fatalf("Delay(%d) = %s, want exactly %s", n, d, lo)
						}
						continue
					}
					if d < lo || d >= hi {
						t.Fatalf("Delay(%d) = %s, want in [%s, %s)", n, d, lo, hi)
					}
					seen[d >= lo+(hi-lo)/2] = true
				}
				if lo != hi && (!seen[false] || !seen[true]) {
					t.Errorf("Delay(%d): 500 samples did not spread over [%s, %s)", n, lo, hi)
				}
			}
		})
	}
	var zero retry.Backoff
	if zero.Jitter != retry.FullJitter {
		t.Errorf("the zero Jitter is %s, want full", zero.Jitter)
	}
}

func TestParseJitter(t *testing.T) {
	for _, j := range []retry.Jitter{retry.FullJitter, retry.EqualJitter, retry.NoJitter} {
		got, err := retry.ParseJitter(j.String())
		if err != nil || got != j {
			t.Errorf("ParseJitter(%q) = %v, %v", j.String(), got, err)
		}
	}
	if _, err := retry.ParseJitter("some"); err == nil {
		t.Error("ParseJitter(some) succeeded")
	}
}

func TestClassify(t *testing.T) {
	base := errors.New("boom")
	for _, tc := range []struct {
		name string
		err  error
		want retry.Outcome
	}{
		{"nil", nil, retry.Outcome{}},
		{"plain", base, retry.Outcome{}},
		{"permanent", retry.Permanent(base), retry.Outcome{Permanent: true}},
		{"wrapped permanent", fmt.Errorf("handle: %w", retry.Permanent(base)), retry.Outcome{Permanent: true}},
		{"transient", retry.Transient(base), retry.Outcome{Transient: true}},
		{"retry after", retry.RetryAfter(time.Minute, base), retry.Outcome{After: time.Minute}},
		{"retry after, transient", retry.RetryAfter(time.Minute, retry.Transient(base)), retry.Outcome{Transient: true, After: time.Minute}},
		{"permanent wins", retry.RetryAfter(time.Minute, retry.Permanent(retry.Transient(base))), retry.Outcome{Permanent: true}},
		{"retry after 0", retry.RetryAfter(0, base), retry.Outcome{}},
		{"joined", errors.Join(base, retry.Transient(io.EOF)), retry.Outcome{Transient: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := retry.Classify(tc.err); got != tc.want {
				t.Errorf("Classify = %+v, want %+v", got, tc.want)
			}
			if tc.err != nil && !errors.Is(tc.err, base) && tc.name != "joined" {
				t.Errorf("%v does not wrap its error", tc.err)
			}
			if tc.err != nil && tc.err.Error() != base.Error() && tc.name != "joined" && tc.name != "wrapped permanent" {
				t.Errorf("Error() = %q, want the wrapped %q", tc.err.Error(), base.Error())
			}
		})
	}
	for _, f := range []func(error) error{retry.Permanent, retry.Transient, func(err error) error { return retry.RetryAfter(time.Second, err) }} {
		if err := f(nil); err != nil {
			t.Errorf("a marker of nil = %v, want nil", err)
		}
	}
	var ra *retry.RetryAfterError
	if err := fmt.Errorf("x: %w", retry.RetryAfter(3*time.Second, base)); !errors.As(err, &ra) || ra.After != 3*time.Second {
		t.Errorf("errors.As RetryAfterError: %v", ra)
	}
}

func ExampleClassify() {
	handle := func() error {
		// The database the handler writes to is down: not the message's fault.
		return retry.Transient(errors.New("dial tcp 10.0.0.5:5432: connection refused"))
	}
	o := retry.Classify(fmt.Errorf("save order: %w", handle()))
	fmt.Printf("permanent=%v transient=%v after=%s\n", o.Permanent, o.Transient, o.After)
	// Output: permanent=false transient=true after=0s
}

func ExampleBackoff() {
	b := retry.Backoff{Base: time.Second, Max: 10 * time.Second, Jitter: retry.NoJitter}
	for n := range 5 {
		fmt.Print(b.Delay(n), " ")
	}
	fmt.Println()
	// Output: 1s 2s 4s 8s 10s
}
