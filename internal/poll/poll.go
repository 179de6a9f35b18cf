// Package poll is postbox's REST poller: a source of kind poll asks a
// JSON HTTP API for pages of items and stores each item once in its
// stream, under the item's id.
//
// JSON pointers (RFC 6901) pick the array of items in an answer, each
// item's id, type and time, and the cursor of the next page, which goes
// back as a query parameter. A page's events and the checkpoint that
// follows it (the next cursor, the last event's time, the last poll and
// its error) are handed to a Sink together: on postbox's SQLite store they
// commit in one transaction; elsewhere the events first, then the
// checkpoint. Either way a crash makes the poller ask for a page again at
// worst, never skip one: the stream stores an id it holds as a duplicate.
//
// A failed request, a 429 or 503 (waiting as its Retry-After says,
// bounded) and a page the sink could not store are retried with backoff
// and jitter from the same cursor; the error is recorded in the
// checkpoint. While the writer's queue has no room for a page, the poller
// waits (postbox_poll_saturated).
package poll

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/internal/budget"
	"github.com/postbox-events/postbox/internal/jsonenc"
	"github.com/postbox-events/postbox/internal/redirect"
	"github.com/postbox-events/postbox/retry"
	"github.com/postbox-events/postbox/stream"
)

// Defaults of Config.
const (
	DefaultMinBackoff    = 500 * time.Millisecond
	DefaultMaxBackoff    = time.Minute
	DefaultMaxRetryAfter = 10 * time.Minute
	DefaultMaxPageBytes  = 64 << 20
	DefaultTimeout       = 30 * time.Second
)

// Checkpoint is how far a poller has read: the cursor of the next page
// ("" for the first), the time of the last item stored, when it last
// polled and how that failed ("" after a success).
type Checkpoint struct {
	Cursor      string
	LastEventAt time.Time
	LastError   string
	LastPollAt  time.Time
}

// Sink stores what a poller read.
type Sink interface {
	// Commit appends events (none: only the checkpoint) to the source's
	// stream and records cp as its checkpoint, cp no earlier than the
	// events. It returns each event's result once both are durable, or an
	// error: then the events may be stored (and are asked for again and
	// stored as duplicates) but the checkpoint is not.
	Commit(ctx context.Context, events []stream.Event, cp Checkpoint) ([]stream.AppendResult, error)
	// Full reports whether the writer's queue has no room for n events.
	Full(n int) bool
}

// Config configures a Poller.
type Config struct {
	// Name is the source's name, in metrics and logs. Required.
	Name     string
	Settings Settings // validated by New
	Sink     Sink     // required
	// Start is the checkpoint loaded at start.
	Start Checkpoint
	// Client sends the requests. Defaults to a client with a timeout of
	// DefaultTimeout per request, whose dialer calls Control. Either way
	// the poller follows redirects as Settings.Redirects says (a copy of
	// Client does), so its headers never go to another origin.
	Client *http.Client
	// Control, when set, is the default Client's dialer's Control: it
	// may refuse an address (the server's target policy).
	Control func(network, address string, c syscall.RawConn) error
	// MinBackoff and MaxBackoff bound the wait after a failure, doubled
	// after each, with jitter. Default to DefaultMinBackoff and
	// DefaultMaxBackoff.
	MinBackoff, MaxBackoff time.Duration
	// MaxRetryAfter bounds the wait a Retry-After asks for. Defaults to
	// DefaultMaxRetryAfter.
	MaxRetryAfter time.Duration
	// MaxPageBytes bounds one answer: a longer one is cut there and the
	// poll fails (reason too_large), naming the limit. Defaults to
	// DefaultMaxPageBytes, and to at most Budget's reserve.
	MaxPageBytes int64
	// Budget, when set, bounds the memory of the answers being read and
	// of the pages waiting to be stored, over every poller (and feed
	// follower) sharing it: an answer takes from it as its bytes arrive
	// and gives back once its page is stored.
	Budget *budget.Budget
	// Limits are those every intake path stores events under
	// (postbox.Limits.CheckEvent): an item over them is refused alone,
	// logged, counted (postbox_poll_items_total{result="refused"}) and
	// named in the page's checkpoint's LastError; the rest of its page is
	// stored.
	Limits postbox.Limits
	// LookupEnv reads env:NAME header values at each poll. Defaults to
	// os.LookupEnv.
	LookupEnv func(string) (string, bool)
	Metrics   *Metrics // nil: none
	Logger    *slog.Logger
	// Now defaults to time.Now.
	Now func() time.Time
}

