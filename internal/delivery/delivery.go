// Package delivery turns stream events into inbox items: subscriptions,
// their consumption loops, and the inbox API runtimes lease and ack items
// through.
//
// Delivery reads events only through a stream.Backend, and keeps its own
// state (subscriptions, inbox items, their counts and each subscription's
// read position) in a Store of its own: a SQLite database. On the
// embedded default one streamsqlite.Backend is both, so events and
// delivery state share one file and one writer; on another stream backend
// delivery state stays in the local store and nothing relies on a
// transaction spanning both.
//
// A subscription reads its source's stream through its own consumer. Its
// loop reads a batch from its read position, makes one inbox item per
// matching event (at most one per subscription and event: items are
// unique per subscription uid and offset), counts them and moves the
// position past the batch, all in one store transaction. Only
// then does it commit the stream consumer, so that the backend shows the
// subscription's lag; the position is authoritative and the consumer
// follows it. After a crash between the two, the loop resumes at the
// position and re-reads nothing; after a crash before the transaction, it
// re-reads a batch whose items do not exist yet. A subscription with no
// position (a new one, or one from a database older than positions)
// starts at its consumer's offset. New events wake the loop at once when
// the backend is a stream.Waiter; otherwise the loop polls, from 50 ms up
// to a second while the stream is idle. Reset moves a subscription's
// position (and its consumer) from outside.
//
// An inbox item's state is pending → processing (leased, with a
// visibility timeout) → completed, or back to pending (nack, or an expired
// lease), or failed. Acking an item moves no offset.
package delivery

import (
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/postbox-events/postbox/internal/logsample"
	"github.com/postbox-events/postbox/internal/names"
	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/retry"
	"github.com/postbox-events/postbox/stream"
)

// The migrations of the store: SQLite's, and PostgreSQL's for a
// SharedStore.
//
//go:embed migrations/*.sql pgmigrations/*.sql
var migrations embed.FS

// Migrations returns the migrations of delivery's tables: PostgreSQL's
// when postgres, else SQLite's. New applies them.
func Migrations(postgres bool) fs.FS {
	dir := "migrations"
	if postgres {
		dir = "pgmigrations"
	}
	sub, _ := fs.Sub(migrations, dir)
	return sub
}

// Errors the API maps to statuses.
var (
	ErrNotFound     = errors.New("not found")
	ErrConflict     = errors.New("exists with another definition")
	ErrInvalid      = errors.New("invalid")
	ErrLeaseLost    = errors.New("lease lost")
	ErrInvalidState = errors.New("invalid state")
)

// Error is an error of one of the kinds above, with a message for people.
type Error struct {
	Kind error
	Msg  string
}

func (e *Error) Error() string { return e.Msg }
func (e *Error) Unwrap() error { return e.Kind }

func errorf(kind error, format string, args ...any) error {
	return &Error{Kind: kind, Msg: fmt.Sprintf(format, args...)}
}

// Defaults of Config.
const (
	DefaultBatchSize         = 1000
	DefaultVisibilityTimeout = 30 * time.Second
	DefaultReapInterval      = time.Second
	DefaultMaxAttempts       = 5
	DefaultRetryBaseDelay    = 5 * time.Second
	DefaultRetryMaxDelay     = 300 * time.Second
	DefaultWorkers           = 16
	DefaultHandlerTimeout    = 30 * time.Second
	DefaultRetention         = 30 * 24 * time.Hour
	DefaultCleanupInterval   = time.Hour
	DefaultDrainGrace        = 10 * time.Second
)

