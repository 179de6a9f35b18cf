package intake

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/internal/budget"
	"github.com/postbox-events/postbox/internal/feed"
	"github.com/postbox-events/postbox/internal/netpolicy"
	"github.com/postbox-events/postbox/internal/poll"
	"github.com/postbox-events/postbox/stream"
)

// The source runner: every source that reads upstream (kind poll: a REST
// poller; kind feed: a follower of another postbox's replay feed) has one
// goroutine running its adapter, started at start and when the source is
// created, stopped when it is deleted and at shutdown. On a shared store
// only the leader runs them (RunnerConfig.Leads), so each runs on one node; a
// new leader starts them from their checkpoints.

// DefaultRescanInterval is the default of RunnerConfig.RescanInterval.
const DefaultRescanInterval = time.Second

// DefaultBufferBytes is the default of RunnerConfig.BufferBytes: 64 MiB, so
// one poll answer or feed line is at most 32 MiB.
const DefaultBufferBytes = 64 << 20

// Writer is what the runner appends the events it reads through: the
// server's writer.
type Writer interface {
	// AppendAsync queues events and calls done after they are stored,
	// or with an error; it blocks while the queue is full.
	AppendAsync(ctx context.Context, streamID string, events []stream.Event, done func([]stream.AppendResult, error)) error
	// QueueLen and QueueCap are the events queued for the writer and how
	// many it queues at most: a page that would overflow the queue waits.
	QueueLen() int
	QueueCap() int
}

// AppendWither is a writer that runs a function in the transaction of the
// events it appends (streamsqlite.Backend): given when it commits to the
// Store's own database, so that a checkpoint commits with its events.
type AppendWither interface {
	AppendAsyncWith(ctx context.Context, streamID string, events []stream.Event, fn func(*sql.Tx) error,
		done func([]stream.AppendResult, error)) error
}

// RunnerConfig configures a Runner.
type RunnerConfig struct {
	// Store holds the sources and their checkpoints. Required.
	Store *Store
	// Writer appends the events the sources read. Required.
	Writer Writer
	// AppendWith, when set, appends events with their checkpoint in one
	// transaction; nil: the checkpoint is written once the events are
	// stored.
	AppendWith AppendWither
	// Leads reports whether this process runs the sources (the leader of
	// a shared store). Nil: it always does.
	Leads func() bool
	// Limits are those every intake path stores events under.
	Limits postbox.Limits
	// BufferBytes bounds the memory of poll answers and feed lines being
	// read and of their events waiting to be stored, over every source;
	// one answer or line is at most half of it. Defaults to
	// DefaultBufferBytes.
	BufferBytes int64
	// Policy is the address policy of the sources' connections.
	Policy netpolicy.Policy
	// Registerer takes the runner's metrics (the pollers', the
	// followers', postbox_source_buffered_bytes). Nil: none.
	Registerer prometheus.Registerer
	// RescanInterval is how often the runner reads the sources again:
	// sources created or deleted by another process of a shared store,
	// and leadership that moved, are acted on within it; Poke acts at
	// once. It is also how long a source's adapter that failed waits
	// before it starts again. Defaults to DefaultRescanInterval.
	RescanInterval time.Duration
	// Logger defaults to one that discards.
	Logger *slog.Logger
}

// Runner runs the adapters of the sources that read upstream.
type Runner struct {
	cfg    RunnerConfig
	log    *slog.Logger
	polls  *poll.Metrics
	feeds  *feed.Metrics
	budget *budget.Budget // RunnerConfig.BufferBytes, shared by them all
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

// NewRunner returns the runner of cfg's sources; Run runs it. Its
// metrics are registered with cfg.Registerer.
func NewRunner(cfg RunnerConfig) (*Runner, error) {
	if cfg.Store == nil || cfg.Writer == nil {
		return nil, errors.New("intake: RunnerConfig.Store and RunnerConfig.Writer are required")
	}
	if cfg.BufferBytes <= 0 {
		cfg.BufferBytes = DefaultBufferBytes
	}
	if cfg.RescanInterval <= 0 {
		cfg.RescanInterval = DefaultRescanInterval
	}
	if cfg.Leads == nil {
		cfg.Leads = func() bool { return true }
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	buffered := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "postbox_source_buffered_bytes",
		Help: "Memory held by poll answers and feed lines being read and by their events waiting to be stored, over every source (bounded by --source-buffer-bytes).",
	})
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(buffered)
	}
	size := cfg.BufferBytes
	return &Runner{cfg: cfg, log: cfg.Logger, polls: poll.NewMetrics(cfg.Registerer), feeds: feed.NewMetrics(cfg.Registerer), wake: make(chan struct{}, 1),
		budget: budget.New(size, size/2, func(d int64) { buffered.Add(float64(d)) }), active: map[string]*activeSource{}}, nil
}

