package feed

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/internal/budget"
	"github.com/postbox-events/postbox/internal/redirect"
	"github.com/postbox-events/postbox/stream"
)

// Defaults of Config.
const (
	DefaultBatchSize    = 500
	DefaultMinBackoff   = 200 * time.Millisecond
	DefaultMaxBackoff   = 30 * time.Second
	DefaultIdleTimeout  = 3 * DefaultHeartbeat
	DefaultMaxLineBytes = 16 << 20
)

// Writer is the append path the follower stores events through: the
// server's writer (server.Writer), shared with the ingress.
type Writer interface {
	// AppendAsync queues events and calls done after they are stored,
	// or with an error; it blocks while the queue is full.
	AppendAsync(ctx context.Context, streamID string, events []stream.Event, done func([]stream.AppendResult, error)) error
}

// Checkpoints keeps, per follower, the last remote offset it stored.
type Checkpoints interface {
	// Load returns the checkpoint of name: 0 when it has none.
	Load(ctx context.Context, name string) (int64, error)
	// Save records offset as name's checkpoint, durably, before it
	// returns.
	Save(ctx context.Context, name string, offset int64) error
}

// FailureRecorder is implemented by Checkpoints that also keep a
// follower's last failure (a source's checkpoint shows it); a save
// clears it.
type FailureRecorder interface {
	// Failed records err as name's last failure, at the checkpoint
	// offset.
	Failed(ctx context.Context, name string, offset int64, err error) error
}

// Config configures a Follower.
type Config struct {
	// URL is the remote stream: http(s)://HOST:PORT/v1/streams/NAME. The
	// follower reads URL/events?after=CHECKPOINT. Required.
	URL string
	// Token is the remote operator API's token, sent as a bearer token;
	// empty sends none. "env:NAME" is the value of the environment
	// variable NAME, read at each connection: while it is not set, each
	// attempt fails (reason "token") and is retried with backoff.
	Token string
	// Stream is the local stream events are appended to. Required; it
	// must exist.
	Stream string
	// Name keys the checkpoint and labels the metrics and logs. Defaults
	// to Stream.
	Name        string
	Writer      Writer      // required
	Checkpoints Checkpoints // required
	// Client sends the requests. Defaults to a client without an overall
	// timeout (a feed does not end) that gives up connecting after 10 s,
	// whose dialer calls Control. Either way the follower follows
	// redirects as Redirects says (a copy of Client does), so the token
	// never goes to another origin.
	Client *http.Client
	// Redirects is the redirect policy: "same-origin" (the default, "")
	// or "none" (Settings.Redirects).
	Redirects string
	// Control, when set, is the default Client's dialer's Control: it
	// may refuse an address (the server's target policy).
	Control func(network, address string, c syscall.RawConn) error
	// BatchSize bounds the events appended at once (and so the events
	// the follower holds). Defaults to DefaultBatchSize.
	BatchSize int
	// MinBackoff and MaxBackoff bound the wait before reconnecting after
	// an error, doubled after each failure, with jitter. Default to
	// DefaultMinBackoff and DefaultMaxBackoff.
	MinBackoff time.Duration
	MaxBackoff time.Duration
	// IdleTimeout ends a connection that delivers no line (not even a
	// heartbeat) for this long, and reconnects. Defaults to
	// DefaultIdleTimeout, three heartbeats.
	IdleTimeout time.Duration
	// MaxLineBytes bounds one line. Defaults to DefaultMaxLineBytes, and
	// to at most Budget's reserve.
	MaxLineBytes int
	// Budget, when set, bounds the memory of the lines being read and of
	// the events waiting to be stored, over every follower (and poller)
	// sharing it.
	Budget *budget.Budget
	// Limits are those every intake path stores events under
	// (postbox.Limits.CheckEvent): an event over them is refused alone
	// (the checkpoint moves past it), logged, counted
	// (postbox_feed_events_total{result="refused"}) and recorded as a
	// failure (FailureRecorder) once its batch is stored.
	Limits  postbox.Limits
	Metrics *Metrics // nil: none
	Logger  *slog.Logger
}