// Config configures a Delivery.
type Config struct {
	// BatchSize is how many events a subscription reads and materialises
	// per transaction. Defaults to DefaultBatchSize.
	BatchSize int
	// ReapInterval is how often leases that expired are ended. Defaults to
	// DefaultReapInterval.
	ReapInterval time.Duration
	// MaxAttempts is how many attempts an item gets; after the last one
	// fails it is failed: a dead letter. Defaults to DefaultMaxAttempts.
	MaxAttempts int
	// RetryBaseDelay and RetryMaxDelay shape the backoff of workers: the
	// n-th retry of an item has the ceiling min(RetryBaseDelay·2^(n-1),
	// RetryMaxDelay), and waits the part of it Jitter draws: the zero
	// value, retry.FullJitter, a random wait up to the ceiling;
	// retry.EqualJitter, at least half of it; retry.NoJitter, exactly the
	// ceiling. RetryMaxDelay also bounds what a target's Retry-After or a
	// handler's retry.RetryAfter asks for. They default to
	// DefaultRetryBaseDelay and DefaultRetryMaxDelay.
	RetryBaseDelay time.Duration
	RetryMaxDelay  time.Duration
	Jitter         retry.Jitter
	// Workers is how many items the workers handle at once, over every
	// inbox with a handler. Defaults to DefaultWorkers.
	Workers int
	// HandlerTimeout bounds one attempt of a handler. Defaults to
	// DefaultHandlerTimeout.
	HandlerTimeout time.Duration
	// DrainGrace is how long the attempts in flight when Run's context
	// ends may take to finish, and be recorded as they ended; those still
	// running then are cut short and their items handed back, the attempt
	// not counted. Defaults to DefaultDrainGrace.
	DrainGrace time.Duration
	// HTTPClient sends the items of subscriptions with a target URL.
	// Defaults to a client with keep-alive connections for Workers whose
	// dialer applies the target address policy below; a client given here
	// is used as it is, but that it never follows a redirect: a 3xx
	// answer is a failed attempt, as any answer but a 2xx (followed, a
	// 301, 302 or 303 would turn the POST into a GET without its body, and
	// any redirect would carry the signature and the endpoint's headers to
	// another host).
	HTTPClient *http.Client
	// AllowLinkLocalTargets lets targets be link-local addresses
	// (169.254.0.0/16, among them the cloud metadata address
	// 169.254.169.254, and fe80::/10), refused by default.
	// DenyPrivateTargets refuses loopback, private, unspecified,
	// carrier-grade NAT and reserved addresses too, for deployments where
	// whoever sets a target is not trusted. The address is checked when a
	// worker connects, after DNS, and a target URL holding a refused IP
	// address is refused when it is set (ErrInvalid).
	AllowLinkLocalTargets bool
	DenyPrivateTargets    bool
	// Retention is how long completed and failed items, and stream events
	// every consumer has read, are kept; CleanupInterval is how often they
	// are deleted. A negative Retention keeps them. They default to
	// DefaultRetention and DefaultCleanupInterval.
	Retention       time.Duration
	CleanupInterval time.Duration
	// Node names this process in logs and in the leases of a shared
	// store. Defaults to the host name.
	Node string
	// LeaseTTL is how long the leases of a shared store last unless
	// renewed; they are renewed every LeaseTTL/5. Defaults to
	// DefaultLeaseTTL.
	LeaseTTL time.Duration
	// ReplySettings returns a source's reply settings, the headers and
	// signing secret its replies carry (replies.go); nil: none. LookupEnv
	// reads their env:NAME values at each attempt. Defaults to
	// os.LookupEnv.
	ReplySettings ReplySettings
	LookupEnv     func(string) (string, bool)
	Logger        *slog.Logger     // defaults to one that discards
	Now           func() time.Time // defaults to time.Now
	Metrics       *Metrics         // nil: none

	testSignals *testSignals // nil but in tests (WithTestSignals)
}

func (cfg *Config) setDefaults() {
	setDefault(&cfg.BatchSize, DefaultBatchSize)
	setDefault(&cfg.ReapInterval, DefaultReapInterval)
	setDefault(&cfg.MaxAttempts, DefaultMaxAttempts)
	setDefault(&cfg.RetryBaseDelay, DefaultRetryBaseDelay)
	setDefault(&cfg.RetryMaxDelay, DefaultRetryMaxDelay)
	setDefault(&cfg.Workers, DefaultWorkers)
	setDefault(&cfg.HandlerTimeout, DefaultHandlerTimeout)
	setDefault(&cfg.DrainGrace, DefaultDrainGrace)
	if cfg.Retention == 0 {
		cfg.Retention = DefaultRetention
	}
	setDefault(&cfg.CleanupInterval, DefaultCleanupInterval)
	setDefault(&cfg.LeaseTTL, DefaultLeaseTTL)
	if cfg.Node == "" {
		cfg.Node, _ = os.Hostname()
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = newHTTPClient(cfg)
	}
	noRedirects := *cfg.HTTPClient // a copy: the caller's client stays as it was
	noRedirects.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	cfg.HTTPClient = &noRedirects
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.LookupEnv == nil {
		cfg.LookupEnv = os.LookupEnv
	}
}