// Poller polls one API into one source's stream. Run runs it.
type Poller struct {
	cfg      Config
	stored   pageSum // the answer stored last (Run's, passed to fetch)
	items    Pointer
	id, typ  Pointer
	at, next Pointer
	handle   []handleMember // Settings.Handle by name; none: no handle
	interval time.Duration
	log      *slog.Logger
	cp       Checkpoint
}

// New returns the poller of cfg.
func New(cfg Config) (*Poller, error) {
	if cfg.Name == "" || cfg.Sink == nil {
		return nil, errors.New("poll: Config.Name and Config.Sink are required")
	}
	if err := cfg.Settings.Validate(); err != nil {
		return nil, fmt.Errorf("poll %s: %w", cfg.Name, err)
	}
	s := cfg.Settings
	p := &Poller{cfg: cfg, cp: cfg.Start}
	p.items, _ = ParsePointer(*s.Items)
	p.id, _ = ParsePointer(s.ID)
	p.typ, _ = ParsePointer(s.Type)
	p.at, _ = ParsePointer(s.Time)
	p.next, _ = ParsePointer(s.Next)
	p.handle = handleMembers(s.Handle)
	p.interval, _ = s.interval()
	if p.cfg.Client == nil {
		p.cfg.Client = &http.Client{Timeout: DefaultTimeout, Transport: &http.Transport{
			Proxy:               http.ProxyFromEnvironment,
			DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second, Control: p.cfg.Control}).DialContext,
			TLSHandshakeTimeout: 10 * time.Second,
			MaxIdleConnsPerHost: 2,
		}}
	}
	p.cfg.Client = redirect.Client(p.cfg.Client, s.Redirects)
	if p.cfg.MinBackoff <= 0 {
		p.cfg.MinBackoff = DefaultMinBackoff
	}
	if p.cfg.MaxBackoff <= 0 {
		p.cfg.MaxBackoff = DefaultMaxBackoff
	}
	p.cfg.MaxBackoff = max(p.cfg.MaxBackoff, p.cfg.MinBackoff)
	if p.cfg.MaxRetryAfter <= 0 {
		p.cfg.MaxRetryAfter = DefaultMaxRetryAfter
	}
	if p.cfg.MaxPageBytes <= 0 {
		p.cfg.MaxPageBytes = DefaultMaxPageBytes
	}
	if r := p.cfg.Budget.Reserve(); r > 0 {
		p.cfg.MaxPageBytes = min(p.cfg.MaxPageBytes, r)
	}
	if p.cfg.LookupEnv == nil {
		p.cfg.LookupEnv = os.LookupEnv
	}
	if p.cfg.Logger == nil {
		p.cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if p.cfg.Now == nil {
		p.cfg.Now = time.Now
	}
	p.log = p.cfg.Logger.With("source", cfg.Name)
	return p, nil
}

// pollError is a failed poll, with the reason it is counted under and,
// for a 429 or 503, the wait its Retry-After asks for.
type pollError struct {
	reason string
	wait   time.Duration // 0: back off
	err    error
}

func (e *pollError) Error() string { return e.err.Error() }
func (e *pollError) Unwrap() error { return e.err }

func failed(reason string, format string, args ...any) *pollError {
	return &pollError{reason: reason, err: fmt.Errorf(format, args...)}
}

// page is one answer: its events and the next cursor ("" for none).
type page struct {
	events  []stream.Event
	refused []refusal // items over the limits, not in events
	next    string
	last    time.Time // the latest item time
	sum     pageSum   // the answer's bytes, hashed
	held    int64     // the budget the answer holds until stored
	same    bool      // the answer is the last one stored at its cursor: not decoded
}

// pageSum identifies an answer's bytes: the page stored last, with the
// cursor it was asked for with, is not decoded again while its answer
// stays the same.
type pageSum struct {
	cursor  string
	size    int
	hash    uint64 // maphash, with the process's seed
	refused string // what its items refused said (its checkpoint's LastError)
}