// Follower follows one remote feed into a local stream.
type Follower struct {
	cfg        Config
	log        *slog.Logger
	checkpoint atomic.Int64
	remoteHW   atomic.Int64
}

// New returns a follower of cfg.URL; Run runs it.
func New(cfg Config) (*Follower, error) {
	u, err := url.Parse(cfg.URL)
	switch {
	case cfg.URL == "":
		return nil, errors.New("feed: Config.URL is required")
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return nil, fmt.Errorf("feed: URL %q: want http(s)://HOST:PORT/v1/streams/NAME", cfg.URL)
	case cfg.Stream == "":
		return nil, errors.New("feed: Config.Stream is required")
	case cfg.Writer == nil || cfg.Checkpoints == nil:
		return nil, errors.New("feed: Config.Writer and Config.Checkpoints are required")
	}
	cfg.URL = strings.TrimSuffix(strings.TrimSuffix(cfg.URL, "/"), "/events")
	if cfg.Name == "" {
		cfg.Name = cfg.Stream
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Transport: &http.Transport{
			Proxy:               http.ProxyFromEnvironment,
			DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second, Control: cfg.Control}).DialContext,
			TLSHandshakeTimeout: 10 * time.Second,
		}}
	}
	if err := redirect.Validate("feed: Config.Redirects", cfg.Redirects); err != nil {
		return nil, err
	}
	cfg.Client = redirect.Client(cfg.Client, cfg.Redirects)
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = DefaultMinBackoff
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = DefaultMaxBackoff
	}
	cfg.MaxBackoff = max(cfg.MaxBackoff, cfg.MinBackoff)
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.MaxLineBytes <= 0 {
		cfg.MaxLineBytes = DefaultMaxLineBytes
	}
	if r := cfg.Budget.Reserve(); r > 0 {
		cfg.MaxLineBytes = int(min(int64(cfg.MaxLineBytes), r))
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Follower{cfg: cfg, log: cfg.Logger.With("feed", cfg.Name)}, nil
}

// Checkpoint returns the last remote offset stored (as loaded at Run's
// start and saved since).
func (f *Follower) Checkpoint() int64 { return f.checkpoint.Load() }

// Lag returns how many events the remote stream held, when last heard
// of, after the checkpoint.
func (f *Follower) Lag() int64 { return max(0, f.remoteHW.Load()-f.checkpoint.Load()) }

// Run follows the feed until ctx ends, reconnecting after errors with
// backoff and jitter from the checkpoint; it returns nil then. It returns
// an error only when the checkpoint cannot be loaded.
func (f *Follower) Run(ctx context.Context) error {
	cp, err := f.cfg.Checkpoints.Load(ctx, f.cfg.Name)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("feed %s: load checkpoint: %w", f.cfg.Name, err)
	}
	f.checkpoint.Store(cp)
	f.remoteHW.Store(cp)
	f.cfg.Metrics.start(f.cfg.Name)
	f.observe()
	backoff := f.cfg.MinBackoff
	for {
		before := f.checkpoint.Load()
		err := f.follow(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if f.checkpoint.Load() > before {
			backoff = f.cfg.MinBackoff // it made progress: the next failure starts over
		}
		f.cfg.Metrics.fail(f.cfg.Name, reasonOf(err))
		if fr, ok := f.cfg.Checkpoints.(FailureRecorder); ok {
			if err := fr.Failed(ctx, f.cfg.Name, f.checkpoint.Load(), err); err != nil && ctx.Err() == nil {
				f.log.Warn("feed: recording the failure failed", "err", err)
			}
		}
		// Full jitter on the upper half: followers of one feed that fail
		// together do not come back together.
		wait := backoff/2 + rand.N(backoff/2+1)
		f.log.Warn("feed: following failed; reconnecting", "err", err, "after", wait, "checkpoint", f.checkpoint.Load())
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		backoff = min(2*backoff, f.cfg.MaxBackoff)
	}
}

// followError is an error of one connection, with the reason it is
// counted under.
type followError struct {
	reason string
	err    error
}