func setDefault[T int | float64 | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// Delivery runs the subscriptions of one store.
type Delivery struct {
	streams   stream.Backend
	waiter    stream.Waiter // streams, when it is one; nil: the loops poll
	store     Store
	db        conn                // reads of store
	stmts     *sqlitedb.StmtCache // statements of the writer's transactions, on SQLite
	shared    SharedStore         // store, when several processes share it; nil: SQLite
	pg        bool                // the store speaks PostgreSQL
	cluster   *cluster            // leases of loops, with a shared store; nil: every loop runs here
	cfg       Config
	log       *slog.Logger
	now       func() time.Time
	inboxes   notifier
	inline    inlineState
	countRows atomic.Int64 // rows written to item_counts since this process last folded them

	jobs        chan job        // leased items for the workers
	completions chan completion // items the workers completed, to ack
	slots       *slots

	// empty holds the inboxes whose last lease took nothing (key: inbox
	// name): only their next lease looks first whether they are paused
	// (allPaused), so a lease of a busy inbox makes no extra trip.
	empty sync.Map
	// ordered holds the inboxes whose leases took items with an order
	// key: an ack of their items wakes the leases waiting for them, since
	// the next item of an acked one's key may go now.
	ordered sync.Map

	// sample bounds the INFO lines of attempts started and completed: at
	// most 10 a second of each (logsample).
	sample logsample.Sampler

	admin sync.Mutex // serialises Delete, Reset and the claim rounds of a shared store

	mu          sync.Mutex
	runCtx      context.Context // nil until Run
	loops       map[string]*loop
	held        map[string]bool    // subscriptions whose loop Reset has stopped
	handlers    map[string]Handler // Go handlers by inbox
	targets     map[string]string  // target URLs by inbox
	endpoints   endpoints          // the endpoints of targets, cached
	dispatchers map[string]*loop   // by inbox
	replaced    []*loop            // dispatchers stopped for a new handler
	stopped     bool
}

// loop is one subscription's running consumption, or an inbox's
// dispatcher.
type loop struct {
	name, uid string // the subscription's
	cancel    context.CancelFunc
	done      chan struct{}
}

// New prepares delivery of the events of streams, keeping its state in
// store, whose tables it creates. On SQLite one *streamsqlite.Backend is
// passed as both. Run starts it.
func New(ctx context.Context, streams stream.Backend, store Store, cfg Config) (*Delivery, error) {
	cfg.setDefaults()
	shared, pg := store.(SharedStore)
	if err := store.Migrate(ctx, "delivery", Migrations(pg)); err != nil {
		return nil, err
	}
	waiter, _ := streams.(stream.Waiter)
	d := &Delivery{streams: streams, waiter: waiter, store: store, db: conn{Tx: store.ReadDB(), PostgreSQL: pg}, shared: shared, pg: pg,
		stmts: stmtCache(store, pg), cfg: cfg, log: cfg.Logger, now: cfg.Now,
		loops: map[string]*loop{}, held: map[string]bool{},
		jobs: make(chan job), completions: make(chan completion, ackQueue*cfg.Workers), slots: newSlots(slotsPerWorker * cfg.Workers),
		handlers: map[string]Handler{}, targets: map[string]string{}, dispatchers: map[string]*loop{}}
	if pg {
		d.cluster = newCluster(d)
	}
	return d, nil
}

// Run runs every subscription's consumption loop, the workers of the
// inboxes with a handler, the lease reaper, retention and replay jobs,
// until ctx ends.
// Call Recover first.
func (d *Delivery) Run(ctx context.Context) error {
	d.mu.Lock()
	d.runCtx = ctx // from here on, Create starts the loops of new subscriptions
	d.mu.Unlock()
	subs, err := d.Subscriptions(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped before it started
		}
		return err
	}
	var workers, acker sync.WaitGroup
	acker.Go(func() { d.ack(d.completions) })
	attempts, stopAttempts := draining(ctx, d.cfg.DrainGrace) // the attempts' context: it outlives ctx by DrainGrace
	defer stopAttempts()
	for range d.cfg.Workers {
		workers.Go(func() { d.work(ctx, attempts) })
	}
	d.mu.Lock()
	for _, s := range subs {
		d.cfg.Metrics.subscribed(s)
		d.startLocked(s)
		if s.Target != "" {
			d.targets[s.Inbox] = s.Target
		}
	}
	for inbox := range d.targets {
		d.dispatchLocked(inbox)
	}
	for inbox := range d.handlers {
		d.dispatchLocked(inbox)
	}
	dispatching := len(d.dispatchers)
	d.mu.Unlock()
	d.log.Info("delivery: running", "subscriptions", len(subs), "workers", d.cfg.Workers, "inboxes_with_handler", dispatching)
	workers.Go(func() { d.retain(ctx) })
	workers.Go(func() { d.runReplays(ctx) })
	workers.Go(func() { d.runReplies(ctx) })
	if d.cluster != nil {
		workers.Go(func() { d.cluster.run(ctx) })
		workers.Go(func() {
			if err := d.shared.Listen(ctx, notifyChannel, d.cluster.notified); err != nil && ctx.Err() == nil {
				d.log.Error("delivery: listening to the other processes stopped; polling", "err", err)
			}
		})
	}
	t := time.NewTicker(d.cfg.ReapInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			d.mu.Lock()
			d.stopped = true
			loops := d.loops
			d.loops = map[string]*loop{}
			stops := slices.Collect(maps.Values(loops))
			stops = append(append(stops, slices.Collect(maps.Values(d.dispatchers))...), d.replaced...)
			d.dispatchers, d.replaced = map[string]*loop{}, nil
			d.mu.Unlock()
			for _, l := range stops {
				l.cancel()
				<-l.done
			}
			d.cfg.testSignals.stop()
			workers.Wait()
			close(d.completions) // the workers acked what they finished
			acker.Wait()
			if d.cluster != nil {
				d.cluster.release()
			}
			return nil
		case <-t.C:
			if err := d.reap(ctx); err != nil && ctx.Err() == nil {
				d.log.Warn("delivery: ending expired leases failed; retrying", "err", err)
			}
			if err := d.foldCounts(ctx, false); err != nil && ctx.Err() == nil {
				d.log.Warn("delivery: folding the kept item counts failed; retrying", "err", err)
			}
		}
	}
}

