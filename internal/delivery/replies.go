package delivery

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/postbox-events/postbox/internal/replyto"
	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/internal/stdwebhook"
	"github.com/postbox-events/postbox/retry"
)

// Replies. A runtime answers an item's event with a reply: postbox POSTs
// the reply's JSON body to the url of the event's delivery handle (the
// GitHub issue's comments, the Stripe object, a generic webhook's
// reply-to), with the headers and signing secret of the source's reply
// settings, and retries it as the workers retry an item: the server's
// backoff and MaxAttempts, Retry-After honoured, 410 Gone at once a dead
// letter. Each attempt is logged; a reply that used its attempts is
// failed, kept for an operator, who may send it again (RetryReply).
//
// A reply is stored once per (inbox, item, key): asking again with a key
// returns the reply the first ask made when the body is the same, and is
// refused (ErrConflict) when it is not. Replies live in the delivery
// store, so every process of a shared store sends them, each reply from
// one process at a time (its lease, taken with SKIP LOCKED on
// PostgreSQL).

// Reply states.
const (
	ReplyPending   = "pending"   // waiting for its next attempt, or in one
	ReplyCompleted = "completed" // the target answered 2xx
	ReplyFailed    = "failed"    // a dead letter: its attempts are used, or the target refused it for good
)

// Reply is an answer to an item's event, sent to its delivery handle.
type Reply struct {
	ID            int64
	Inbox         string
	Item          int64
	Key           string
	Source        string // the item's stream, whose reply settings the reply is sent with
	Kind          string // the kind of the item's delivery handle
	URL           string
	Body          json.RawMessage
	State         string
	Attempts      int
	NextAttemptAt time.Time // when pending
	LastError     string
	CreatedAt     time.Time
	UpdatedAt     time.Time
	Log           []Attempt // the attempt log, oldest first
}

// Bounds of a reply.
const (
	maxReplyKey  = 200
	MaxReplyBody = 1 << 20 // bytes of a reply's JSON body
)

// ReplySettings returns the reply settings of source; the server reads
// them from the source's settings. Nil: replies carry no credentials.
type ReplySettings func(ctx context.Context, source string) (replyto.Settings, error)

// ReplyKey returns the key a reply without one is stored under: a digest
// of its body, so that asking twice with one body makes one reply.
func ReplyKey(body []byte) string {
	sum := sha256.Sum256(body)
	return "sha256:" + hex.EncodeToString(sum[:16])
}