func (e *followError) Error() string { return e.err.Error() }
func (e *followError) Unwrap() error { return e.err }

func failed(reason string, format string, args ...any) error {
	return &followError{reason: reason, err: fmt.Errorf(format, args...)}
}

func reasonOf(err error) string {
	if fe, ok := errors.AsType[*followError](err); ok {
		return fe.reason
	}
	return "read"
}

// follow reads one connection of the feed until it fails or ctx ends.
func (f *Follower) follow(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	after := f.checkpoint.Load()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.cfg.URL+"/events?after="+strconv.FormatInt(after, 10), nil)
	if err != nil {
		return failed("connect", "feed request: %w", err)
	}
	token, err := resolveToken(f.cfg.Token)
	if err != nil {
		return failed("token", "%w", err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Accept", ContentType)
	// No line for IdleTimeout: the peer or the path to it is gone.
	idle := time.AfterFunc(f.cfg.IdleTimeout, cancel)
	defer idle.Stop()
	resp, err := f.cfg.Client.Do(req)
	if err != nil {
		return failed("connect", "connect to %s: %w", f.cfg.URL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return failed("status", "%s answered %s: %s", f.cfg.URL, resp.Status, bytes.TrimSpace(body))
	}
	if hw, err := strconv.ParseInt(resp.Header.Get(HeaderHighWatermark), 10, 64); err == nil {
		f.seen(hw)
	}
	f.log.Info("feed: following", "url", f.cfg.URL, "after", after)
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	var batch []stream.Event
	var refused []error // events over the limits since the last store
	var last int64      // the offset of the last event read
	// The budget held by batch, and by the line being read.
	var batchHeld, lineHeld int64
	b := f.cfg.Budget
	defer func() { b.Give(batchHeld + lineHeld) }()
	flush := func() error {
		if last > f.checkpoint.Load() {
			if err := f.store(ctx, batch, last, refused); err != nil {
				return err
			}
		}
		batch, refused = nil, nil // the writer may hold the last batch until it returns
		b.Give(batchHeld)
		batchHeld = 0
		return nil
	}
	// take takes n bytes of the budget for the line being read: at once
	// if there is room, else after storing the batch (a follower waits
	// holding no more than its line).
	take := func(n int64) error {
		if !b.TryTake(n, f) {
			if err := flush(); err != nil {
				return err
			}
			if err := b.Take(ctx, n, f); err != nil {
				return failed("read", "read %s: %w", f.cfg.URL, err)
			}
		}
		lineHeld += n
		return nil
	}
	for {
		line, err := readLine(br, f.cfg.MaxLineBytes, take)
		if err == nil && lineHeld == 0 { // a line within the reader's buffer: what parsing it copies
			err = take(int64(len(line)))
		}
		b.Done(f)
		if fe, ok := errors.AsType[*followError](err); ok {
			return fe
		}
		if err != nil {
			if ctx.Err() != nil && !idle.Stop() {
				return failed("idle", "no line from %s for %s", f.cfg.URL, f.cfg.IdleTimeout)
			}
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF // a feed does not end
			}
			return failed("read", "read %s: %w", f.cfg.URL, err)
		}
		idle.Reset(f.cfg.IdleTimeout)
		l, err := ParseLine(line)
		if err != nil {
			return failed("decode", "%s after offset %d: %w", f.cfg.URL, max(last, after), err)
		}
		if l.Heartbeat != nil {
			f.seen(l.Heartbeat.HighWatermark)
		} else {
			if l.Offset <= max(last, f.checkpoint.Load()) {
				return failed("decode", "%s sent offset %d after %d: offsets must grow", f.cfg.URL, l.Offset, max(last, after))
			}
			ev := l.Event()
			if fe := f.cfg.Limits.CheckEvent(ev.NativeID, ev.Variant, ev.Type, ev.Payload, ev.Metadata); fe != nil {
				err := fmt.Errorf("offset %d (native id %.64q) refused: %w", l.Offset, ev.NativeID, fe)
				f.log.Error("feed: an event is over the limits every intake stores events under; refused, the feed goes on", "err", err)
				f.cfg.Metrics.refused(f.cfg.Name)
				refused = append(refused, err)
			} else {
				batch = append(batch, ev)
				batchHeld, lineHeld = batchHeld+lineHeld, 0
			}
			last = l.Offset
			f.seen(last)
		}
		b.Give(lineHeld)
		lineHeld = 0
		// Store what was read when the batch is full or nothing more is
		// waiting: batches grow with the feed's rate.
		if last > f.checkpoint.Load() && (len(batch) >= f.cfg.BatchSize || br.Buffered() == 0) {
			if err := flush(); err != nil {
				return err
			}
		}
	}
}

// store appends batch (perhaps empty), read up to the remote offset
// last, and then saves the checkpoint. refused are the events read with
// it that were over the limits: the first is recorded as the
// follower's last failure, with how many more there were.
func (f *Follower) store(ctx context.Context, batch []stream.Event, last int64, refused []error) error {
	type outcome struct {
		res []stream.AppendResult
		err error
	}
	var o outcome
	if len(batch) > 0 {
		done := make(chan outcome, 1)
		if err := f.cfg.Writer.AppendAsync(ctx, f.cfg.Stream, batch, func(res []stream.AppendResult, err error) {
			done <- outcome{res, err}
		}); err != nil {
			return failed("append", "append to %s: %w", f.cfg.Stream, err)
		}
		select {
		case o = <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if o.err != nil {
		return failed("append", "append to %s: %w", f.cfg.Stream, o.err)
	}
	var stored, dups int
	for i, r := range o.res {
		switch {
		case r.Err != nil:
			// Another event holds this identity here, or the backend
			// cannot hold this one: appending again changes nothing.
			// It is counted and logged, and the feed goes on.
			f.cfg.Metrics.fail(f.cfg.Name, "refused")
			f.log.Error("feed: event refused by the local stream; skipped", "native_id", batch[i].NativeID, "variant", batch[i].Variant, "err", r.Err)
		case r.Duplicate:
			dups++
		default:
			stored++
		}
	}
	f.cfg.Metrics.events(f.cfg.Name, stored, dups)
	if err := f.cfg.Checkpoints.Save(ctx, f.cfg.Name, last); err != nil {
		return failed("checkpoint", "save checkpoint %d: %w", last, err)
	}
	f.checkpoint.Store(last)
	f.observe()
	if fr, ok := f.cfg.Checkpoints.(FailureRecorder); ok && len(refused) > 0 {
		err := refused[0]
		if n := len(refused) - 1; n > 0 {
			err = fmt.Errorf("%w (and %d more events refused)", err, n)
		}
		if err := fr.Failed(ctx, f.cfg.Name, last, err); err != nil && ctx.Err() == nil {
			f.log.Warn("feed: recording the refused events failed", "err", err)
		}
	}
	return nil
}

// seen records a remote high watermark.
func (f *Follower) seen(hw int64) {
	for {
		old := f.remoteHW.Load()
		if hw <= old || f.remoteHW.CompareAndSwap(old, hw) {
			break
		}
	}
	f.observe()
}

func (f *Follower) observe() {
	f.cfg.Metrics.position(f.cfg.Name, f.checkpoint.Load(), f.Lag())
}

// readLine returns the next line without its newline; the slice is valid
// until the next call. A line longer than the reader's buffer is copied
// into one of its own, with take called for its bytes before they are.
func readLine(br *bufio.Reader, maxBytes int, take func(n int64) error) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err == nil {
		return line[:len(line)-1], nil
	}
	if !errors.Is(err, bufio.ErrBufferFull) {
		return nil, err
	}
	if err := take(int64(len(line))); err != nil {
		return nil, err
	}
	long := append([]byte(nil), line...)
	for {
		line, err = br.ReadSlice('\n')
		if len(long)+len(line) > maxBytes {
			return nil, fmt.Errorf("a line longer than %d bytes", maxBytes)
		}
		if err := take(int64(len(line))); err != nil {
			return nil, err
		}
		long = append(long, line...)
		if err == nil {
			return long[:len(long)-1], nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return nil, err
		}
	}
}