// startLocked starts s's loop if Run is running. d.mu is held.
func (d *Delivery) startLocked(s Subscription) {
	if d.runCtx == nil || d.stopped || d.loops[s.Name] != nil || d.held[s.Name] {
		return
	}
	if d.cluster != nil && !d.cluster.owned[s.Name] {
		d.cluster.poke() // runs where its lease is
		return
	}
	ctx, cancel := context.WithCancel(d.runCtx)
	l := &loop{name: s.Name, uid: s.UID, cancel: cancel, done: make(chan struct{})}
	d.loops[s.Name] = l
	go func() {
		defer close(l.done)
		d.consume(ctx, s)
	}()
}

// Subscription is a named, filtered reader of one source.
type Subscription struct {
	Name     string
	UID      string // sub_<ULID>: tells two subscriptions of one name apart over time
	Source   string
	Stream   string
	Inbox    string
	Types    []string          // type patterns; * matches any run of characters
	Metadata map[string]string // metadata values an event must have
	Start    stream.Start
	// Target, when set, is the URL the workers POST each item to (see
	// Handler for what its answers mean); without one a runtime leases
	// the inbox's items.
	Target string
	// Endpoint is how the workers deliver to Target; its zero fields take
	// the server's settings. An inbox has one endpoint: subscriptions
	// filling one inbox with one target share their settings and secrets.
	Endpoint Endpoint
	// Secrets sign each request to Target (Standard Webhooks), current
	// first; none: requests are not signed. Create takes at most one,
	// the current one; Update rotates them.
	Secrets   []Secret
	CreatedAt time.Time
	// PausedAt is when an operator paused the subscription's delivery
	// (Pause); zero: it delivers. PausedReason is what they said.
	PausedAt     time.Time
	PausedReason string
	// OrderBy, when set, orders the subscription's items per key: where
	// an event's key comes from (device_id, session_id, metadata.NAME,
	// header.NAME or a JSON pointer into the payload). The items of a
	// key are handed out one at a time, in offset order. Set at create.
	OrderBy string
	// OnDeadLetter is what a dead letter of a key does to the key's next
	// items: OnDeadLetterBlock (the default with an OrderBy) or
	// OnDeadLetterSkip. Update changes it (Change.OnDeadLetter).
	OnDeadLetter string
}

// validate checks s and fills its defaults.
func (s *Subscription) validate() error {
	if s.Name == "" {
		return errorf(ErrInvalid, "name: required")
	}
	if !names.Valid(s.Name) {
		return errorf(ErrInvalid, "name %q: %s", s.Name, names.Rule)
	}
	if s.Source == "" {
		return errorf(ErrInvalid, "source: required")
	}
	if s.Inbox == "" {
		s.Inbox = s.Name
	}
	if !names.Valid(s.Inbox) {
		return errorf(ErrInvalid, "inbox %q: %s", s.Inbox, names.Rule)
	}
	for _, t := range s.Types {
		if t == "" {
			return errorf(ErrInvalid, "types: empty pattern")
		}
	}
	for k := range s.Metadata {
		if k == "" {
			return errorf(ErrInvalid, "metadata: empty key")
		}
	}
	if s.Start.Policy == "" {
		s.Start.Policy = stream.StartLatest
	}
	if err := s.Start.Validate(); err != nil {
		return errorf(ErrInvalid, "start %q: use latest, earliest, at_offset with start_offset ≥ 1, or at_time with start_time", s.Start.Policy)
	}
	if err := validTarget(s.Target); err != nil {
		return err
	}
	if err := s.Endpoint.validate(); err != nil {
		return err
	}
	switch {
	case len(s.Secrets) > 1:
		return errorf(ErrInvalid, "secret: a new subscription has one")
	case len(s.Secrets) == 1:
		if err := validSecret(s.Secrets[0].Key); err != nil {
			return err
		}
		s.Secrets[0].ExpiresAt = time.Time{}
	}
	if s.Target == "" && (len(s.Secrets) > 0 || !sameEndpoint(s.Endpoint, Endpoint{})) {
		return errorf(ErrInvalid, "target: required with a secret or endpoint settings")
	}
	if err := s.validOrdering(); err != nil {
		return err
	}
	s.Stream = s.Source // one source, one stream
	return nil
}

