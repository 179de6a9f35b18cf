package delivery

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/stream"
)

// What became of a stream event in one subscription (EventDelivery.Status).
const (
	// DeliveryItem: the subscription made an item of the event.
	DeliveryItem = "item"
	// DeliveryUnread: the subscription takes the event and has not read
	// it yet (its loop is behind, or it is paused).
	DeliveryUnread = "unread"
	// DeliveryNone: the subscription takes the event but holds no item of
	// it: it started after the event, or retention deleted the item.
	DeliveryNone = "none"
)

// EventDelivery is what one subscription made of one stream event.
type EventDelivery struct {
	Subscription    string
	SubscriptionUID string
	Inbox           string
	// Deleted says the subscription that made the item was deleted (a
	// subscription of its name now may be another one).
	Deleted bool
	// Paused says an operator paused the subscription's delivery: its
	// item waits until it is resumed.
	Paused   bool
	Status   string // DeliveryItem, DeliveryUnread or DeliveryNone
	Reason   string // why there is no item, for people; "" with one
	Item     *Item  // nil unless Status is DeliveryItem
	Attempts []Attempt
}

// itemUIDs is a recursive common table expression, uids(uid): the uid of
// every subscription that holds items, deleted ones too, and a NULL
// after the last. It walks the index of UNIQUE (subscription_uid, offset),
// one step a subscription, instead of scanning the items.
const itemUIDs = `WITH RECURSIVE uids(uid) AS (
	SELECT min(subscription_uid) FROM inbox_items
	UNION ALL
	SELECT (SELECT min(subscription_uid) FROM inbox_items WHERE subscription_uid > uids.uid) FROM uids WHERE uids.uid IS NOT NULL
) `

// itemSubscriptionsSQL selects the uid of every subscription that holds
// items and the inbox of each (a subscription fills one inbox).
const itemSubscriptionsSQL = itemUIDs + `SELECT uid, (SELECT inbox_id FROM inbox_items WHERE subscription_uid = uids.uid LIMIT 1)
	FROM uids WHERE uid IS NOT NULL`

// itemSubscription is a subscription that holds items: its uid and inbox.
type itemSubscription struct{ uid, inbox string }

// itemSubscriptions returns the subscriptions that hold items, of inbox
// alone unless it is "", by uid.
func (d *Delivery) itemSubscriptions(ctx context.Context, inbox string) ([]itemSubscription, error) {
	rows, err := d.db.QueryContext(ctx, itemSubscriptionsSQL)
	if err != nil {
		return nil, fmt.Errorf("subscriptions of items: %w", err)
	}
	defer rows.Close()
	var out []itemSubscription
	for rows.Next() {
		var s itemSubscription
		if err := rows.Scan(&s.uid, &s.inbox); err != nil {
			return nil, fmt.Errorf("subscriptions of items: %w", err)
		}
		if inbox == "" || s.inbox == inbox {
			out = append(out, s)
		}
	}
	return out, rows.Err()
}

// eventItemsSQL selects the items of the event at an offset of a stream
// in every subscription that holds items, each by UNIQUE
// (subscription_uid, offset), and the uid of each item's subscription.
const eventItemsSQL = itemUIDs + `SELECT ` + itemColumns + `, subscription_uid FROM inbox_items
	WHERE subscription_uid IN (SELECT uid FROM uids WHERE uid IS NOT NULL) AND "offset" = ? AND stream_id = ?
	ORDER BY item_id`