// hashSeed seeds the answers' hashes: an upstream cannot pick bytes
// that hash alike without it.
var hashSeed = maphash.MakeSeed()

// refusal is an item over the limits.
type refusal struct {
	item int // its index in the page
	id   string
	err  error
}

func (r refusal) Error() string {
	return fmt.Sprintf("item %d (id %.64q) refused: %v", r.item, r.id, r.err)
}

// refusedError sums up a page's refused items for its checkpoint.
func refusedError(url string, refused []refusal) string {
	if len(refused) == 0 {
		return ""
	}
	msg := fmt.Sprintf("GET %s: %v", url, refused[0])
	if n := len(refused) - 1; n > 0 {
		msg += fmt.Sprintf(" (and %d more items refused)", n)
	}
	return msg
}

// Run polls until ctx ends and returns nil then. A page is asked for
// again until it is stored: a failed request or store is retried from the
// same cursor, after backoff.
func (p *Poller) Run(ctx context.Context) error {
	bo := newBackoff(p.cfg.MinBackoff, p.cfg.MaxBackoff)
	expect := 1 // the events of the last page: the room waited for
	if p.cp.Cursor == "" {
		p.log.Info("poll: polling", "url", p.cfg.Settings.URL) // the first poll: no cursor yet
	} else {
		p.log.Info("poll: polling", "url", p.cfg.Settings.URL, "cursor", p.cp.Cursor)
	}
	var ahead *prefetch // the next page, asked for while the last one commits
	p.cfg.Metrics.start(p.cfg.Name)
	for {
		if !p.waitRoom(ctx, expect) {
			p.drop(ahead)
			return nil
		}
		var pg page
		var err error
		if ahead != nil && ahead.cursor == p.cp.Cursor {
			r := <-ahead.done
			pg, err = r.pg, r.err
		} else {
			p.drop(ahead)
			pg, err = p.fetch(ctx, p.cp.Cursor, p.stored)
		}
		ahead = nil
		if ctx.Err() != nil {
			p.cfg.Budget.Give(pg.held)
			return nil
		}
		if err != nil {
			pe, _ := errors.AsType[*pollError](err)
			p.cfg.Metrics.fail(p.cfg.Name, pe.reason)
			wait := pe.wait
			if wait == 0 {
				wait = bo.next()
			}
			at := []any{"err", err, "after", wait}
			if p.cp.Cursor != "" {
				at = append(at, "cursor", p.cp.Cursor)
			}
			p.log.Warn("poll: polling failed; asking again", at...)
			cp := p.cp
			cp.LastError, cp.LastPollAt = err.Error(), p.cfg.Now().UTC()
			if _, err := p.cfg.Sink.Commit(ctx, nil, cp); err == nil {
				p.cp = cp
			}
			if !sleep(ctx, wait) {
				return nil
			}
			continue
		}
		if pg.same {
			// The answer stored last, again: its items are stored (or
			// refused, as its checkpoint still says).
			p.cfg.Metrics.unchanged(p.cfg.Name)
			cp := p.cp
			cp.LastError, cp.LastPollAt = pg.sum.refused, p.cfg.Now().UTC()
			if !p.commit(ctx, pg, cp, bo) {
				return nil
			}
			p.cp = cp
			bo.reset()
			expect = 1
			if !sleep(ctx, p.interval) {
				return nil
			}
			continue
		}
		cp := p.cp
		cp.LastError, cp.LastPollAt = refusedError(p.cfg.Settings.URL, pg.refused), p.cfg.Now().UTC()
		pg.sum.refused = cp.LastError
		if pg.next != "" {
			cp.Cursor = pg.next
		}
		if pg.last.After(cp.LastEventAt) {
			cp.LastEventAt = pg.last
		}
		advanced := p.cp.Cursor != cp.Cursor
		if advanced && len(pg.events) > 0 {
			// Ask for the next page while this one commits: it is read
			// only, and stored (with its checkpoint) only after this one.
			ahead = p.prefetch(ctx, cp.Cursor)
		}
		if !p.commit(ctx, pg, cp, bo) {
			p.cfg.Budget.Give(pg.held)
			p.drop(ahead)
			return nil
		}
		p.cfg.Budget.Give(pg.held)
		p.stored = pg.sum
		p.cp = cp
		bo.reset()
		expect = max(1, len(pg.events))
		if advanced && len(pg.events) > 0 {
			continue // a next page may be waiting
		}
		if !sleep(ctx, p.interval) {
			return nil
		}
	}
}

