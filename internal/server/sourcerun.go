package server

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/budget"
	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/feed"
	"github.com/postbox-events/postbox/internal/poll"
	"github.com/postbox-events/postbox/stream"
)

// The source runner: every source that reads upstream (kind poll: a REST
// poller; kind feed: a follower of another postbox's replay feed) has one
// goroutine running its adapter, started at start and when the source is
// created, stopped when it is deleted and at shutdown. On a shared store
// only the leader runs them (delivery's leader lease), so each runs on one
// node; a new leader starts them from their checkpoints.

// SourceRescanInterval is how often the runner reads the sources again:
// sources created or deleted by another process of a shared store, and
// leadership that moved, are acted on within it. Sources created or
// deleted through this process's API are acted on at once.
const SourceRescanInterval = time.Second

// DefaultSourceBufferBytes is the default of Config.SourceBufferBytes:
// 64 MiB, so one poll answer or feed line is at most 32 MiB.
const DefaultSourceBufferBytes = 64 << 20

// sourceRunner runs the adapters of the sources that read upstream.
type sourceRunner struct {
	s      *Server
	polls  *poll.Metrics
	feeds  *feed.Metrics
	budget *budget.Budget // Config.SourceBufferBytes, shared by them all
	wake   chan struct{}
	mu     sync.Mutex
	active map[string]*activeSource // by source name
}

// activeSource is one running adapter.
type activeSource struct {
	created time.Time // identifies the source: one deleted and created again is another
	cancel  context.CancelFunc
	done    chan struct{}
}

func newSourceRunner(s *Server, reg prometheus.Registerer) *sourceRunner {
	size := s.cfg.SourceBufferBytes
	if size <= 0 {
		size = DefaultSourceBufferBytes
	}
	buffered := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "postbox_source_buffered_bytes",
		Help: "Memory held by poll answers and feed lines being read and by their events waiting to be stored, over every source (bounded by --source-buffer-bytes).",
	})
	if reg != nil {
		reg.MustRegister(buffered)
	}
	return &sourceRunner{s: s, polls: poll.NewMetrics(reg), feeds: feed.NewMetrics(reg), wake: make(chan struct{}, 1),
		budget: budget.New(size, size/2, func(d int64) { buffered.Add(float64(d)) }), active: map[string]*activeSource{}}
}