// Reply stores a reply to item id of inbox, under key (ReplyKey(body)
// when empty), to be sent to the url of the item's delivery handle. It
// returns the reply and whether this call made it: a reply stored before
// under key with the same body is returned as it is. ErrNotFound: no
// such item; ErrInvalid: a bad key or body, or a handle a reply cannot
// go to (none, a device's, no url, a url the target policy refuses);
// ErrConflict: the key holds a reply with another body.
func (d *Delivery) Reply(ctx context.Context, inbox string, id int64, key string, body json.RawMessage) (Reply, bool, error) {
	body = bytes.TrimSpace(body)
	switch {
	case len(body) == 0:
		return Reply{}, false, errorf(ErrInvalid, "body: required: the JSON the reply sends")
	case len(body) > MaxReplyBody:
		return Reply{}, false, errorf(ErrInvalid, "body: %d bytes, at most %d", len(body), MaxReplyBody)
	case !json.Valid(body):
		return Reply{}, false, errorf(ErrInvalid, "body: not valid JSON")
	}
	var compact bytes.Buffer
	json.Compact(&compact, body)
	body = compact.Bytes()
	if key == "" {
		key = ReplyKey(body)
	}
	if len(key) > maxReplyKey || !utf8.ValidString(key) || strings.ContainsAny(key, "\x00\r\n") || key == "." || key == ".." {
		return Reply{}, false, errorf(ErrInvalid, "key: at most %d bytes of UTF-8, no line breaks, not . or ..", maxReplyKey)
	}
	// A reply stored under the key is the answer, whatever changed since.
	if r, err := d.reply(ctx, inbox, id, key); err == nil {
		if !bytes.Equal(r.Body, body) {
			return r, false, errorf(ErrConflict, "key %q: item %d has a reply under this key with another body (give another key for another reply)", key, id)
		}
		return r, false, nil
	} else if !errors.Is(err, ErrNotFound) {
		return r, false, err
	}
	it, err := d.Item(ctx, inbox, id)
	if err != nil {
		return Reply{}, false, err
	}
	h, err := replyto.Parse(replyto.Of(it.DeliveryHandle, it.Metadata))
	if err != nil {
		return Reply{}, false, errorf(ErrInvalid, "item %d: cannot reply: %v", id, err)
	}
	url, err := replyto.Target(h)
	if err != nil {
		return Reply{}, false, errorf(ErrInvalid, "item %d: cannot reply: %s", id, strings.TrimPrefix(err.Error(), replyto.ErrNoURL.Error()+": "))
	}
	if err := d.cfg.checkTarget(url); err != nil {
		return Reply{}, false, errorf(ErrInvalid, "item %d: cannot reply to its handle's url: %v", id, err)
	}
	set, err := d.replySettings(ctx, it.Stream)
	if err != nil {
		return Reply{}, false, err
	}
	if err := set.Allows(h.Kind, url); err != nil {
		return Reply{}, false, errorf(ErrInvalid, "item %d: cannot reply: %v", id, err)
	}
	now := d.now().UTC().Truncate(time.Microsecond).Format(sqlitedb.Time)
	var made bool
	err = d.update(ctx, func(tx conn) error {
		res, err := tx.ExecContext(ctx, `INSERT INTO replies (inbox_id, item_id, reply_key, source_id, handle_kind, url, body, state,
			attempts, next_attempt_at, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, 'pending', 0, ?, ?, ?)
			ON CONFLICT (item_id, inbox_id, reply_key) DO NOTHING`, inbox, id, key, it.Stream, h.Kind, url, string(body), now, now, now)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		made = n == 1
		return err
	})
	if err != nil {
		return Reply{}, false, fmt.Errorf("reply to item %d: %w", id, err)
	}
	r, err := d.reply(ctx, inbox, id, key)
	if err != nil {
		return r, false, err
	}
	if !made && !bytes.Equal(r.Body, body) {
		return r, false, errorf(ErrConflict, "key %q: item %d has a reply under this key with another body (give another key for another reply)", key, id)
	}
	if made {
		d.log.Info("delivery: reply stored", "inbox", inbox, "item", id, "key", key, "source", it.Stream, "url", url)
		d.inboxes.notify(repliesWake)
	}
	return r, made, nil
}

// repliesWake is the notifier key that wakes the reply loop: no inbox is
// named so.
const repliesWake = "\x00replies"

const replyColumns = `reply_id, inbox_id, item_id, reply_key, source_id, handle_kind, url, body, state, attempts,
	next_attempt_at, last_error, created_at, updated_at`

