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
			return errorf(ErrInvalid, "order_by %q: header. needs a header name (header.x-shop-id)", s)
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
			if v = jsonAt(v, strings.NewReplacer("~1", "/", "~0", "~").Replace(tok)); v == nil {
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
// subscription is taken only when no other item of its key is
// processing, no earlier one is pending, and no earlier one failed unless
// its subscription skips dead letters. Each NOT EXISTS is one seek of
// inbox_items_by_order_key (state <> 'completed' lets the planner use
// that partial index); the first is the one that turns away the items
// behind the first of their key. Only the first unfinished item of a key
// passes, so one statement takes at most one item of a key, and while it
// is processing the key's next waits.
//
// On PostgreSQL, where leases of several processes run at once under
// READ COMMITTED, the statement sees the items as they were when it
// started (its snapshot) and locks the rows it takes with FOR UPDATE SKIP
// LOCKED, re-reading each (EvalPlanQual) before it takes it: a row that
// another lease took meanwhile is locked (skipped) or no longer pending
// (dropped). Two leases L1 and L2 that take items A < B of one key would
// need B free in L2's snapshot, so A not pending there, and A pending in
// L1's: A became pending after L2's snapshot and before L1's. Ways into
// pending are a nack or expired lease of A (then A was processing, and B
// was not free for L2), the materialisation of A (offsets of a
// subscription are made in order, by its one loop: A, earlier, was made
// first) and an operator's replay of A after it completed or failed. Only
// the last can race, and only within the few milliseconds between two
// statements' snapshots; the replayed item then goes out beside B rather
// than after it. Every other interleaving either finds the other lease's
// row locked, re-reads it as processing, or sees it processing in its
// snapshot. No lock is held beyond the lease's own transaction.
const orderFree = ` AND (order_key IS NULL OR (
	NOT EXISTS (SELECT 1 FROM inbox_items k WHERE k.subscription_uid = inbox_items.subscription_uid
		AND k.order_key = inbox_items.order_key AND k.state = 'pending' AND k."offset" < inbox_items."offset" AND k.state <> 'completed')
	AND NOT EXISTS (SELECT 1 FROM inbox_items k WHERE k.subscription_uid = inbox_items.subscription_uid
		AND k.order_key = inbox_items.order_key AND k.state = 'processing' AND k.item_id <> inbox_items.item_id AND k.state <> 'completed')
	AND (NOT EXISTS (SELECT 1 FROM inbox_items k WHERE k.subscription_uid = inbox_items.subscription_uid
			AND k.order_key = inbox_items.order_key AND k.state = 'failed' AND k."offset" < inbox_items."offset" AND k.state <> 'completed')
		OR inbox_items.subscription_uid IN (SELECT subscription_uid FROM subscriptions WHERE inbox_id = ?4 AND on_dead_letter = 'skip'))))`

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

// Held reports what holds back the keys of subscription uid (zero for an
// unordered one). It reads the subscription's dead letters and the
// pending items of its inbox: asked for by the API and a scrape, not by
// delivery.
func (d *Delivery) Held(ctx context.Context, s Subscription) (Held, error) {
	var h Held
	if s.OrderBy == "" {
		return h, nil
	}
	var oldest *string
	err := d.db.QueryRowContext(ctx, `SELECT count(DISTINCT order_key), min(waiting) FROM (
		SELECT h.order_key, (SELECT w.created_at FROM inbox_items w WHERE w.subscription_uid = h.subscription_uid
			AND w.order_key = h.order_key AND w.state = 'pending' AND w.state <> 'completed' AND w."offset" > h."offset" ORDER BY w."offset" LIMIT 1) AS waiting
		FROM inbox_items h WHERE h.inbox_id = ?1 AND h.subscription_uid = ?2 AND h.order_key IS NOT NULL
			AND ((h.state = 'failed' AND ?3) OR (h.state = 'pending' AND h.attempts > 0 AND h.next_attempt_at > ?4))) AS held
		WHERE waiting IS NOT NULL`, s.Inbox, s.UID, s.OnDeadLetter != OnDeadLetterSkip, d.now().UTC().Format(sqlitedb.Time)).Scan(&h.Keys, &oldest)
	if err != nil {
		return h, fmt.Errorf("held keys of %s: %w", s.Name, err)
	}
	if oldest != nil {
		h.Oldest, _ = sqlitedb.ParseTime(*oldest)
	}
	return h, nil
}