// prefetch is a page asked for ahead, by cursor.
type prefetch struct {
	cursor string
	done   chan fetched // receives once, when the request is done
}

type fetched struct {
	pg  page
	err error
}

// prefetch asks for the page at cursor in a goroutine that ends with the
// request (bounded by the client's timeout and by ctx).
func (p *Poller) prefetch(ctx context.Context, cursor string) *prefetch {
	f := &prefetch{cursor: cursor, done: make(chan fetched, 1)}
	go func() {
		pg, err := p.fetch(ctx, cursor, pageSum{}) // a page not stored yet
		f.done <- fetched{pg, err}
	}()
	return f
}

// drop waits for a page asked for ahead that will not be used (nil:
// none) and gives back the budget it holds.
func (p *Poller) drop(f *prefetch) {
	if f != nil {
		p.cfg.Budget.Give((<-f.done).pg.held)
	}
}

// commit hands pg and cp to the sink until it takes them; false when ctx
// ended first.
func (p *Poller) commit(ctx context.Context, pg page, cp Checkpoint, bo *backoff) bool {
	for {
		res, err := p.cfg.Sink.Commit(ctx, pg.events, cp)
		if ctx.Err() != nil {
			return false
		}
		if err == nil {
			var stored, dups, conflicts int
			for i, r := range res {
				switch {
				case r.Err != nil:
					conflicts++
					p.log.Warn("poll: an item's id is stored with another type or body; the stored one stays", "id", pg.events[i].NativeID, "err", r.Err)
				case r.Duplicate:
					dups++
				default:
					stored++
				}
			}
			for _, r := range pg.refused {
				p.log.Warn("poll: an item is over the limits every intake stores events under; the rest of its page is stored", "err", r)
			}
			p.cfg.Metrics.page(p.cfg.Name, stored, dups, conflicts, len(pg.refused))
			return true
		}
		p.cfg.Metrics.fail(p.cfg.Name, "store")
		wait := bo.next()
		p.log.Error("poll: storing a page failed; storing it again", "err", err, "events", len(pg.events), "after", wait)
		if !sleep(ctx, wait) {
			return false
		}
	}
}

// waitRoom waits while the writer's queue has no room for n events,
// with the saturation metric set; false when ctx ended first.
func (p *Poller) waitRoom(ctx context.Context, n int) bool {
	if !p.cfg.Sink.Full(n) {
		return true
	}
	start := time.Now()
	p.cfg.Metrics.saturation(p.cfg.Name, true, 0)
	p.log.Debug("poll: the writer's queue is full; waiting", "events", n)
	wait := 5 * time.Millisecond
	for p.cfg.Sink.Full(n) {
		if !sleep(ctx, wait) {
			break
		}
		wait = min(2*wait, 200*time.Millisecond)
	}
	p.cfg.Metrics.saturation(p.cfg.Name, false, time.Since(start).Seconds())
	return ctx.Err() == nil
}