// Deliveries returns what every subscription made of ev, an event of
// streamID: the items of it in the store, of deleted subscriptions too,
// with their attempt logs, and for each subscription of the stream that
// takes ev and holds no item of it, whether it has yet to read it. They
// come by subscription name, deleted ones after the live one of their
// name. The items are found through the subscriptions that hold items,
// each by UNIQUE (subscription_uid, offset) (eventItemsSQL): no index of
// the items by event is kept for it, so writing an item costs one B-tree
// less.
func (d *Delivery) Deliveries(ctx context.Context, streamID string, ev *stream.StoredEvent) ([]EventDelivery, error) {
	rows, err := d.db.QueryContext(ctx, eventItemsSQL, ev.Offset, streamID)
	if err != nil {
		return nil, fmt.Errorf("deliveries of %s/%d: %w", streamID, ev.Offset, err)
	}
	uids := map[int64]string{}
	var uid string
	items, err := scanItemsWith(rows, []any{&uid}, func(it *Item) { uids[it.ID] = uid })
	if err != nil {
		return nil, fmt.Errorf("deliveries of %s/%d: %w", streamID, ev.Offset, err)
	}
	subs, err := d.Subscriptions(ctx)
	if err != nil {
		return nil, err
	}
	byUID := map[string]Subscription{}
	for _, s := range subs {
		byUID[s.UID] = s
	}
	attempts, err := d.attemptsOf(ctx, items)
	if err != nil {
		return nil, err
	}
	out := make([]EventDelivery, 0, len(items))
	made := map[string]bool{}
	for i := range items {
		it := &items[i]
		uid := uids[it.ID]
		s, live := byUID[uid]
		made[uid] = true
		out = append(out, EventDelivery{Subscription: it.Subscription, SubscriptionUID: uid, Inbox: it.Inbox, Deleted: !live,
			Paused: !s.PausedAt.IsZero(), Status: DeliveryItem, Item: it, Attempts: attempts[it.ID]})
	}
	for _, s := range subs {
		if s.Stream != streamID || made[s.UID] || !newMatcher(s).match(ev) {
			continue
		}
		e := EventDelivery{Subscription: s.Name, SubscriptionUID: s.UID, Inbox: s.Inbox, Paused: !s.PausedAt.IsZero(), Status: DeliveryNone}
		if (s.Start.Policy == stream.StartLatest || s.Start.Policy == "") && s.CreatedAt.After(ev.StoredAt) {
			e.Reason = "the subscription started after this event"
			out = append(out, e)
			continue
		}
		next, found, err := d.position(ctx, s.UID)
		switch {
		case err != nil:
			return nil, err
		case !found || next <= ev.Offset:
			e.Status, e.Reason = DeliveryUnread, "the subscription has not read this event yet"
		default:
			e.Reason = "no item: the subscription started past this event, or retention deleted its item"
		}
		out = append(out, e)
	}
	slices.SortStableFunc(out, func(a, b EventDelivery) int {
		if c := strings.Compare(a.Subscription, b.Subscription); c != 0 {
			return c
		}
		return cmpBool(a.Deleted, b.Deleted)
	})
	return out, nil
}

// cmpBool orders false before true.
func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case !a:
		return -1
	}
	return 1
}