// poke makes the runner read the sources now.
func (r *sourceRunner) poke() {
	if r == nil {
		return
	}
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// run keeps the adapters in line with the sources until ctx ends, then
// stops them all and returns once they returned.
func (r *sourceRunner) run(ctx context.Context) error {
	t := time.NewTicker(SourceRescanInterval)
	defer t.Stop()
	failing := false
	for {
		err := r.reconcile(ctx)
		switch {
		case ctx.Err() != nil:
		case err != nil && !failing:
			r.s.log.Error("sources: reading the sources failed; the running ones go on", "err", err)
			failing = true
		case err == nil:
			failing = false
		}
		select {
		case <-ctx.Done():
			r.stopAll(nil)
			return nil
		case <-t.C:
		case <-r.wake:
		}
	}
}

// reconcile starts the adapter of each source that reads upstream and
// has none, and stops those of sources that are gone (or, on a shared
// store, all of them when this process does not lead).
func (r *sourceRunner) reconcile(ctx context.Context) error {
	want := map[string]delivery.Source{}
	if r.s.delivery.Leads() {
		srcs, err := r.s.delivery.Sources(ctx)
		if err != nil {
			return err
		}
		for _, src := range srcs {
			if src.Kind == delivery.KindPoll || src.Kind == delivery.KindFeed {
				want[src.Name] = src
			}
		}
	}
	r.stopAll(want)
	r.mu.Lock()
	defer r.mu.Unlock()
	for name, src := range want {
		if a := r.active[name]; a != nil {
			select {
			case <-a.done: // it ended on its own: start it again
			default:
				continue
			}
		}
		r.active[name] = r.start(ctx, src)
	}
	return nil
}

// stopAll stops the adapters of sources not in keep (or not created
// when keep's are), and waits for them.
func (r *sourceRunner) stopAll(keep map[string]delivery.Source) {
	var stopped []*activeSource
	r.mu.Lock()
	for name, a := range r.active {
		if src, ok := keep[name]; ok && src.CreatedAt.Equal(a.created) {
			continue
		}
		delete(r.active, name)
		a.cancel()
		stopped = append(stopped, a)
		r.s.log.Info("sources: stopping a source's adapter", "source", name)
	}
	r.mu.Unlock()
	for _, a := range stopped {
		<-a.done
	}
}

// start runs the adapter of src in a goroutine of its own.
func (r *sourceRunner) start(ctx context.Context, src delivery.Source) *activeSource {
	ctx, cancel := context.WithCancel(ctx)
	a := &activeSource{created: src.CreatedAt, cancel: cancel, done: make(chan struct{})}
	log := r.s.log.With("source", src.Name, "kind", src.Kind)
	go func() {
		defer close(a.done)
		run, err := r.adapter(ctx, src)
		if err == nil {
			if src.Checkpoint.Cursor == "" { // nothing read yet
				log.Info("sources: running the source's adapter")
			} else {
				log.Info("sources: running the source's adapter", "checkpoint", src.Checkpoint.Cursor)
			}
			err = run(ctx)
		}
		if err != nil && ctx.Err() == nil {
			log.Error("sources: the source's adapter stopped; starting it again", "err", err, "after", SourceRescanInterval)
			cp := src.Checkpoint
			cp.LastError = err.Error()
			if err := r.s.delivery.SaveCheckpoint(ctx, src.Name, src.CreatedAt, cp); err != nil && !errors.Is(err, delivery.ErrNotFound) {
				log.Warn("sources: recording the error in the checkpoint failed", "err", err)
			}
			select { // not at once: the error may be lasting
			case <-ctx.Done():
			case <-time.After(SourceRescanInterval):
			}
		}
	}()
	return a
}

// adapter returns the Run of src's adapter.
func (r *sourceRunner) adapter(ctx context.Context, src delivery.Source) (func(context.Context) error, error) {
	switch src.Kind {
	case delivery.KindPoll:
		settings, err := poll.DecodeSettings(src.Settings)
		if err != nil {
			return nil, err
		}
		c := src.Checkpoint
		p, err := poll.New(poll.Config{Name: src.Name, Settings: settings, Sink: r.sink(src),
			Start:  poll.Checkpoint{Cursor: c.Cursor, LastEventAt: c.LastEventAt, LastError: c.LastError, LastPollAt: c.LastPollAt},
			Limits: r.s.cfg.Limits, Budget: r.budget, Metrics: r.polls, Logger: r.s.log, Control: r.s.policy().Control})
		if err != nil {
			return nil, err
		}
		return p.Run, nil
	case delivery.KindFeed:
		var settings feed.Settings
		if err := json.Unmarshal(src.Settings, &settings); err != nil {
			return nil, fmt.Errorf("settings: %w", err)
		}
		f, err := feed.New(feed.Config{URL: settings.URL, Token: settings.Token, Redirects: settings.Redirects, Stream: src.Stream, Name: src.Name,
			Writer: r.s.writer, Checkpoints: feedCheckpoints{d: r.s.delivery, created: src.CreatedAt},
			Limits: r.s.cfg.Limits, Budget: r.budget, Metrics: r.feeds, Logger: r.s.log, Control: r.s.policy().Control})
		if err != nil {
			return nil, err
		}
		return f.Run, nil
	}
	return nil, fmt.Errorf("kind %q reads nothing upstream", src.Kind)
}

// sourceSink stores what a poller read through the server's writer.
type sourceSink struct {
	s       *Server
	name    string
	stream  string
	created time.Time
}

func (r *sourceRunner) sink(src delivery.Source) sourceSink {
	return sourceSink{s: r.s, name: src.Name, stream: src.Stream, created: src.CreatedAt}
}

// appendWither is a writer that runs a function in the transaction of the
// events it appends (streamsqlite.Backend).
type appendWither interface {
	AppendAsyncWith(ctx context.Context, streamID string, events []stream.Event, fn func(*sql.Tx) error,
		done func([]stream.AppendResult, error)) error
}

// Commit implements poll.Sink. Where the store is the stream backend
// (the SQLite default), the checkpoint is written in the transaction
// that writes the events. Elsewhere the events are appended first and
// the checkpoint written once they are stored: a crash between the two
// makes the poller ask for the page again, whose events the stream
// stores as duplicates.
func (k sourceSink) Commit(ctx context.Context, events []stream.Event, cp poll.Checkpoint) ([]stream.AppendResult, error) {
	write := k.s.delivery.CheckpointWriter(ctx, k.name, k.created,
		delivery.Checkpoint{Cursor: cp.Cursor, LastEventAt: cp.LastEventAt, LastError: cp.LastError, LastPollAt: cp.LastPollAt})
	type outcome struct {
		res []stream.AppendResult
		err error
	}
	done := make(chan outcome, 1)
	answer := func(res []stream.AppendResult, err error) { done <- outcome{res, err} }
	if len(events) == 0 {
		return nil, k.s.store.Update(ctx, write)
	}
	if w, ok := k.s.streams.(appendWither); ok && k.s.sameStore() {
		if err := w.AppendAsyncWith(ctx, k.stream, events, write, answer); err != nil {
			return nil, fmt.Errorf("append to %s: %w", k.stream, err)
		}
		o := <-done // the writer answers every request it took, even at shutdown
		return o.res, o.err
	}
	if err := k.s.writer.AppendAsync(ctx, k.stream, events, answer); err != nil {
		return nil, fmt.Errorf("append to %s: %w", k.stream, err)
	}
	o := <-done
	if o.err != nil {
		return nil, fmt.Errorf("append to %s: %w", k.stream, o.err)
	}
	if err := k.s.store.Update(ctx, write); err != nil {
		return o.res, err
	}
	return o.res, nil
}

// Full implements poll.Sink: the writer's queue has no room for n
// events.
func (k sourceSink) Full(n int) bool {
	w := k.s.writer
	return w.QueueLen() > 0 && w.QueueLen()+n > w.QueueCap()
}

// feedCheckpoints keeps a feed source's checkpoint, the last remote
// offset it stored, as the cursor of its source checkpoint.
type feedCheckpoints struct {
	d       *delivery.Delivery
	created time.Time
}

// Load implements feed.Checkpoints.
func (c feedCheckpoints) Load(ctx context.Context, name string) (int64, error) {
	src, err := c.d.Source(ctx, name)
	if err != nil {
		return 0, err
	}
	if src.Checkpoint.Cursor == "" {
		return 0, nil
	}
	off, err := strconv.ParseInt(src.Checkpoint.Cursor, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("checkpoint of %s: cursor %q is not an offset", name, src.Checkpoint.Cursor)
	}
	return off, nil
}

// Save implements feed.Checkpoints.
func (c feedCheckpoints) Save(ctx context.Context, name string, offset int64) error {
	return c.d.SaveCheckpoint(ctx, name, c.created, delivery.Checkpoint{Cursor: strconv.FormatInt(offset, 10), LastPollAt: time.Now()})
}

// Failed implements feed.FailureRecorder.
func (c feedCheckpoints) Failed(ctx context.Context, name string, offset int64, err error) error {
	return c.d.SaveCheckpoint(ctx, name, c.created, delivery.Checkpoint{Cursor: strconv.FormatInt(offset, 10), LastError: err.Error(),
		LastPollAt: time.Now()})
}

// upstreamSettings checks the settings a request gives a source of kind
// poll or feed, with checkURL the URL it reads, and returns them as
// stored, or an error naming the field.
func upstreamSettings(kind string, raw json.RawMessage, checkURL func(field, url string) error) (json.RawMessage, error) {
	if len(raw) == 0 {
		return nil, &codedError{api.CodeMissingField, "settings: required: the upstream to read (for poll: url, items, id, type; for feed: url)"}
	}
	var s interface{ Validate() error }
	var url *string // the settings' url, which checkURL checks
	switch kind {
	case delivery.KindPoll:
		p := &poll.Settings{}
		s, url = p, &p.URL
	case delivery.KindFeed:
		f := &feed.Settings{}
		s, url = f, &f.URL
	default:
		return nil, fmt.Errorf("kind %q reads nothing upstream", kind)
	}
	if err := decodeSettings(raw, s); err != nil {
		return nil, err
	}
	if err := s.Validate(); errors.Is(err, poll.ErrRequired) || errors.Is(err, feed.ErrRequired) {
		return nil, &codedError{api.CodeMissingField, err.Error()}
	} else if err != nil {
		return nil, err
	}
	if f, ok := s.(*feed.Settings); ok && !delivery.ValidName(f.StreamName()) {
		return nil, fmt.Errorf("settings.url %.200q: the stream's name: %s", f.URL, delivery.NameRule)
	}
	if err := checkURL("settings.url", *url); err != nil {
		return nil, err
	}
	return json.Marshal(s)
}

// upstreamSettingsJSON returns a poll or feed source's settings as the
// API shows them: header values and a token that are not env:NAME as
// fingerprints.
func upstreamSettingsJSON(src delivery.Source, fingerprint func(string) string) json.RawMessage {
	switch src.Kind {
	case delivery.KindPoll:
		var s poll.Settings
		if json.Unmarshal(src.Settings, &s) == nil {
			b, _ := json.Marshal(s.Redacted(fingerprint))
			return b
		}
	case delivery.KindFeed:
		var s feed.Settings
		if json.Unmarshal(src.Settings, &s) == nil {
			if s.Token != "" && !bytes.HasPrefix([]byte(s.Token), []byte("env:")) {
				s.Token = fingerprint(s.Token)
			}
			b, _ := json.Marshal(s)
			return b
		}
	}
	return json.RawMessage(`{}`)
}