func validTarget(target string) error {
	if target == "" {
		return nil
	}
	u, err := url.Parse(target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errorf(ErrInvalid, "target %q: want an http:// or https:// URL", target)
	}
	return nil
}

// sameDefinition reports whether a and b describe the same subscription.
func sameDefinition(a, b Subscription) bool {
	return a.Source == b.Source && a.Inbox == b.Inbox && slices.Equal(a.Types, b.Types) &&
		fmt.Sprint(a.Metadata) == fmt.Sprint(b.Metadata) && a.Start.Policy == b.Start.Policy &&
		a.Start.Offset == b.Start.Offset && a.Start.Time.Equal(b.Start.Time) && a.Target == b.Target &&
		sameEndpoint(a.Endpoint, b.Endpoint) && currentSecret(a.Secrets) == currentSecret(b.Secrets) &&
		a.OrderBy == b.OrderBy && a.OnDeadLetter == b.OnDeadLetter
}

// Create stores s, creates its consumer at its start and starts its loop.
// It reports created=false, with the stored subscription, when one of
// that name exists with the same definition, and ErrConflict when its
// definition differs. An unknown source is ErrNotFound.
func (d *Delivery) Create(ctx context.Context, s Subscription) (_ Subscription, created bool, _ error) {
	if len(s.Types) == 0 {
		s.Types = []string{}
	}
	if s.Metadata == nil {
		s.Metadata = map[string]string{}
	}
	if err := s.validate(); err != nil {
		return s, false, err
	}
	if err := d.cfg.checkTarget(s.Target); err != nil {
		return s, false, err
	}
	if _, err := d.streams.Stats(ctx, s.Stream); errors.Is(err, stream.ErrStreamNotFound) {
		return s, false, errorf(ErrNotFound, "source %q: no such source", s.Source)
	} else if err != nil {
		return s, false, err
	}
	if old, err := d.Subscription(ctx, s.Name); err == nil {
		if !sameDefinition(old, s) {
			return old, false, errorf(ErrConflict, "subscription %q exists with another definition", s.Name)
		}
		return old, false, nil
	} else if !errors.Is(err, ErrNotFound) {
		return s, false, err
	}
	if err := d.sharedInbox(ctx, s); err != nil {
		return s, false, err
	}
	s.UID = "sub_" + ulid.Make().String()
	s.CreatedAt = d.now().UTC().Truncate(time.Microsecond)
	if len(s.Secrets) == 1 {
		s.Secrets[0].CreatedAt = s.CreatedAt
	}
	types, _ := json.Marshal(s.Types)
	meta, _ := json.Marshal(s.Metadata)
	var startTime any
	if s.Start.Policy == stream.StartAtTime {
		startTime = s.Start.Time.UTC().Format(sqlitedb.Time)
	}
	// The subscription first, then its consumer: if the process stops in
	// between, the loop creates the consumer at the next start.
	err := d.update(ctx, func(tx conn) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO subscriptions (subscription_id, subscription_uid, source_id, stream_id, inbox_id,
			match_types_json, match_metadata_json, start_policy, start_offset, start_time, created_at, target_url, order_by, on_dead_letter, `+endpointColumns+`)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, `+endpointMarks+`)`, append([]any{s.Name, s.UID, s.Source, s.Stream, s.Inbox,
			string(types), string(meta), s.Start.Policy, s.Start.Offset, startTime, s.CreatedAt.Format(sqlitedb.Time), nullString(s.Target),
			nullString(s.OrderBy), nullString(s.OnDeadLetter)},
			endpointValues(s.Endpoint, s.Secrets)...)...)
		return err
	})
	if err != nil {
		if old, gerr := d.Subscription(ctx, s.Name); gerr == nil { // created meanwhile by another request
			if sameDefinition(old, s) {
				return old, false, nil
			}
			return old, false, errorf(ErrConflict, "subscription %q exists with another definition", s.Name)
		}
		return s, false, fmt.Errorf("create subscription %s: %w", s.Name, err)
	}
	if _, err := d.streams.EnsureConsumer(ctx, stream.ConsumerConfig{ID: s.Name, StreamID: s.Stream, Start: s.Start}); err != nil {
		d.update(ctx, func(tx conn) error { // a start the stream refuses (an offset past its end)
			_, err := tx.ExecContext(ctx, `DELETE FROM subscriptions WHERE subscription_uid = ?`, s.UID)
			return err
		})
		if errors.Is(err, stream.ErrOffsetOutOfRange) {
			return s, false, errorf(ErrInvalid, "start_offset %d: past the end of source %q (%v)", s.Start.Offset, s.Source, err)
		}
		return s, false, fmt.Errorf("create subscription %s: %w", s.Name, translate(err))
	}
	d.cfg.Metrics.subscribed(s)
	d.mu.Lock()
	d.startLocked(s)
	d.setTargetLocked(s.Inbox, s.Target)
	d.mu.Unlock()
	d.forgetEndpoint(s.Inbox)
	d.broadcast(ctx, "subs")
	d.log.Info("delivery: subscription created", setAttrs("subscription", s.Name, "source", s.Source, "inbox", s.Inbox,
		"types", s.Types, "start", s.Start.Policy, "target", s.Target)...)
	return s, true, nil
}

// Delete stops the subscription's loop (and its workers when it has a
// target) and deletes it, its position and its consumer. Its inbox items
// stay.
func (d *Delivery) Delete(ctx context.Context, name string) error {
	d.admin.Lock()
	defer d.admin.Unlock()
	s, err := d.Subscription(ctx, name)
	if err != nil {
		return err
	}
	d.mu.Lock()
	l := d.loops[name]
	delete(d.loops, name)
	if s.Target != "" {
		d.setTargetLocked(s.Inbox, "")
	}
	d.mu.Unlock()
	if l != nil {
		l.cancel()
		<-l.done
	}
	err = d.update(ctx, func(tx conn) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM subscriptions WHERE subscription_id = ?`, name); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `DELETE FROM positions WHERE subscription_uid = ?`, s.UID)
		return err
	})
	if err != nil {
		return fmt.Errorf("delete subscription %s: %w", name, err)
	}
	if err := d.streams.DeleteConsumer(ctx, name); err != nil && !errors.Is(err, stream.ErrConsumerNotFound) {
		return fmt.Errorf("delete subscription %s: %w", name, err)
	}
	if rest, err := d.Subscriptions(ctx); err == nil {
		d.cfg.Metrics.unsubscribed(s, !slices.ContainsFunc(rest, func(o Subscription) bool { return o.Inbox == s.Inbox }))
	}
	d.broadcast(ctx, "subs")
	d.log.Info("delivery: subscription deleted", "subscription", name)
	return nil
}