func scanReplies(rows *sql.Rows) ([]Reply, error) {
	defer rows.Close()
	out := []Reply{}
	for rows.Next() {
		var r Reply
		var body, next, created, updated string
		var last sql.NullString
		if err := rows.Scan(&r.ID, &r.Inbox, &r.Item, &r.Key, &r.Source, &r.Kind, &r.URL, &body, &r.State, &r.Attempts, &next,
			&last, &created, &updated); err != nil {
			return nil, err
		}
		r.Body, r.LastError = json.RawMessage(body), last.String
		r.CreatedAt, _ = sqlitedb.ParseTime(created)
		r.UpdatedAt, _ = sqlitedb.ParseTime(updated)
		if r.State == ReplyPending {
			r.NextAttemptAt, _ = sqlitedb.ParseTime(next)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// reply returns the reply of (inbox, item, key) with its attempt log.
func (d *Delivery) reply(ctx context.Context, inbox string, item int64, key string) (Reply, error) {
	rows, err := d.db.QueryContext(ctx, `SELECT `+replyColumns+` FROM replies WHERE inbox_id = ? AND item_id = ? AND reply_key = ?`,
		inbox, item, key)
	if err != nil {
		return Reply{}, fmt.Errorf("reply %q of item %d: %w", key, item, err)
	}
	rs, err := scanReplies(rows)
	if err != nil {
		return Reply{}, fmt.Errorf("reply %q of item %d: %w", key, item, err)
	}
	if len(rs) == 0 {
		return Reply{}, errorf(ErrNotFound, "item %d of inbox %q has no reply %q", item, inbox, key)
	}
	if err := d.replyLog(ctx, rs); err != nil {
		return Reply{}, err
	}
	return rs[0], nil
}

// Replies returns the replies to item id of inbox, oldest first, with
// their attempt logs; ErrNotFound when the inbox has no such item.
func (d *Delivery) Replies(ctx context.Context, inbox string, id int64) ([]Reply, error) {
	if _, err := d.Item(ctx, inbox, id); err != nil {
		return nil, err
	}
	rows, err := d.db.QueryContext(ctx, `SELECT `+replyColumns+` FROM replies WHERE inbox_id = ? AND item_id = ? ORDER BY reply_id`, inbox, id)
	if err != nil {
		return nil, fmt.Errorf("replies of item %d: %w", id, err)
	}
	rs, err := scanReplies(rows)
	if err != nil {
		return nil, fmt.Errorf("replies of item %d: %w", id, err)
	}
	return rs, d.replyLog(ctx, rs)
}

// replyLog reads the attempt log of each of rs.
func (d *Delivery) replyLog(ctx context.Context, rs []Reply) error {
	for i := range rs {
		rows, err := d.db.QueryContext(ctx, `SELECT a.attempt_id, r.item_id, r.inbox_id, a.attempt, a.attempted_at, a.endpoint_url,
			a.status_code, a.latency_us, a.error, a.response_excerpt FROM reply_attempts a JOIN replies r ON r.reply_id = a.reply_id
			WHERE a.reply_id = ? ORDER BY a.attempt_id`, rs[i].ID)
		if err != nil {
			return fmt.Errorf("attempts of reply %d: %w", rs[i].ID, err)
		}
		rs[i].Log = []Attempt{}
		for rows.Next() {
			a, err := scanAttempt(rows)
			if err != nil {
				rows.Close()
				return fmt.Errorf("reply %d: %w", rs[i].ID, err)
			}
			rs[i].Log = append(rs[i].Log, a)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("attempts of reply %d: %w", rs[i].ID, err)
		}
	}
	return nil
}

// RetryReply sends a failed reply again, with a fresh count of attempts;
// ErrInvalidState unless it is failed.
func (d *Delivery) RetryReply(ctx context.Context, inbox string, item int64, key string) (Reply, error) {
	r, err := d.reply(ctx, inbox, item, key)
	if err != nil {
		return r, err
	}
	now := d.now().UTC().Truncate(time.Microsecond).Format(sqlitedb.Time)
	var n int64
	err = d.update(ctx, func(tx conn) error {
		res, err := tx.ExecContext(ctx, `UPDATE replies SET state = 'pending', attempts = 0, next_attempt_at = ?, lease_token = NULL,
			lease_expires_at = NULL, updated_at = ? WHERE reply_id = ? AND state = 'failed'`, now, now, r.ID)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return r, fmt.Errorf("retry reply %q of item %d: %w", key, item, err)
	}
	if n == 0 {
		return r, errorf(ErrInvalidState, "reply %q of item %d is %s: only a failed reply is sent again", key, item, r.State)
	}
	d.log.Info("delivery: failed reply sent again", "inbox", inbox, "item", item, "key", key)
	d.inboxes.notify(repliesWake)
	return d.reply(ctx, inbox, item, key)
}

// replyWorkers is how many replies a process sends at once.
const replyWorkers = 8

// replySettleTimeout bounds the recording of a reply's attempt.
const replySettleTimeout = 30 * time.Second

// runReplies sends the due replies until ctx ends: it leases them as
// workers are free, sends each with its source's reply settings, and
// settles it with its attempt. It looks when a reply is stored or sent
// again here, and every idleLook for those due later or stored by another
// process. A slow target holds one worker, not the others.
func (d *Delivery) runReplies(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	busy := make(chan struct{}, replyWorkers) // a token per reply in flight
	freed := make(chan struct{}, 1)
	for ctx.Err() == nil {
		wake := d.inboxes.channel(repliesWake)
		free := replyWorkers - len(busy)
		if free == 0 {
			select {
			case <-freed:
			case <-ctx.Done():
			}
			continue
		}
		rs, token, err := d.leaseReplies(ctx, free)
		if err != nil {
			if ctx.Err() == nil {
				d.log.Error("delivery: leasing replies failed; retrying", "err", err)
				sleep(ctx, retryDelay)
			}
			continue
		}
		for _, r := range rs {
			busy <- struct{}{}
			wg.Go(func() {
				defer func() {
					<-busy
					select {
					case freed <- struct{}{}:
					default:
					}
				}()
				d.sendReply(ctx, r, token)
			})
		}
		if len(rs) == free {
			continue // more may be due
		}
		t := time.NewTimer(idleLook)
		select {
		case <-wake:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
}

// leaseReplies takes up to n due replies: pending, due, and not leased by
// a process whose lease has not expired.
func (d *Delivery) leaseReplies(ctx context.Context, n int) (_ []Reply, token string, _ error) {
	now := d.now().UTC()
	at := now.Truncate(time.Microsecond).Format(sqlitedb.Time)
	// The lease outlasts the attempt and its settle, however slow.
	until := now.Add(d.cfg.HandlerTimeout + replySettleTimeout + 10*time.Second).Format(sqlitedb.Time)
	token = newToken()
	skip := ``
	if d.pg {
		skip = ` FOR UPDATE SKIP LOCKED`
	}
	var rs []Reply
	err := d.update(ctx, func(tx conn) error {
		rows, err := tx.QueryContext(ctx, `UPDATE replies SET lease_token = ?1, lease_expires_at = ?2, attempts = attempts + 1, updated_at = ?3
			WHERE reply_id IN (SELECT reply_id FROM replies WHERE state = 'pending' AND next_attempt_at <= ?3
				AND (lease_expires_at IS NULL OR lease_expires_at <= ?3) ORDER BY next_attempt_at LIMIT ?4`+skip+`)
			RETURNING `+replyColumns, token, until, at, n)
		if err != nil {
			return err
		}
		rs, err = scanReplies(rows)
		return err
	})
	return rs, token, err
}

// sendReply makes one attempt of r, leased under token, and settles it.
func (d *Delivery) sendReply(ctx context.Context, r Reply, token string) {
	ep := d.defaultEndpoint(r.URL)
	rec := &Attempt{Item: r.Item, Inbox: r.Inbox, Number: r.Attempts, At: d.now().UTC().Truncate(time.Microsecond), URL: r.URL}
	start := time.Now()
	hctx, cancel := context.WithTimeout(ctx, ep.timeout)
	err := d.postReply(hctx, r, rec)
	cancel()
	if err != nil && ctx.Err() != nil { // stopping: the attempt is cut short, and not counted
		hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), replySettleTimeout)
		defer cancel()
		if err := d.update(hctx, func(tx conn) error {
			_, err := tx.ExecContext(hctx, `UPDATE replies SET lease_token = NULL, lease_expires_at = NULL, attempts = attempts - 1
				WHERE reply_id = ? AND lease_token = ?`, r.ID, token)
			return err
		}); err != nil {
			d.log.Warn("delivery: handing back a reply cut short failed; it is sent again when its lease expires", "inbox", r.Inbox,
				"item", r.Item, "key", r.Key, "err", err)
		}
		return
	}
	rec.Latency = time.Since(start)
	state, next := ReplyCompleted, time.Time{}
	if err != nil {
		rec.Error = truncate(err.Error(), 1000)
		o := retry.Classify(err)
		state = ReplyFailed
		if !o.Permanent && r.Attempts < ep.maxAttempts {
			state, next = ReplyPending, d.now().Add(d.delay(ep, min(o.After, ep.most))(r.Attempts))
		}
	}
	sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), replySettleTimeout)
	defer scancel()
	if serr := d.settleReply(sctx, r.ID, token, state, next, rec); serr != nil {
		d.log.Error("delivery: recording a reply's attempt failed; it is sent again when its lease expires", "inbox", r.Inbox,
			"item", r.Item, "key", r.Key, "err", serr)
		return
	}
	d.cfg.Metrics.replied(state)
	at := []any{"inbox", r.Inbox, "item", r.Item, "key", r.Key, "source", r.Source, "url", r.URL, "attempt", r.Attempts}
	switch state {
	case ReplyCompleted:
		d.log.Info("delivery: reply sent", append(at, "status", rec.Status, "took", rec.Latency)...)
	case ReplyPending:
		d.log.Warn("delivery: reply attempt failed; retry scheduled", append(at, "err", err, "next_attempt_at", next)...)
		if wait := next.Sub(d.now()); wait < idleLook {
			time.AfterFunc(wait, func() { d.inboxes.notify(repliesWake) })
		}
	case ReplyFailed:
		d.log.Error("delivery: reply attempt failed; the reply is a dead letter", append(at, "err", err)...)
	}
}

// replySettings returns the reply settings of source.
func (d *Delivery) replySettings(ctx context.Context, source string) (replyto.Settings, error) {
	if d.cfg.ReplySettings == nil {
		return replyto.Settings{}, nil
	}
	set, err := d.cfg.ReplySettings(ctx, source)
	if err != nil {
		return set, fmt.Errorf("reply settings of source %s: %w", source, err)
	}
	return set, nil
}

// postReply POSTs r's body to its url with its source's reply settings:
// their headers (env:NAME read now), when they may go there, and, with a
// signing secret, a Standard Webhooks signature whose webhook-id is
// reply_ID.
func (d *Delivery) postReply(ctx context.Context, r Reply, rec *Attempt) error {
	set, err := d.replySettings(ctx, r.Source)
	if err != nil {
		return err
	}
	if err := set.Allows(r.Kind, r.URL); err != nil {
		return retry.Permanent(err) // the settings changed since the reply was stored
	}
	h, err := set.Header(d.cfg.LookupEnv)
	if err != nil {
		return err // the operator may set the variable: retried
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.URL, bytes.NewReader(r.Body))
	if err != nil {
		return retry.Permanent(fmt.Errorf("reply url %s: %w", r.URL, err))
	}
	for name, values := range h {
		req.Header[name] = values
	}
	id := "reply_" + strconv.FormatInt(r.ID, 10)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "postbox")
	req.Header.Set("Idempotency-Key", id)
	if set.SigningSecret != "" {
		key, err := stdwebhook.ParseSecret(set.SigningSecret)
		if err != nil {
			return retry.Permanent(fmt.Errorf("reply settings of source %s: signing_secret: %w", r.Source, err))
		}
		sign(req.Header, [][]byte{key}, id, rec.At, r.Body)
	}
	_, err = d.exchange(req, rec)
	return err
}

// settleReply records the attempt rec of reply id under lease token and
// its new state; ErrLeaseLost when the lease is no longer its.
func (d *Delivery) settleReply(ctx context.Context, id int64, token, state string, next time.Time, rec *Attempt) error {
	now := d.now().UTC().Truncate(time.Microsecond).Format(sqlitedb.Time)
	due := now
	if !next.IsZero() {
		due = next.UTC().Truncate(time.Microsecond).Format(sqlitedb.Time)
	}
	return d.update(ctx, func(tx conn) error {
		res, err := tx.ExecContext(ctx, `UPDATE replies SET state = ?, next_attempt_at = ?, last_error = ?, lease_token = NULL,
			lease_expires_at = NULL, updated_at = ? WHERE reply_id = ? AND lease_token = ?`, state, due, nullString(rec.Error), now, id, token)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return errors.Join(err, ErrLeaseLost)
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO reply_attempts (reply_id, attempt, attempted_at, endpoint_url, status_code, latency_us,
			error, response_excerpt) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`, id, rec.Number, rec.At.Format(sqlitedb.Time), rec.URL, rec.Status,
			rec.Latency.Microseconds(), nullString(rec.Error), nullString(rec.Excerpt))
		return err
	})
}

// deleteReplies deletes the replies to the items gone, with their attempt
// log, in the transaction that deletes the items: an item id SQLite gives
// again after its item is deleted starts with none.
func deleteReplies(ctx context.Context, tx conn, gone []move) error {
	if err := execIn(ctx, tx, `DELETE FROM reply_attempts WHERE reply_id IN (SELECT reply_id FROM replies WHERE item_id IN (%s))`, gone); err != nil {
		return err
	}
	return execIn(ctx, tx, `DELETE FROM replies WHERE item_id IN (%s)`, gone)
}
