package delivery

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/postbox-events/postbox/internal/forwarded"
	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/stream"
)

// Ordered delivery per key. A subscription with an OrderBy gives each of
// its items a key, computed from the item's event when the item is made
// and stored with it (order_key). The items of one key are leased one at
// a time, in offset order, by the push workers and by runtimes alike: a
// lease takes an item of a key only when no other item of the key is
// processing and no earlier one is pending (waiting its turn, for a
// retry, or until a scheduled time) or, under OnDeadLetterBlock, failed.
// Items of other keys, and of unordered subscriptions, go on at full
// concurrency. See orderFree for the statement and why it holds on a
// shared store.

// What a dead letter of a key does to the items of the key after it
// (Subscription.OnDeadLetter).
const (
	// OnDeadLetterBlock: they wait until an operator replays or discards
	// the dead letter. The default.
	OnDeadLetterBlock = "block"
	// OnDeadLetterSkip: the next item of the key goes; the dead letter
	// stays, listed with the others.
	OnDeadLetterSkip = "skip"
)

// Forms of Subscription.OrderBy besides a JSON pointer into the payload
// ("/order/id").
const (
	OrderByDevice       = "device_id"  // the metadata's device_id: a device's events
	OrderBySession      = "session_id" // the metadata's session_id
	orderByMetadata     = "metadata."  // + NAME: a field of the event's metadata
	orderByHeader       = "header."    // + NAME: a header the webhook arrived with
	maxOrderByLen       = 256
	maxOrderKeyLen      = 200 // longer keys are stored as a digest
	orderKeyDigestLabel = "sha256:"
)

// validOrderBy checks the OrderBy of a subscription.
func validOrderBy(s string) error {
	const want = "want device_id, session_id, metadata.NAME, header.NAME or a JSON pointer into the payload such as /order/id"
	switch {
	case len(s) > maxOrderByLen:
		return errorf(ErrInvalid, "order_by: %d bytes, at most %d", len(s), maxOrderByLen)
	case s == OrderByDevice, s == OrderBySession:
		return nil
	case strings.HasPrefix(s, orderByMetadata):
		if s == orderByMetadata {
			return errorf(ErrInvalid, "order_by %q: metadata. needs a field name (metadata.tenant)", s)
		}
		return nil
	case strings.HasPrefix(s, orderByHeader):
		name := s[len(orderByHeader):]
		if name == "" || strings.IndexFunc(name, func(r rune) bool { return !isTokenChar(r) }) >= 0 {
			return errorf(ErrInvalid, "order_by %q: header. needs a header name (header.x-shopify-shop-domain)", s)
		}
		if !keptHeader(name) {
			return errorf(ErrInvalid, "order_by %q: a webhook's metadata keeps only the headers postbox forwards to targets "+
				"(X-GitHub-*, X-Shopify-Shop-Domain, X-Request-Id, … docs/API.md, Workers) and Content-Type, User-Agent, "+
				"X-Event-Type: %s is not kept, so every item would have the empty key; order by a JSON pointer into the payload "+
				"or a metadata field instead", s, name)
		}
		return nil
	case strings.HasPrefix(s, "/"):
		for i := 0; i < len(s); i++ {
			if s[i] == '~' && (i+1 == len(s) || (s[i+1] != '0' && s[i+1] != '1')) {
				return errorf(ErrInvalid, "order_by %q: a JSON pointer writes ~ as ~0 and / as ~1 (RFC 6901)", s)
			}
		}
		return nil
	}
	return errorf(ErrInvalid, "order_by %q: %s", s, want)
}

// keptHeader reports whether a webhook's header name (any case) is kept
// in its event's metadata by every source: the headers forwarded to
// targets, and those the intake keeps besides (a source's own key and
// type headers are kept too, but neither makes a key that orders).
func keptHeader(name string) bool {
	switch strings.ToLower(name) {
	case "content-type", "user-agent", "x-event-type":
		return true
	}
	return forwarded.Header(name)
}

// isTokenChar reports whether r may appear in an HTTP header name.
func isTokenChar(r rune) bool {
	return r < 127 && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", r))
}

// validOnDeadLetter checks a subscription's OnDeadLetter and fills its
// default.
func (s *Subscription) validOrdering() error {
	if s.OrderBy == "" {
		if s.OnDeadLetter != "" {
			return errorf(ErrInvalid, "on_dead_letter: only with order_by")
		}
		return nil
	}
	if err := validOrderBy(s.OrderBy); err != nil {
		return err
	}
	switch s.OnDeadLetter {
	case "":
		s.OnDeadLetter = OnDeadLetterBlock
	case OnDeadLetterBlock, OnDeadLetterSkip:
	default:
		return errorf(ErrInvalid, "on_dead_letter %q: want block or skip", s.OnDeadLetter)
	}
	return nil
}

