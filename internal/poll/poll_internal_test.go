package poll

import (
	"context"

	"github.com/postbox-events/postbox/stream"
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	b := newBackoff(100*time.Millisecond, time.Second)
	var last time.Duration
	for i := range 8 {
		cur := b.ceiling()
		d := b.next()
		if d < cur/2 || d > cur {
			t.Fatalf("failure %d: wait %v outside [%v, %v]", i, d, cur/2, cur)
		}
		last = d
	}
	if b.ceiling() != time.Second || last > time.Second {
		t.Errorf("after 8 failures: ceiling %v, last wait %v; want the bound 1s", b.ceiling(), last)
	}
	b.reset()
	if d := b.next(); d > 100*time.Millisecond {
		t.Errorf("after reset: wait %v, want at most 100ms", d)
	}
	// Jitter: the waits of one step are not all the same.
	seen := map[time.Duration]bool{}
	for range 50 {
		b.reset()
		seen[b.next()] = true
	}
	if len(seen) < 2 {
		t.Errorf("50 first waits were all %v: no jitter", seen)
	}
}

func TestHeaderEnv(t *testing.T) {
	s := Settings{Headers: map[string]string{"Authorization": "env:GH_TOKEN", "X-Api-Version": "2022-11-28"}}
	env := map[string]string{"GH_TOKEN": "Bearer s3cret"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	h, err := s.header(lookup)
	if err != nil {
		t.Fatal(err)
	}
	if h.Get("Authorization") != "Bearer s3cret" || h.Get("X-Api-Version") != "2022-11-28" {
		t.Errorf("headers %v", h)
	}
	env["GH_TOKEN"] = "Bearer rotated" // read at each poll
	if h, _ := s.header(lookup); h.Get("Authorization") != "Bearer rotated" {
		t.Errorf("after the variable changed: %v", h)
	}
	delete(env, "GH_TOKEN")
	if _, err := s.header(lookup); err == nil || err.Error() != "header Authorization: the environment variable GH_TOKEN is not set" {
		t.Errorf("variable not set: %v", err)
	}
	r := s.Redacted(func(string) string { return "fp" })
	if r.Headers["Authorization"] != "env:GH_TOKEN" || r.Headers["X-Api-Version"] != "fp" || s.Headers["X-Api-Version"] != "2022-11-28" {
		t.Errorf("redacted %v (of %v)", r.Headers, s.Headers)
	}
}

type nopSink struct{}

func (nopSink) Commit(context.Context, []stream.Event, Checkpoint) ([]stream.AppendResult, error) {
	return nil, nil
}
func (nopSink) Full(int) bool { return false }