// Poke makes the runner read the sources now: call it after creating or
// deleting one.
func (r *Runner) Poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Run keeps the adapters in line with the sources until ctx ends, then
// stops them all and returns nil once they returned.
func (r *Runner) Run(ctx context.Context) error {
	t := time.NewTicker(r.cfg.RescanInterval)
	defer t.Stop()
	failing := false
	for {
		err := r.reconcile(ctx)
		switch {
		case ctx.Err() != nil:
		case err != nil && !failing:
			r.log.Error("sources: reading the sources failed; the running ones go on", "err", err)
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
func (r *Runner) reconcile(ctx context.Context) error {
	want := map[string]Source{}
	if r.cfg.Leads() {
		srcs, err := r.cfg.Store.Sources(ctx)
		if err != nil {
			return err
		}
		for _, src := range srcs {
			if src.Kind == KindPoll || src.Kind == KindFeed {
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
func (r *Runner) stopAll(keep map[string]Source) {
	var stopped []*activeSource
	r.mu.Lock()
	for name, a := range r.active {
		if src, ok := keep[name]; ok && src.CreatedAt.Equal(a.created) {
			continue
		}
		delete(r.active, name)
		a.cancel()
		stopped = append(stopped, a)
		r.log.Info("sources: stopping a source's adapter", "source", name)
	}
	r.mu.Unlock()
	for _, a := range stopped {
		<-a.done
	}
}

// start runs the adapter of src in a goroutine of its own.
func (r *Runner) start(ctx context.Context, src Source) *activeSource {
	ctx, cancel := context.WithCancel(ctx)
	a := &activeSource{created: src.CreatedAt, cancel: cancel, done: make(chan struct{})}
	log := r.log.With("source", src.Name, "kind", src.Kind)
	go func() {
		defer close(a.done)
		run, err := r.adapter(src)
		if err == nil {
			if src.Checkpoint.Cursor == "" { // nothing read yet
				log.Info("sources: running the source's adapter")
			} else {
				log.Info("sources: running the source's adapter", "checkpoint", src.Checkpoint.Cursor)
			}
			err = run(ctx)
		}
		if err != nil && ctx.Err() == nil {
			log.Error("sources: the source's adapter stopped; starting it again", "err", err, "after", r.cfg.RescanInterval)
			cp := src.Checkpoint
			cp.LastError = err.Error()
			if err := r.cfg.Store.SaveCheckpoint(ctx, src.Name, src.CreatedAt, cp); err != nil && !errors.Is(err, ErrNotFound) {
				log.Warn("sources: recording the error in the checkpoint failed", "err", err)
			}
			select { // not at once: the error may be lasting
			case <-ctx.Done():
			case <-time.After(r.cfg.RescanInterval):
			}
		}
	}()
	return a
}

// adapter returns the Run of src's adapter.
func (r *Runner) adapter(src Source) (func(context.Context) error, error) {
	switch src.Kind {
	case KindPoll:
		settings, err := poll.DecodeSettings(src.Settings)
		if err != nil {
			return nil, err
		}
		c := src.Checkpoint
		p, err := poll.New(poll.Config{Name: src.Name, Settings: settings, Sink: r.sink(src),
			Start:  poll.Checkpoint{Cursor: c.Cursor, LastEventAt: c.LastEventAt, LastError: c.LastError, LastPollAt: c.LastPollAt},
			Limits: r.cfg.Limits, Budget: r.budget, Metrics: r.polls, Logger: r.log, Control: r.cfg.Policy.Control})
		if err != nil {
			return nil, err
		}
		return p.Run, nil
	case KindFeed:
		var settings feed.Settings
		if err := json.Unmarshal(src.Settings, &settings); err != nil {
			return nil, fmt.Errorf("settings: %w", err)
		}
		f, err := feed.New(feed.Config{URL: settings.URL, Token: settings.Token, Redirects: settings.Redirects, Stream: src.Stream, Name: src.Name,
			Writer: r.cfg.Writer, Checkpoints: feedCheckpoints{st: r.cfg.Store, created: src.CreatedAt},
			Limits: r.cfg.Limits, Budget: r.budget, Metrics: r.feeds, Logger: r.log, Control: r.cfg.Policy.Control})
		if err != nil {
			return nil, err
		}
		return f.Run, nil
	}
	return nil, fmt.Errorf("kind %q reads nothing upstream", src.Kind)
}

// sourceSink stores what a poller read through the writer.
type sourceSink struct {
	r       *Runner
	name    string
	stream  string
	created time.Time
}

func (r *Runner) sink(src Source) sourceSink {
	return sourceSink{r: r, name: src.Name, stream: src.Stream, created: src.CreatedAt}
}

// Commit implements poll.Sink. Where the writer commits to the store's
// own database (RunnerConfig.AppendWith, the SQLite default), the checkpoint is
// written in the transaction that writes the events. Elsewhere the
// events are appended first and the checkpoint written once they are
// stored: a crash between the two makes the poller ask for the page
// again, whose events the stream stores as duplicates.
func (k sourceSink) Commit(ctx context.Context, events []stream.Event, cp poll.Checkpoint) ([]stream.AppendResult, error) {
	st := k.r.cfg.Store
	write := st.CheckpointWriter(ctx, k.name, k.created,
		Checkpoint{Cursor: cp.Cursor, LastEventAt: cp.LastEventAt, LastError: cp.LastError, LastPollAt: cp.LastPollAt})
	type outcome struct {
		res []stream.AppendResult
		err error
	}
	done := make(chan outcome, 1)
	answer := func(res []stream.AppendResult, err error) { done <- outcome{res, err} }
	if len(events) == 0 {
		return nil, st.db.Update(ctx, write)
	}
	if w := k.r.cfg.AppendWith; w != nil {
		if err := w.AppendAsyncWith(ctx, k.stream, events, write, answer); err != nil {
			return nil, fmt.Errorf("append to %s: %w", k.stream, err)
		}
		o := <-done // the writer answers every request it took, even at shutdown
		return o.res, o.err
	}
	if err := k.r.cfg.Writer.AppendAsync(ctx, k.stream, events, answer); err != nil {
		return nil, fmt.Errorf("append to %s: %w", k.stream, err)
	}
	o := <-done
	if o.err != nil {
		return nil, fmt.Errorf("append to %s: %w", k.stream, o.err)
	}
	if err := st.db.Update(ctx, write); err != nil {
		return o.res, err
	}
	return o.res, nil
}

// Full implements poll.Sink: the writer's queue has no room for n
// events.
func (k sourceSink) Full(n int) bool {
	w := k.r.cfg.Writer
	return w.QueueLen() > 0 && w.QueueLen()+n > w.QueueCap()
}

// feedCheckpoints keeps a feed source's checkpoint, the last remote
// offset it stored, as the cursor of its source checkpoint.
type feedCheckpoints struct {
	st      *Store
	created time.Time
}

// Load implements feed.Checkpoints.
func (c feedCheckpoints) Load(ctx context.Context, name string) (int64, error) {
	src, err := c.st.Source(ctx, name)
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
	return c.st.SaveCheckpoint(ctx, name, c.created, Checkpoint{Cursor: strconv.FormatInt(offset, 10), LastPollAt: time.Now()})
}

// Failed implements feed.FailureRecorder.
func (c feedCheckpoints) Failed(ctx context.Context, name string, offset int64, err error) error {
	return c.st.SaveCheckpoint(ctx, name, c.created, Checkpoint{Cursor: strconv.FormatInt(offset, 10), LastError: err.Error(),
		LastPollAt: time.Now()})
}