// attemptsOf returns the attempt logs of items, by item id, oldest first.
func (d *Delivery) attemptsOf(ctx context.Context, items []Item) (map[int64][]Attempt, error) {
	out := map[int64][]Attempt{}
	if len(items) == 0 {
		return out, nil
	}
	args := make([]any, len(items))
	for i, it := range items {
		args[i] = it.ID
	}
	rows, err := d.db.QueryContext(ctx, `SELECT attempt_id, item_id, inbox_id, attempt, attempted_at, endpoint_url, status_code,
		latency_us, error, response_excerpt FROM delivery_attempts WHERE item_id IN (?`+strings.Repeat(`, ?`, len(items)-1)+`)
		ORDER BY item_id, attempt_id`, args...)
	if err != nil {
		return nil, fmt.Errorf("attempts: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		a, err := scanAttempt(rows)
		if err != nil {
			return nil, err
		}
		out[a.Item] = append(out[a.Item], a)
	}
	return out, rows.Err()
}

// scanAttempt reads one row of the attempt log.
func scanAttempt(rows *sql.Rows) (Attempt, error) {
	var a Attempt
	var at string
	var latency int64
	var errText, excerpt sql.NullString
	if err := rows.Scan(&a.ID, &a.Item, &a.Inbox, &a.Number, &at, &a.URL, &a.Status, &latency, &errText, &excerpt); err != nil {
		return a, fmt.Errorf("read attempts: %w", err)
	}
	a.At, _ = sqlitedb.ParseTime(at)
	a.Latency = time.Duration(latency) * time.Microsecond
	a.Error, a.Excerpt = errText.String, excerpt.String
	return a, nil
}

// ItemQuery selects items of one inbox for Search. Its zero fields select
// every item.
type ItemQuery struct {
	Inbox   string
	EventID string // the source's id of the event: an event_id, an idempotency key
	Type    string
	State   string
	// Since and Until select the items created (materialised) at or
	// after Since and before Until.
	Since, Until time.Time
	// Before selects the items after the item of that id in the order of
	// Search: the last item of the previous page. With State (and no
	// EventID) the order is by id alone.
	Before int64
	Limit  int

	uid string // byCreated: the subscription whose items searchSQL selects
}

// DefaultSearchLimit is the limit of a Search asked for 0 items.
const DefaultSearchLimit = 100

// SearchScan bounds how many items of one state a Search with a state
// and a type or time range reads for one page (the other filters are
// checked on each): a page of such a search may hold fewer items than
// its limit, and say where to go on.
const SearchScan = 10000

// searchScan is SearchScan, which tests lower.
var searchScan = SearchScan

// Search returns up to q.Limit items of q.Inbox that q selects, newest
// first (by creation time, then id; with a state, by id), and the Before
// of the next page (0: there is none). Each filter has its index: an
// event id inbox_items_by_native_id, a type inbox_items_by_type, a state
// inbox_items_by_state; a state with a type or a time range reads at
// most SearchScan items of that state per page. A time range alone (or
// no filter) reads inbox_items_by_created (subscription uid, time, item)
// of each subscription that filled the inbox (one, unless it was deleted
// and made again), up to q.Limit items each, and merges them.
func (d *Delivery) Search(ctx context.Context, q ItemQuery) ([]Item, int64, error) {
	var created string
	if q.Before > 0 {
		err := d.db.QueryRowContext(ctx, `SELECT created_at FROM inbox_items WHERE item_id = ? AND inbox_id = ?`, q.Before, q.Inbox).Scan(&created)
		if errors.Is(err, sql.ErrNoRows) {
			return nil, 0, errorf(ErrInvalid, "before %d: no item of that id in inbox %q", q.Before, q.Inbox)
		}
		if err != nil {
			return nil, 0, fmt.Errorf("search %s: %w", q.Inbox, err)
		}
	}
	q.Limit = cmp.Or(q.Limit, DefaultSearchLimit)
	var items []Item
	if byCreated(q) {
		var err error
		if items, err = d.searchByCreated(ctx, q, created); err != nil {
			return nil, 0, err
		}
	} else {
		query, args := searchSQL(q, created)
		rows, err := d.db.QueryContext(ctx, query, args...)
		if err != nil {
			return nil, 0, fmt.Errorf("search %s: %w", q.Inbox, err)
		}
		if items, err = scanItems(rows); err != nil {
			return nil, 0, err
		}
	}
	if len(items) == q.Limit {
		return items, items[len(items)-1].ID, nil
	}
	if !scansState(q) {
		return items, 0, nil
	}
	// The page is not full: was it the scan's bound? Then the next page
	// goes on below the last item read.
	var lowest sql.NullInt64
	var n int
	bound, bargs := stateScanSQL(q)
	if err := d.db.QueryRowContext(ctx, `SELECT min(item_id), count(*) FROM (`+bound+`) AS scan`, bargs...).Scan(&lowest, &n); err != nil {
		return nil, 0, fmt.Errorf("search %s: %w", q.Inbox, err)
	}
	if n == searchScan && lowest.Valid {
		return items, lowest.Int64, nil
	}
	return items, 0, nil
}

// byCreated reports whether Search reads q's items by subscription and
// creation time: q selects by time alone, or not at all.
func byCreated(q ItemQuery) bool { return q.EventID == "" && q.Type == "" && q.State == "" }

// searchByCreated is Search of a q that byCreated: a page of each
// subscription that filled q.Inbox, merged newest first (by creation
// time, then id, as each comes), cut at q.Limit.
func (d *Delivery) searchByCreated(ctx context.Context, q ItemQuery, created string) ([]Item, error) {
	holders, err := d.itemSubscriptions(ctx, q.Inbox)
	if err != nil {
		return nil, fmt.Errorf("search %s: %w", q.Inbox, err)
	}
	var items []Item
	for _, h := range holders {
		q.uid = h.uid
		query, args := searchSQL(q, created)
		rows, err := d.db.QueryContext(ctx, query, args...)
		if err != nil {
			return nil, fmt.Errorf("search %s: %w", q.Inbox, err)
		}
		page, err := scanItems(rows)
		if err != nil {
			return nil, err
		}
		items = append(items, page...)
	}
	if len(holders) > 1 {
		slices.SortFunc(items, func(a, b Item) int {
			if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
				return c
			}
			return cmp.Compare(b.ID, a.ID)
		})
	}
	return items[:min(len(items), q.Limit)], nil
}