// orderKey returns the key of ev's item in s as a bound argument: nil
// when s is not ordered. A key that is not there (no such field, a
// pointer that matches nothing, null) is the empty key: such items are
// ordered together. A string is its key; another value is keyed by its
// JSON text (so 42 and "42" are one key). Keys longer than
// maxOrderKeyLen are stored as a digest.
func (s *Subscription) orderKey(ev *stream.StoredEvent) any {
	if s.OrderBy == "" {
		return nil
	}
	var v json.RawMessage
	switch by := s.OrderBy; {
	case by == OrderByDevice, by == OrderBySession:
		v = jsonAt(ev.Metadata, by)
	case strings.HasPrefix(by, orderByMetadata):
		v = jsonAt(ev.Metadata, by[len(orderByMetadata):])
	case strings.HasPrefix(by, orderByHeader):
		v = jsonAt(jsonAt(ev.Metadata, "headers"), strings.ToLower(by[len(orderByHeader):]))
	default:
		v = ev.Payload
		for _, tok := range strings.Split(by[1:], "/") {
			if v = jsonAt(v, pointerUnescape.Replace(tok)); v == nil {
				break
			}
		}
	}
	key := keyText(v)
	if len(key) > maxOrderKeyLen {
		sum := sha256.Sum256([]byte(key))
		key = orderKeyDigestLabel + hex.EncodeToString(sum[:])
	}
	return key
}

// pointerUnescape turns a JSON pointer's reference token into the name
// it stands for (RFC 6901: ~1 is /, then ~0 is ~).
var pointerUnescape = strings.NewReplacer("~1", "/", "~0", "~")

// jsonAt returns the member name of the JSON object doc, or the element
// of index name of the JSON array doc; nil when there is none.
func jsonAt(doc json.RawMessage, name string) json.RawMessage {
	doc = bytes.TrimSpace(doc)
	if len(doc) == 0 {
		return nil
	}
	switch doc[0] {
	case '{':
		var m map[string]json.RawMessage
		if json.Unmarshal(doc, &m) != nil {
			return nil
		}
		return m[name]
	case '[':
		i, err := strconv.Atoi(name)
		if err != nil || i < 0 || name != strconv.Itoa(i) {
			return nil
		}
		var a []json.RawMessage
		if json.Unmarshal(doc, &a) != nil || i >= len(a) {
			return nil
		}
		return a[i]
	}
	return nil
}

// keyText is the key of the JSON value v: a string's text, "" for none
// or null, else v's compact JSON.
func keyText(v json.RawMessage) string {
	v = bytes.TrimSpace(v)
	if len(v) == 0 || string(v) == "null" {
		return ""
	}
	if v[0] == '"' {
		var s string
		if json.Unmarshal(v, &s) == nil {
			return s
		}
	}
	var b bytes.Buffer
	if json.Compact(&b, v) != nil {
		return string(v)
	}
	return b.String()
}

// orderFree ends the WHERE of a lease's choice of items (written over
// inbox_items, unaliased, of inbox ?4): an item of an ordered
// subscription is taken only when the item before it of its key (by
// offset) is completed, or failed in a subscription that skips dead
// letters, or there is none; no other item of its key is processing; and
// no earlier one that an operator replayed is pending. The last is a
// step back in inbox_items_by_order_key and a read of that row, the
// others seeks in inbox_items_processing_by_key and
// inbox_items_replayed_by_key, small indexes of the items under way and
// of replayed ones that wait: no index a lease or an ack writes holds
// more than those. The seek of the items under way comes first: it turns
// away at the least cost the items behind a key at work.
//
// Items of a key complete in offset order, so the item before is the
// last of the key not yet completed when it is not completed itself:
// only the first unfinished item of a key passes, one statement takes at
// most one item of a key, and while it is processing the key's next
// waits. Only an operator's replay (of a completed item, or of a dead
// letter under skip) makes an item pending again behind completed ones:
// such an item has replays > 0, and holds back the pending items of its
// key after it until it completed again, through the second check.
//
// On PostgreSQL, where leases of several processes run at once under
// READ COMMITTED, the statement sees the items as they were when it
// started (its snapshot) and locks the rows it takes with FOR UPDATE SKIP
// LOCKED, re-reading each (EvalPlanQual) before it takes it: a row that
// another lease took meanwhile is locked (skipped) or no longer pending
// (dropped). Two leases L1 and L2 that take items A < B of one key:
// L2 found B's predecessor completed and no replayed item before B
// pending, so A was not pending in L2's snapshot (the items before a
// completed one are completed, unless replayed); L1 found A pending and
// B not processing. A became pending between the two snapshots, and only
// an operator's replay makes an item before a completed one pending: a
// race of a few milliseconds, documented. Every other interleaving has
// one lease find the other's row locked, re-read it as processing, or see
// it processing or pending in its snapshot: a lease of B that commits
// before L1's snapshot shows B processing to L1; one that commits after
// it found A completed, and A completed before L1's snapshot is not
// pending in it. No lock is held beyond the lease's own transaction, and
// none per key.
const orderFree = ` AND (order_key IS NULL OR (
	NOT EXISTS (SELECT 1 FROM inbox_items k WHERE k.subscription_uid = inbox_items.subscription_uid
		AND k.order_key = inbox_items.order_key AND k.state = 'processing' AND k.item_id <> inbox_items.item_id)
	AND NOT EXISTS (SELECT 1 FROM inbox_items k WHERE k.subscription_uid = inbox_items.subscription_uid
		AND k.order_key = inbox_items.order_key AND k.replays > 0 AND k.state = 'pending' AND k."offset" < inbox_items."offset")
	AND coalesce((SELECT k.state = 'completed' OR k.state = 'failed' AND k.subscription_uid IN
			(SELECT subscription_uid FROM subscriptions WHERE inbox_id = ?4 AND on_dead_letter = 'skip')
		FROM inbox_items k WHERE k.subscription_uid = inbox_items.subscription_uid AND k.order_key = inbox_items.order_key
			AND k."offset" < inbox_items."offset"
		ORDER BY k."offset" DESC LIMIT 1), TRUE)))`