const subscriptionColumns = `subscription_id, subscription_uid, source_id, stream_id, inbox_id, match_types_json,
	match_metadata_json, start_policy, start_offset, start_time, created_at, target_url, ` + endpointColumns + `,
	paused_at, paused_reason, order_by, on_dead_letter`

// Subscription returns the subscription name, or ErrNotFound.
func (d *Delivery) Subscription(ctx context.Context, name string) (Subscription, error) {
	rows, err := d.db.QueryContext(ctx, `SELECT `+subscriptionColumns+` FROM subscriptions WHERE subscription_id = ?`, name)
	if err != nil {
		return Subscription{}, err
	}
	subs, err := scanSubscriptions(rows)
	if err != nil {
		return Subscription{}, err
	}
	if len(subs) == 0 {
		return Subscription{}, errorf(ErrNotFound, "subscription %q: no such subscription", name)
	}
	subs[0].Secrets = live(subs[0].Secrets, d.now())
	return subs[0], nil
}

// ReadersOf returns, in the transaction tx of the store, the names of the
// subscriptions that read the stream of source, by name: intake deletes
// no source they read (intake.StoreConfig.Readers).
func (d *Delivery) ReadersOf(ctx context.Context, tx *sql.Tx, source string) ([]string, error) {
	rows, err := conn{Tx: tx, PostgreSQL: d.pg}.QueryContext(ctx, `SELECT subscription_id FROM subscriptions WHERE source_id = ? ORDER BY subscription_id`, source)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var subs []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		subs = append(subs, s)
	}
	return subs, rows.Err()
}

// Subscriptions returns every subscription, by name.
func (d *Delivery) Subscriptions(ctx context.Context) ([]Subscription, error) {
	rows, err := d.db.QueryContext(ctx, `SELECT `+subscriptionColumns+` FROM subscriptions ORDER BY subscription_id`)
	if err != nil {
		return nil, err
	}
	subs, err := scanSubscriptions(rows)
	for i := range subs {
		subs[i].Secrets = live(subs[i].Secrets, d.now()) // expired ones stay stored until the next change
	}
	return subs, err
}