// scansState reports whether Search reads q's items of a state, by id,
// and checks a type or time range on each.
func scansState(q ItemQuery) bool {
	return q.State != "" && q.EventID == "" && (q.Type != "" || !q.Since.IsZero() || !q.Until.IsZero())
}

// stateScanSQL selects the ids of at most SearchScan items of q's state
// below q.Before, newest first: what one page of a search that
// scansState reads (an index-only range of inbox_items_by_state).
func stateScanSQL(q ItemQuery) (string, []any) {
	query, args := `SELECT item_id FROM inbox_items WHERE inbox_id = ? AND state = ?`, []any{q.Inbox, q.State}
	if q.Before > 0 {
		query, args = query+` AND item_id < ?`, append(args, q.Before)
	}
	return query + ` ORDER BY item_id DESC LIMIT ` + strconv.Itoa(searchScan), args
}

// searchSQL is the query of Search, and its arguments; created is the
// creation time of the item q.Before. Items come newest first by
// creation time, through the index of the filter given (with none, or a
// time range alone, those of the subscription q.uid through
// inbox_items_by_created); with a state
// (and no event id) by id instead, through inbox_items_by_state: the
// items of that state alone, or at most SearchScan of them, on each of
// which a type and a time range are checked.
func searchSQL(q ItemQuery, created string) (string, []any) {
	where := []string{`inbox_id = ?`}
	args := []any{q.Inbox}
	if byCreated(q) { // inbox_items_by_created: one subscription's items of the inbox
		where, args = []string{`subscription_uid = ?`, `inbox_id = ?`}, []any{q.uid, q.Inbox}
	}
	if scansState(q) {
		scan, sargs := stateScanSQL(q)
		where, args = []string{`item_id IN (` + scan + `)`}, sargs
	}
	if q.EventID != "" {
		where, args = append(where, `source_native_id = ?`), append(args, q.EventID)
	}
	if q.Type != "" {
		where, args = append(where, `event_type = ?`), append(args, q.Type)
	}
	if q.State != "" {
		where, args = append(where, `state = ?`), append(args, q.State)
	}
	if !q.Since.IsZero() {
		where, args = append(where, `created_at >= ?`), append(args, q.Since.UTC().Format(sqlitedb.Time))
	}
	if !q.Until.IsZero() {
		where, args = append(where, `created_at < ?`), append(args, q.Until.UTC().Format(sqlitedb.Time))
	}
	order := ` ORDER BY created_at DESC, item_id DESC`
	switch {
	case q.State != "" && q.EventID == "":
		order = ` ORDER BY item_id DESC`
		if q.Before > 0 && !scansState(q) {
			where, args = append(where, `item_id < ?`), append(args, q.Before)
		}
	case q.Before > 0:
		where, args = append(where, `(created_at, item_id) < (?, ?)`), append(args, created, q.Before)
	}
	limit := cmp.Or(q.Limit, DefaultSearchLimit)
	return itemSelect + ` WHERE ` + strings.Join(where, ` AND `) + order + ` LIMIT ?`, append(args, limit)
}