// setOnDeadLetter stores the OnDeadLetter of s and wakes its inbox: under
// skip, keys that waited behind a dead letter go on. A lease reads it from
// the store at each statement.
func (d *Delivery) setOnDeadLetter(ctx context.Context, s Subscription) error {
	err := d.update(ctx, func(tx conn) error {
		_, err := tx.ExecContext(ctx, `UPDATE subscriptions SET on_dead_letter = ? WHERE subscription_uid = ?`, s.OnDeadLetter, s.UID)
		return err
	})
	if err != nil {
		return fmt.Errorf("update subscription %s: %w", s.Name, err)
	}
	d.broadcast(ctx, "subs")
	d.inboxes.notify(s.Inbox)
	d.log.Info("delivery: subscription on_dead_letter set", "subscription", s.Name, "on_dead_letter", s.OnDeadLetter)
	return nil
}

// Held is what holds back the keys of an ordered subscription.
type Held struct {
	// Keys is how many keys have items waiting behind an earlier item of
	// theirs that failed: one waiting for a retry, or a dead letter
	// (OnDeadLetterBlock).
	Keys int64
	// Oldest is when the oldest item waiting behind such an item was
	// made; zero when none waits.
	Oldest time.Time
}

// Held reports what holds back the keys of s (zero for an unordered
// subscription). It reads the dead letters of s and the pending items of
// its inbox, and for each that failed a step of inbox_items_by_order_key:
// for the API, when asked, not for delivery.
func (d *Delivery) Held(ctx context.Context, s Subscription) (Held, error) {
	var h Held
	if s.OrderBy == "" {
		return h, nil
	}
	// On SQLite, +subscription_uid keeps the planner off the order key
	// index (every item of the subscription, completed ones too): the
	// heads are read from the dead letters and from the inbox's pending
	// items.
	sub := `+h.subscription_uid`
	if d.pg {
		sub = `h.subscription_uid`
	}
	head := func(where string) string {
		return `SELECT h.order_key, (SELECT CASE WHEN w.state = 'pending' THEN w.created_at END FROM inbox_items w
			WHERE w.subscription_uid = h.subscription_uid AND w.order_key = h.order_key AND w."offset" > h."offset"
			ORDER BY w."offset" LIMIT 1) AS waiting
		FROM inbox_items h WHERE ` + where + ` AND ` + sub + ` = ?2`
	}
	heads := head(`h.inbox_id = ?1 AND h.state = 'pending' AND h.attempts > 0 AND h.next_attempt_at > ?3`)
	if s.OnDeadLetter != OnDeadLetterSkip {
		heads += ` UNION ALL ` + head(`h.state = 'failed'`)
	}
	var oldest *string
	err := d.db.QueryRowContext(ctx, `SELECT count(DISTINCT order_key), min(waiting) FROM (`+heads+`) AS held WHERE waiting IS NOT NULL`,
		s.Inbox, s.UID, d.now().UTC().Format(sqlitedb.Time)).Scan(&h.Keys, &oldest)
	if err != nil {
		return h, fmt.Errorf("held keys of %s: %w", s.Name, err)
	}
	if oldest != nil {
		h.Oldest, _ = sqlitedb.ParseTime(*oldest)
	}
	return h, nil
}