func scanSubscriptions(rows *sql.Rows) ([]Subscription, error) {
	defer rows.Close()
	var subs []Subscription
	for rows.Next() {
		var s Subscription
		var types, meta, created string
		var startOffset sql.NullInt64
		var startTime, target, pausedAt, pausedReason, orderBy, onDead sql.NullString
		var ep endpointScan
		if err := rows.Scan(append(append([]any{&s.Name, &s.UID, &s.Source, &s.Stream, &s.Inbox, &types, &meta, &s.Start.Policy,
			&startOffset, &startTime, &created, &target}, ep.dest()...), &pausedAt, &pausedReason, &orderBy, &onDead)...); err != nil {
			return nil, fmt.Errorf("read subscriptions: %w", err)
		}
		if err := json.Unmarshal([]byte(types), &s.Types); err != nil {
			return nil, fmt.Errorf("subscription %s: types: %w", s.Name, err)
		}
		if err := json.Unmarshal([]byte(meta), &s.Metadata); err != nil {
			return nil, fmt.Errorf("subscription %s: metadata: %w", s.Name, err)
		}
		s.Start.Offset = startOffset.Int64
		if startTime.Valid {
			s.Start.Time, _ = sqlitedb.ParseTime(startTime.String)
		}
		s.CreatedAt, _ = sqlitedb.ParseTime(created)
		s.Target = target.String
		if pausedAt.Valid {
			s.PausedAt, _ = sqlitedb.ParseTime(pausedAt.String)
		}
		s.PausedReason = pausedReason.String
		s.OrderBy, s.OnDeadLetter = orderBy.String, onDead.String
		if err := ep.into(&s); err != nil {
			return nil, fmt.Errorf("subscription %s: %w", s.Name, err)
		}
		subs = append(subs, s)
	}
	return subs, rows.Err()
}

// sharedInbox refuses s when another subscription fills its inbox with
// another target: an inbox has one handler.
func (d *Delivery) sharedInbox(ctx context.Context, s Subscription) error {
	subs, err := d.Subscriptions(ctx)
	if err != nil {
		return err
	}
	for _, o := range subs {
		if o.Inbox != s.Inbox || o.Name == s.Name {
			continue
		}
		if o.Target != s.Target {
			return errorf(ErrConflict, "inbox %q is filled by subscription %q with target %q: an inbox has one target (use another inbox)",
				s.Inbox, o.Name, o.Target)
		}
		if s.Target != "" && (!sameEndpoint(o.Endpoint, s.Endpoint) || currentSecret(o.Secrets) != currentSecret(s.Secrets)) {
			return errorf(ErrConflict, "inbox %q is filled by subscription %q with the same target and other endpoint settings or secret: an inbox has one endpoint (give the same settings, or use another inbox)",
				s.Inbox, o.Name)
		}
	}
	return nil
}

// SetTarget sets the target URL of subscription name ("" for none) and
// restarts its inbox's workers with it.
func (d *Delivery) SetTarget(ctx context.Context, name, target string) error {
	_, err := d.Update(ctx, name, Change{Target: &target})
	return err
}

// Change is a change of a subscription's target and endpoint: a nil
// field leaves what it is.
type Change struct {
	Target   *string   // "" removes the target
	Endpoint *Endpoint // every setting at once
	// Secret, when not empty, becomes the signing secret; the one it
	// replaces keeps signing beside it for SecretOverlap (defaults to
	// DefaultSecretOverlap). "" removes every secret: requests are no
	// longer signed.
	Secret        *string
	SecretOverlap time.Duration
	// OnDeadLetter, of an ordered subscription, becomes its
	// OnDeadLetter: skip lets the keys held behind their dead letters go
	// on at once, block holds the keys whose next item waits behind one.
	OnDeadLetter *string
}