// fetch asks for the page after cursor and decodes it, unless its
// answer is stored, the one stored last at that cursor. The page holds
// budget (page.held) until the caller gives it back.
func (p *Poller) fetch(ctx context.Context, cursor string, stored pageSum) (page, error) {
	s := p.cfg.Settings
	target := s.URL
	if cursor != "" && s.CursorParam != "" {
		u, _ := url.Parse(s.URL) // validated
		q := u.Query()
		q.Set(s.CursorParam, cursor)
		u.RawQuery = q.Encode()
		target = u.String()
	}
	h, err := s.header(p.cfg.LookupEnv)
	if err != nil {
		return page{}, failed("header", "%w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return page{}, failed("request", "request %s: %w", s.URL, err)
	}
	req.Header = h
	if req.Header.Get("Accept") == "" {
		req.Header.Set("Accept", "application/json")
	}
	resp, err := p.cfg.Client.Do(req)
	if err != nil {
		return page{}, failed("request", "GET %s: %w", s.URL, stripURL(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		e := failed("throttled", "GET %s answered %s", s.URL, resp.Status)
		if d, ok := retry.ParseRetryAfter(resp.Header.Get("Retry-After"), p.cfg.Now(), p.cfg.MaxRetryAfter); ok {
			e.wait = max(d, time.Millisecond)
			e.err = fmt.Errorf("%w (Retry-After %s)", e.err, d)
		}
		return page{}, e
	}
	if resp.StatusCode/100 != 2 {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return page{}, failed("status", "GET %s answered %s: %s", s.URL, resp.Status, bytes.TrimSpace(body))
	}
	body, held, err := p.read(ctx, resp)
	if err != nil {
		return page{}, err
	}
	sum := pageSum{cursor: cursor, size: len(body), hash: maphash.Bytes(hashSeed, body)}
	if stored.size == sum.size && stored.hash == sum.hash && stored.cursor == cursor && stored.size > 0 {
		p.cfg.Budget.Give(held)
		return page{same: true, sum: stored}, nil
	}
	pg, err := p.decode(body)
	if err != nil {
		p.cfg.Budget.Give(held)
		return page{}, failed("decode", "GET %s (cursor %q): %w", s.URL, cursor, err)
	}
	pg.sum, pg.held = sum, held
	return pg, nil
}

// read reads an answer's body, taking budget as its bytes arrive, before
// its buffer grows to hold them (all at once for a Content-Length), and
// returns it with the budget it holds. An answer over MaxPageBytes fails
// there, its budget given back.
//
// An answer without a Content-Length is read into pooled chunks, then
// copied into one buffer of its size, each chunk's budget traded for the
// bytes copied from it: an answer cut at the limit leaves no garbage, and
// one read whole leaves none but its chunks, which the next answers
// reuse.
func (p *Poller) read(ctx context.Context, resp *http.Response) (body []byte, held int64, err error) {
	limit, b := p.cfg.MaxPageBytes, p.cfg.Budget
	tooLarge := func() error {
		return failed("too_large", "GET %s: an answer larger than %d bytes, the limit of one page; not read further", p.cfg.Settings.URL, limit)
	}
	if resp.ContentLength > limit {
		return nil, 0, tooLarge()
	}
	owner := new(byte) // this read, for the budget's reserve
	defer b.Done(owner)
	var chunks []*[]byte
	defer func() {
		for _, c := range chunks {
			if c != nil {
				chunkPool.Put(c)
			}
		}
	}()
	fail := func(e error) ([]byte, int64, error) {
		b.Give(held)
		return nil, 0, e
	}
	take := func(n int64) error {
		if err := b.Take(ctx, n, owner); err != nil {
			return failed("request", "read %s: %w", p.cfg.Settings.URL, err)
		}
		held += n
		return nil
	}
	if n := resp.ContentLength; n >= 0 { // the transport reads no more than it
		if err := take(n); err != nil {
			return fail(err)
		}
		body = make([]byte, n)
		if _, err := io.ReadFull(resp.Body, body); err != nil {
			return fail(failed("request", "read %s: %w", p.cfg.Settings.URL, stripURL(err)))
		}
		return body, held, nil
	}
	var size int64 // bytes in chunks; all full but the last
	for {
		if size >= limit {
			var one [1]byte
			if n, _ := io.ReadFull(resp.Body, one[:]); n > 0 {
				return fail(tooLarge())
			}
			break // it ended at the limit
		}
		if size == int64(len(chunks))*chunkSize {
			if err := take(chunkSize); err != nil {
				return fail(err)
			}
			chunks = append(chunks, chunkPool.Get().(*[]byte))
		}
		c := *chunks[len(chunks)-1]
		off := size - int64(len(chunks)-1)*chunkSize
		n, err := resp.Body.Read(c[off:min(int64(len(c)), off+limit-size)])
		size += int64(n)
		if err == io.EOF {
			break
		}
		if err != nil {
			return fail(failed("request", "read %s: %w", p.cfg.Settings.URL, stripURL(err)))
		}
	}
	// One buffer of the answer's size; its pages are touched (and held)
	// as each chunk is copied into it and given back.
	body = make([]byte, 0, size)
	for i, c := range chunks {
		body = append(body, (*c)[:min(chunkSize, size-int64(i)*chunkSize)]...)
		chunkPool.Put(c)
		chunks[i] = nil
	}
	b.Give(held - size) // what the last chunk did not fill
	return body, size, nil
}

// chunkSize is the size of the pooled chunks an answer without a
// Content-Length is read into.
const chunkSize = 256 << 10

var chunkPool = sync.Pool{New: func() any { c := make([]byte, chunkSize); return &c }}

// decode reads a page's items and next cursor. The answer is validated
// once; its items and their members are then found by scanning it,
// without decoding (scan.go).
func (p *Poller) decode(body []byte) (page, error) {
	var pg page
	if !json.Valid(body) {
		return pg, errors.New("the answer is not JSON")
	}
	if !utf8.Valid(body) {
		return pg, errors.New("the answer is not valid UTF-8 (JSON text is UTF-8)")
	}
	raw, ok, err := p.items.Find(body)
	if err != nil {
		return pg, err
	}
	if ok && raw[0] != '[' && !bytes.Equal(raw, []byte("null")) {
		return pg, fmt.Errorf("items %q: not an array", p.items)
	}
	if p.next.tokens != nil {
		v, ok, err := p.next.Find(body)
		if err != nil {
			return pg, err
		}
		if ok {
			if pg.next, err = scalar(v); err != nil {
				return pg, fmt.Errorf("next %q: %w", p.next, err)
			}
		}
	}
	if !ok {
		return pg, nil // no items
	}
	now := p.cfg.Now().UTC()
	n := 0
	eachElement(raw, func([]byte) { n++ })
	pg.events = make([]stream.Event, 0, n)
	i := -1
	eachElement(raw, func(it []byte) {
		if i++; err != nil {
			return
		}
		var ev stream.Event
		if ev, err = p.event(it, now); err != nil {
			err = fmt.Errorf("item %d: %w", i, err)
			return
		}
		if fe := p.cfg.Limits.CheckEvent(ev.NativeID, "", ev.Type, ev.Payload, nil); fe != nil {
			pg.refused = append(pg.refused, refusal{item: i, id: ev.NativeID, err: fe})
			return
		}
		pg.events = append(pg.events, ev)
		if ev.OccurredAt.After(pg.last) {
			pg.last = ev.OccurredAt
		}
	})
	return pg, err
}

// event makes the event of one item (valid JSON). Its payload is the
// item's bytes as the API sent them.
func (p *Poller) event(item []byte, now time.Time) (stream.Event, error) {
	if len(item) == 0 || item[0] != '{' {
		return stream.Event{}, errors.New("not a JSON object")
	}
	// The pointers of one token (the common case) are members of the
	// item: one scan finds them all.
	var id, typ, at []byte
	var idOK, typOK, atOK bool
	one := func(ptr Pointer) string {
		if len(ptr.tokens) == 1 {
			return ptr.tokens[0]
		}
		return "\x00" // never a key: found by Find below
	}
	idKey, typKey, atKey := one(p.id), one(p.typ), one(p.at)
	eachMember(item, func(key, val []byte) bool {
		switch {
		case !idOK && keyIs(key, idKey):
			id, idOK = val, true
		case !typOK && keyIs(key, typKey):
			typ, typOK = val, true
		case !atOK && p.at.tokens != nil && keyIs(key, atKey):
			at, atOK = val, true
		}
		return true
	})
	find := func(ptr Pointer, v []byte, ok bool) ([]byte, bool) {
		if len(ptr.tokens) == 1 || ptr.tokens == nil {
			return v, ok
		}
		v, ok, _ = ptr.Find(item)
		return v, ok
	}
	id, idOK = find(p.id, id, idOK)
	typ, typOK = find(p.typ, typ, typOK)
	at, atOK = find(p.at, at, atOK)
	ev := stream.Event{Payload: item, OccurredAt: now}
	if !idOK {
		return ev, fmt.Errorf("no id at %q", p.id)
	}
	var err error
	if ev.NativeID, err = scalar(id); err != nil || ev.NativeID == "" {
		return ev, fmt.Errorf("id at %q: want a string or a number", p.id)
	}
	if !typOK {
		return ev, fmt.Errorf("id %.64s: no type at %q", ev.NativeID, p.typ)
	}
	if ev.Type, typOK = unquote(typ); !typOK || ev.Type == "" {
		return ev, fmt.Errorf("id %.64s: type at %q: want a string", ev.NativeID, p.typ)
	}
	if atOK && !bytes.Equal(at, []byte("null")) {
		t, err := parseTime(at)
		if err != nil {
			return ev, fmt.Errorf("id %.64s: time at %q: %w", ev.NativeID, p.at, err)
		}
		ev.OccurredAt = t
	}
	if p.handle != nil {
		ev.DeliveryHandle = handleOf(p.handle, item)
	}
	return ev, nil
}

// handleMember is a member of a poll source's delivery handle: its name
// as a JSON string, and where each item holds its value.
type handleMember struct {
	name []byte
	ptr  Pointer
}

// handleMembers returns Settings.Handle (validated) in name order; nil
// for none.
func handleMembers(h map[string]string) []handleMember {
	if len(h) == 0 {
		return nil
	}
	names := slices.Sorted(maps.Keys(h))
	out := make([]handleMember, 0, len(names))
	for _, name := range names {
		ptr, _ := ParsePointer(h[name])
		out = append(out, handleMember{name: jsonenc.AppendString(nil, name), ptr: ptr})
	}
	return out
}

// maxHandleMember bounds the value a handle's member takes from an item:
// a handle is stored with every event and sent in a header with every
// push.
const maxHandleMember = 1024

// handleOf returns the delivery handle of item (valid JSON):
// {"kind":"poll"} and each member whose pointer finds a value other than
// null of at most maxHandleMember bytes, compact; nil when none does.
func handleOf(members []handleMember, item []byte) json.RawMessage {
	var b []byte
	for _, m := range members {
		v, ok, _ := m.ptr.Find(item)
		v = bytes.TrimSpace(v)
		if !ok || len(v) == 0 || len(v) > maxHandleMember || bytes.Equal(v, []byte("null")) {
			continue
		}
		if b == nil {
			b = append(make([]byte, 0, 64+len(v)), `{"kind":"poll"`...)
		}
		b = append(b, ',')
		b = append(b, m.name...)
		b = append(b, ':')
		b = append(b, v...)
	}
	if b == nil {
		return nil
	}
	b = append(b, '}')
	var c bytes.Buffer
	if json.Compact(&c, b) != nil {
		return nil // the item is valid JSON: not reached
	}
	return c.Bytes()
}

// scalar returns a JSON string's text or a number's digits; "" for null.
func scalar(v json.RawMessage) (string, error) {
	v = bytes.TrimSpace(v)
	switch {
	case len(v) == 0 || bytes.Equal(v, []byte("null")):
		return "", nil
	case v[0] == '"':
		s, ok := unquote(v)
		if !ok {
			return "", errors.New("not a JSON string")
		}
		return s, nil
	case v[0] == '-' || (v[0] >= '0' && v[0] <= '9'):
		return string(v), nil
	}
	return "", errors.New("want a string or a number")
}

// parseTime reads an RFC 3339 string, or seconds (milliseconds above
// 1e12) since 1970.
func parseTime(v json.RawMessage) (time.Time, error) {
	if len(v) > 0 && v[0] == '"' {
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			return time.Time{}, err
		}
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return time.Time{}, errors.New("want an RFC 3339 time such as 2026-01-02T15:04:05Z, or a number of seconds since 1970")
		}
		return t.UTC(), nil
	}
	f, err := strconv.ParseFloat(string(v), 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
		return time.Time{}, errors.New("want an RFC 3339 time, or a number of seconds since 1970")
	}
	if f > 1e12 {
		f /= 1000
	}
	sec, frac := math.Modf(f)
	return time.Unix(int64(sec), int64(frac*1e9)).UTC(), nil
}

// stripURL keeps a request error's cause without the URL, which may
// hold a cursor (and the caller names the URL without it).
func stripURL(err error) error {
	if ue, ok := errors.AsType[*url.Error](err); ok {
		return ue.Err
	}
	return err
}

// sleep waits d; false when ctx ended first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Checkpoint returns the checkpoint the poller is at (for tests, before
// Run or after it returned).
func (p *Poller) Checkpoint() Checkpoint { return p.cp }