// Update applies c to subscription name and to every subscription that
// fills its inbox with its target (an inbox has one endpoint), then
// restarts the inbox's workers with it. It returns the subscription as
// changed.
func (d *Delivery) Update(ctx context.Context, name string, c Change) (Subscription, error) {
	s, err := d.Subscription(ctx, name)
	if err != nil {
		return s, err
	}
	old := s
	if c.Target != nil {
		if err := validTarget(*c.Target); err != nil {
			return old, err
		}
		if err := d.cfg.checkTarget(*c.Target); err != nil {
			return old, err
		}
		s.Target = *c.Target
	}
	if c.Endpoint != nil {
		if err := c.Endpoint.validate(); err != nil {
			return old, err
		}
		s.Endpoint = *c.Endpoint
	}
	if c.SecretOverlap < 0 {
		return old, errorf(ErrInvalid, "secret_overlap %s: want a positive duration", c.SecretOverlap)
	}
	if c.OnDeadLetter != nil {
		switch {
		case s.OrderBy == "":
			return old, errorf(ErrInvalid, "on_dead_letter: only for a subscription with order_by")
		case *c.OnDeadLetter == "":
			return old, errorf(ErrInvalid, "on_dead_letter \"\": want block or skip")
		}
		s.OnDeadLetter = *c.OnDeadLetter
		if err := s.validOrdering(); err != nil {
			return old, err
		}
	}
	now := d.now().UTC().Truncate(time.Microsecond)
	if c.Secret != nil {
		if *c.Secret != "" {
			if err := validSecret(*c.Secret); err != nil {
				return old, err
			}
		}
		overlap := c.SecretOverlap
		if overlap == 0 {
			overlap = DefaultSecretOverlap
		}
		s.Secrets = rotate(s.Secrets, *c.Secret, overlap, now)
	} else {
		s.Secrets = live(s.Secrets, now)
	}
	// Settings stay when a target is removed, but are not set without one.
	if s.Target == "" && (c.Secret != nil && *c.Secret != "" || c.Endpoint != nil && !sameEndpoint(*c.Endpoint, Endpoint{})) {
		return old, errorf(ErrInvalid, "target: required with a secret or endpoint settings")
	}
	if s.Target != old.Target {
		if err := d.sharedInbox(ctx, s); err != nil {
			return old, err
		}
	}
	// Every check passed: nothing is written for a change that is refused.
	if s.OnDeadLetter != old.OnDeadLetter {
		if err := d.setOnDeadLetter(ctx, s); err != nil {
			return old, err
		}
	}
	if s.Target == old.Target && sameEndpoint(s.Endpoint, old.Endpoint) && slices.Equal(s.Secrets, old.Secrets) {
		return s, nil
	}
	err = d.update(ctx, func(tx conn) error {
		args := append([]any{nullString(s.Target)}, endpointValues(s.Endpoint, s.Secrets)...)
		_, err := tx.ExecContext(ctx, `UPDATE subscriptions SET target_url = ?, `+endpointSet+`
			WHERE subscription_id = ?`, append(args, name)...)
		if err != nil || s.Target == "" {
			return err
		}
		// The others of its inbox and target share its endpoint.
		_, err = tx.ExecContext(ctx, `UPDATE subscriptions SET `+endpointSet+`
			WHERE inbox_id = ? AND target_url = ? AND subscription_id <> ?`, append(args[1:], s.Inbox, s.Target, name)...)
		return err
	})
	if err != nil {
		return old, fmt.Errorf("update subscription %s: %w", name, err)
	}
	d.forgetEndpoint(s.Inbox)
	d.mu.Lock()
	d.setTargetLocked(s.Inbox, s.Target)
	d.mu.Unlock()
	d.broadcast(ctx, "subs")
	switch {
	case s.Target != old.Target && s.Target == "":
		d.log.Info("delivery: subscription target removed; runtimes lease its items", "subscription", name, "inbox", s.Inbox)
	case s.Target != old.Target:
		d.log.Info("delivery: subscription target set", "subscription", name, "inbox", s.Inbox, "target", s.Target)
	}
	if c.Secret != nil {
		d.log.Info("delivery: subscription signing secret set", "subscription", name, "secrets", len(s.Secrets))
	}
	if c.Endpoint != nil && !sameEndpoint(s.Endpoint, old.Endpoint) {
		d.log.Info("delivery: subscription endpoint settings set", "subscription", name, "inbox", s.Inbox)
	}
	return s, nil
}

// setTargetLocked records the target of inbox and restarts its workers.
// d.mu is held.
func (d *Delivery) setTargetLocked(inbox, target string) {
	if d.targets[inbox] == target {
		return
	}
	if target == "" {
		delete(d.targets, inbox)
	} else {
		d.targets[inbox] = target
	}
	d.dispatchLocked(inbox)
}

func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// translate maps the stream package's errors to delivery's.
func translate(err error) error {
	switch {
	case errors.Is(err, stream.ErrStreamNotFound), errors.Is(err, stream.ErrConsumerNotFound):
		return errorf(ErrNotFound, "%v", err)
	case errors.Is(err, stream.ErrOffsetOutOfRange), errors.Is(err, stream.ErrInvalidStart):
		return errorf(ErrInvalid, "%v", err)
	case errors.Is(err, stream.ErrConsumerExists):
		return errorf(ErrConflict, "%v", err)
	}
	return err
}
