package outboxtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/outbox"
)

// StoreFeatures declares where a store differs from the others; the zero
// value is a store that deletes delivered rows. Every store hands out the
// same Message: the event's payload as Body and its other fields beside
// it.
type StoreFeatures struct {
	// KeepsDelivered: an ACKed row stays, listed as outbox.StateDelivered
	// until retention deletes it (the transactional outbox, so that an
	// operator can look a delivered event up), instead of being deleted.
	KeepsDelivered bool
	// CompactsPayload: the store keeps a payload compacted (insignificant
	// whitespace removed, as postbox's control plane keeps it) and every
	// other byte as inserted: key order, repeated keys, escapes, numbers.
	// Without it a payload comes back byte for byte.
	CompactsPayload bool
}

// Store is one empty outbox opened for a check.
type Store struct {
	Store outbox.Store
	Admin outbox.Admin
	// Insert commits events to the outbox, the way its users write them,
	// and fails the test if that fails. The events are valid and have ids.
	Insert func(t *testing.T, events ...outbox.Event)
}

// NewStore opens an empty outbox for one check, and closes it (stopping
// whatever it started) when t ends. A Notifier must be notifying by the
// time NewStore returns.
type NewStore func(t *testing.T) Store

// testTimeout bounds each check.
const testTimeout = 30 * time.Second

// RunStore runs the store suite as subtests of t.
func RunStore(t *testing.T, f StoreFeatures, newStore NewStore) {
	for _, c := range []struct {
		name string
		run  func(*storeHarness)
	}{
		{"due_in_seq_order_after_and_limit", testDueOrder},
		{"ack_removes_the_row", testAck},
		{"retry_counts_the_attempt_and_waits", testRetry},
		{"outage_counts_no_attempt", testOutage},
		{"reject_then_requeue", testRejectRequeue},
		{"rows_and_drop", testRowsDrop},
		{"answered_outcomes_recorded_twice_count_once", testSettleTwice},
		{"oldest_pending", testOldestPending},
		{"claimer_never_hands_a_row_out_twice", testClaims},
		{"extender_keeps_a_live_relays_claims", testExtend},
		{"notifier_fires_on_insert_and_requeue", testNotify},
		{"payload_kept_byte_for_byte", testPayloadBytes},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			c.run(&storeHarness{T: t, ctx: ctx, f: f, s: newStore(t)})
		})
	}
}

type storeHarness struct {
	*testing.T
	ctx context.Context
	f   StoreFeatures
	s   Store
}

// event returns the i-th event of a check; odd ones carry a trace
// context, the first of them with a tracestate.
func event(i int) outbox.Event {
	id := fmt.Sprintf("evt-%03d", i)
	e := outbox.Event{ID: id, Type: "order.created", Payload: json.RawMessage(`{"order":"` + id + `","n":` + fmt.Sprint(i) + `}`),
		CorrelationID: "corr-" + id, TenantID: "acme"}
	if i%2 == 1 {
		e.TraceParent = fmt.Sprintf("00-4bf92f3577b34da6a3ce929d0e0e%04x-00f067aa0ba902b7-01", i)
	}
	if i == 1 {
		e.TraceState = "vendor=v1"
	}
	return e
}

// insert inserts events 1..n and returns them.
func (h *storeHarness) insert(n int) []outbox.Event {
	h.Helper()
	evs := make([]outbox.Event, n)
	for i := range evs {
		evs[i] = event(i + 1)
	}
	h.s.Insert(h.T, slices.Clone(evs)...)
	return evs
}

func (h *storeHarness) due(now time.Time, after int64, limit int) []outbox.Message {
	h.Helper()
	msgs, err := h.s.Store.Due(h.ctx, now, after, limit)
	if err != nil {
		h.Fatalf("Due: %v", err)
	}
	return msgs
}

func (h *storeHarness) settle(outcomes ...outbox.Outcome) {
	h.Helper()
	if err := h.s.Store.Settle(h.ctx, outcomes); err != nil {
		h.Fatalf("Settle: %v", err)
	}
}

func (h *storeHarness) counts() (pending, rejected int64) {
	h.Helper()
	p, r, err := h.s.Admin.Counts(h.ctx)
	if err != nil {
		h.Fatalf("Counts: %v", err)
	}
	return p, r
}

func (h *storeHarness) wantCounts(pending, rejected int64) {
	h.Helper()
	if p, r := h.counts(); p != pending || r != rejected {
		h.Fatalf("Counts = %d pending, %d rejected; want %d, %d", p, r, pending, rejected)
	}
}

func (h *storeHarness) list(state string) []outbox.Row {
	h.Helper()
	rows, err := h.s.Admin.List(h.ctx, state, 100)
	if err != nil {
		h.Fatalf("List(%q): %v", state, err)
	}
	return rows
}

func ids[T any](xs []T, id func(T) string) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = id(x)
	}
	return out
}

func msgIDs(ms []outbox.Message) []string {
	return ids(ms, func(m outbox.Message) string { return m.EventID })
}
func rowIDs(rs []outbox.Row) []string { return ids(rs, func(r outbox.Row) string { return r.EventID }) }

func (h *storeHarness) wantIDs(what string, got []string, want ...string) {
	h.Helper()
	if !slices.Equal(got, want) && (len(got) != 0 || len(want) != 0) {
		h.Fatalf("%s: %q, want %q", what, got, want)
	}
}

// stored is payload as the store keeps it: the same bytes, or compacted.
func (h *storeHarness) stored(payload []byte) []byte {
	if h.f.CompactsPayload {
		return postbox.AppendCompact(nil, payload)
	}
	return payload
}

// checkMessage checks that m carries e: the payload as Body, byte for
// byte (h.stored), the other fields as the Message's, and a CreatedAt near now.
func (h *storeHarness) checkMessage(m outbox.Message, e outbox.Event) {
	h.Helper()
	if m.EventID != e.ID || m.Type != e.Type {
		h.Fatalf("message %q of type %q, want %q of type %q", m.EventID, m.Type, e.ID, e.Type)
	}
	if !bytes.Equal(m.Body, h.stored(e.Payload)) {
		h.Fatalf("message %s: Body %s, want the event's payload %s", m.EventID, m.Body, e.Payload)
	}
	if m.CorrelationID != e.CorrelationID || m.TenantID != e.TenantID {
		h.Fatalf("message %s: correlation id %q, tenant id %q; want %q, %q", m.EventID, m.CorrelationID, m.TenantID, e.CorrelationID, e.TenantID)
	}
	if m.SourceSeq != nil {
		h.Fatalf("message %s: source seq %d, but the event has none", m.EventID, *m.SourceSeq)
	}
	if m.TraceParent != e.TraceParent || m.TraceState != e.TraceState {
		h.Fatalf("message %s: traceparent %q, tracestate %q; want %q, %q", m.EventID, m.TraceParent, m.TraceState, e.TraceParent, e.TraceState)
	}
	if d := time.Since(m.CreatedAt); d < -time.Minute || d > time.Minute {
		h.Fatalf("message %s: CreatedAt %v, inserted just now", m.EventID, m.CreatedAt)
	}
}

// sameJSON reports whether a and b are the same JSON value: a publisher's
// receiver may keep a payload in another layout.
func sameJSON(a, b []byte) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && reflect.DeepEqual(x, y)
}

// outcome is the outcome the Relay would settle m with.
func outcome(m outbox.Message, kind outbox.OutcomeKind, err string, retryAt time.Time) outbox.Outcome {
	return outbox.Outcome{EventID: m.EventID, Seq: m.Seq, Kind: kind, Error: err, RetryAt: retryAt, Lease: m.Lease}
}

func testDueOrder(h *storeHarness) {
	evs := h.insert(5)
	first := h.due(time.Now(), 0, 2)
	h.wantIDs("Due(after 0, limit 2)", msgIDs(first), evs[0].ID, evs[1].ID)
	h.checkMessage(first[0], evs[0])
	h.checkMessage(first[1], evs[1])
	if first[0].Seq >= first[1].Seq || first[0].Seq <= 0 {
		h.Fatalf("Seq %d then %d: want positive and growing", first[0].Seq, first[1].Seq)
	}
	rest := h.due(time.Now(), first[1].Seq, 10)
	h.wantIDs("Due(after the second)", msgIDs(rest), evs[2].ID, evs[3].ID, evs[4].ID)
	for i, m := range rest {
		h.checkMessage(m, evs[i+2])
		if m.Attempts != 0 {
			h.Fatalf("message %s: %d attempts before any send", m.EventID, m.Attempts)
		}
		if m.Seq <= first[1].Seq || i > 0 && m.Seq <= rest[i-1].Seq {
			h.Fatalf("Seq %d out of order (%d before it)", m.Seq, first[1].Seq)
		}
	}
	if none := h.due(time.Now(), rest[2].Seq, 10); len(none) != 0 {
		h.Fatalf("Due after the last row: %q", msgIDs(none))
	}
	h.wantCounts(5, 0)
	rows := h.list(outbox.StatePending)
	h.wantIDs("List(pending)", rowIDs(rows), evs[0].ID, evs[1].ID, evs[2].ID, evs[3].ID, evs[4].ID)
	for i, r := range rows {
		e := evs[i]
		if !bytes.Equal(r.Payload, h.stored(e.Payload)) || r.CorrelationID != e.CorrelationID || r.TenantID != e.TenantID {
			h.Fatalf("listed row %s: payload %s, correlation id %q, tenant id %q; want %s, %q, %q",
				r.EventID, r.Payload, r.CorrelationID, r.TenantID, e.Payload, e.CorrelationID, e.TenantID)
		}
	}
}

func testAck(h *storeHarness) {
	evs := h.insert(2)
	msgs := h.due(time.Now(), 0, 10)
	h.wantIDs("Due", msgIDs(msgs), evs[0].ID, evs[1].ID)
	h.settle(outcome(msgs[0], outbox.Delivered, "", time.Time{}))
	h.wantCounts(1, 0)
	// An hour on, past any claim the store took: only the unsettled row.
	h.wantIDs("Due an hour later", msgIDs(h.due(time.Now().Add(time.Hour), 0, 10)), evs[1].ID)
	h.wantIDs("List(pending)", rowIDs(h.list(outbox.StatePending)), evs[1].ID)
	if h.f.KeepsDelivered {
		rows := h.list(outbox.StateDelivered)
		h.wantIDs("List(delivered)", rowIDs(rows), evs[0].ID)
		if rows[0].State != outbox.StateDelivered || rows[0].DeliveredAt == nil {
			h.Fatalf("delivered row: state %q, delivered at %v", rows[0].State, rows[0].DeliveredAt)
		}
	} else {
		h.wantIDs("List(all)", rowIDs(h.list("")), evs[1].ID)
	}
}

func testRetry(h *storeHarness) {
	evs := h.insert(1)
	msgs := h.due(time.Now(), 0, 10)
	h.wantIDs("Due", msgIDs(msgs), evs[0].ID)
	retryAt := time.Now().Add(time.Hour)
	h.settle(outcome(msgs[0], outbox.Retry, "unavailable: try later", retryAt))
	if got := h.due(time.Now(), 0, 10); len(got) != 0 {
		h.Fatalf("Due before the retry time: %q", msgIDs(got))
	}
	h.wantCounts(1, 0)
	rows := h.list(outbox.StatePending)
	h.wantIDs("List(pending)", rowIDs(rows), evs[0].ID)
	if rows[0].Attempts != 1 || rows[0].LastError != "unavailable: try later" {
		h.Fatalf("row after a retryable NACK: %d attempts, last error %q", rows[0].Attempts, rows[0].LastError)
	}
	again := h.due(retryAt.Add(time.Minute), 0, 10)
	h.wantIDs("Due after the retry time", msgIDs(again), evs[0].ID)
	if again[0].Attempts != 1 {
		h.Fatalf("message after a retryable NACK: %d attempts, want 1", again[0].Attempts)
	}
}

func testOutage(h *storeHarness) {
	evs := h.insert(1)
	msgs := h.due(time.Now(), 0, 10)
	h.wantIDs("Due", msgIDs(msgs), evs[0].ID)
	h.settle(outcome(msgs[0], outbox.Unanswered, "connection reset", time.Time{}))
	again := h.due(time.Now(), 0, 10)
	h.wantIDs("Due after an unanswered send", msgIDs(again), evs[0].ID)
	if again[0].Attempts != 0 {
		h.Fatalf("an unanswered send counted: %d attempts", again[0].Attempts)
	}
	rows := h.list(outbox.StatePending)
	if len(rows) != 1 || rows[0].Attempts != 0 || rows[0].LastError != "connection reset" {
		h.Fatalf("row after an unanswered send: %+v", rows)
	}
	h.wantCounts(1, 0)
}

func testRejectRequeue(h *storeHarness) {
	evs := h.insert(2)
	msgs := h.due(time.Now(), 0, 10)
	h.wantIDs("Due", msgIDs(msgs), evs[0].ID, evs[1].ID)
	h.settle(outcome(msgs[0], outbox.Rejected, "invalid_payload: no total", time.Time{}),
		outcome(msgs[1], outbox.Delivered, "", time.Time{}))
	h.wantCounts(0, 1)
	if got := h.due(time.Now().Add(time.Hour), 0, 10); len(got) != 0 {
		h.Fatalf("Due returned settled rows: %q", msgIDs(got))
	}
	if _, ok, err := h.s.Admin.OldestPending(h.ctx); err != nil || ok {
		h.Fatalf("OldestPending with only a rejected row: ok %v, err %v", ok, err)
	}
	rows := h.list(outbox.StateRejected)
	h.wantIDs("List(rejected)", rowIDs(rows), evs[0].ID)
	if r := rows[0]; r.State != outbox.StateRejected || r.LastError != "invalid_payload: no total" || r.Attempts != 1 {
		h.Fatalf("rejected row: state %q, last error %q, %d attempts", r.State, r.LastError, r.Attempts)
	}
	if n, err := h.s.Admin.Requeue(h.ctx, []string{"evt-unknown"}); err != nil || n != 0 {
		h.Fatalf("Requeue of an unknown id: %d, %v", n, err)
	}
	if n, err := h.s.Admin.Requeue(h.ctx, []string{evs[0].ID, evs[1].ID}); err != nil || n != 1 {
		h.Fatalf("Requeue of a rejected and a delivered row: %d, %v; want 1", n, err)
	}
	h.wantCounts(1, 0)
	again := h.due(time.Now(), 0, 10)
	h.wantIDs("Due after Requeue", msgIDs(again), evs[0].ID)
	if again[0].Attempts != 0 {
		h.Fatalf("requeued message: %d attempts, want 0", again[0].Attempts)
	}
	if n, err := h.s.Admin.Requeue(h.ctx, nil); err != nil || n != 0 {
		h.Fatalf("Requeue with nothing rejected: %d, %v", n, err)
	}
	// Requeue with no ids: every rejected row.
	h.settle(outcome(again[0], outbox.Rejected, "invalid_payload: still", time.Time{}))
	if n, err := h.s.Admin.Requeue(h.ctx, nil); err != nil || n != 1 {
		h.Fatalf("Requeue(nil): %d, %v; want 1", n, err)
	}
	h.wantCounts(1, 0)
}

// testRowsDrop: Rows finds rows by id in any state, Drop deletes only
// rejected ones (of the ids, or all) and says which; the rejected count
// goes to 0. A store without outbox.RowAdmin skips it.
func testRowsDrop(h *storeHarness) {
	ra, ok := h.s.Admin.(outbox.RowAdmin)
	if !ok {
		h.Skip("the store's Admin is not an outbox.RowAdmin")
	}
	evs := h.insert(4)
	msgs := h.due(time.Now(), 0, 10)
	h.wantIDs("Due", msgIDs(msgs), evs[0].ID, evs[1].ID, evs[2].ID, evs[3].ID)
	h.settle(outcome(msgs[0], outbox.Rejected, "invalid_payload: no total", time.Time{}),
		outcome(msgs[1], outbox.Rejected, "invalid_payload: no total", time.Time{}),
		outcome(msgs[2], outbox.Delivered, "", time.Time{}))
	h.wantCounts(1, 2)
	rows, err := ra.Rows(h.ctx, []string{evs[0].ID, evs[3].ID, "evt-unknown"})
	if err != nil {
		h.Fatalf("Rows: %v", err)
	}
	states := map[string]string{}
	for _, r := range rows {
		states[r.EventID] = r.State
	}
	if len(rows) != 2 || states[evs[0].ID] != outbox.StateRejected || states[evs[3].ID] != outbox.StatePending {
		h.Fatalf("Rows(rejected, pending, unknown): %v, want the first rejected and the second pending", states)
	}
	if rows, err := ra.Rows(h.ctx, nil); err != nil || len(rows) != 0 {
		h.Fatalf("Rows(nil): %v, %v; want none", rows, err)
	}
	dropped, err := ra.Drop(h.ctx, []string{evs[0].ID, evs[2].ID, evs[3].ID, "evt-unknown"})
	if err != nil {
		h.Fatalf("Drop: %v", err)
	}
	h.wantIDs("Drop(rejected, delivered, pending, unknown)", dropped, evs[0].ID)
	h.wantCounts(1, 1)
	if dropped, err = ra.Drop(h.ctx, nil); err != nil {
		h.Fatalf("Drop(nil): %v", err)
	}
	h.wantIDs("Drop(nil)", dropped, evs[1].ID)
	h.wantCounts(1, 0)
	if rows, err := ra.Rows(h.ctx, []string{evs[0].ID, evs[1].ID}); err != nil || len(rows) != 0 {
		h.Fatalf("Rows of dropped rows: %v, %v; want none", rows, err)
	}
}

// testSettleTwice records answered outcomes twice, as the Relay does when
// a Settle timed out after its transaction committed.
func testSettleTwice(h *storeHarness) {
	evs := h.insert(2)
	msgs := h.due(time.Now(), 0, 10)
	h.wantIDs("Due", msgIDs(msgs), evs[0].ID, evs[1].ID)
	outs := []outbox.Outcome{outcome(msgs[0], outbox.Rejected, "invalid_payload: no total", time.Time{}),
		outcome(msgs[1], outbox.Delivered, "", time.Time{})}
	h.settle(outs...)
	h.settle(outs...)
	h.wantCounts(0, 1)
	rows := h.list(outbox.StateRejected)
	h.wantIDs("List(rejected)", rowIDs(rows), evs[0].ID)
	if rows[0].Attempts != 1 || rows[0].LastError != "invalid_payload: no total" {
		h.Fatalf("row rejected twice over: %d attempts, last error %q; want 1 attempt", rows[0].Attempts, rows[0].LastError)
	}
	// A send that failed while the row was being rejected (a relay's
	// late outcome) leaves the rejected row and its reason alone.
	h.settle(outcome(msgs[0], outbox.Retry, "dial: connection refused", time.Now().Add(time.Minute)),
		outcome(msgs[0], outbox.Unanswered, "dial: connection refused", time.Time{}))
	h.wantCounts(0, 1)
	if r := h.list(outbox.StateRejected)[0]; r.Attempts != 1 || r.LastError != "invalid_payload: no total" {
		h.Fatalf("rejected row after a late failed send: %d attempts, last error %q; want 1 and the server's reason", r.Attempts, r.LastError)
	}
}

func testOldestPending(h *storeHarness) {
	if _, ok, err := h.s.Admin.OldestPending(h.ctx); err != nil || ok {
		h.Fatalf("OldestPending of an empty outbox: ok %v, err %v", ok, err)
	}
	before := time.Now()
	h.insert(2)
	oldest, ok, err := h.s.Admin.OldestPending(h.ctx)
	if err != nil || !ok {
		h.Fatalf("OldestPending: ok %v, err %v", ok, err)
	}
	rows := h.list(outbox.StatePending)
	if !oldest.Equal(rows[0].CreatedAt) {
		h.Fatalf("OldestPending %v, the first row was created at %v", oldest, rows[0].CreatedAt)
	}
	if d := oldest.Sub(before); d < -time.Minute || d > time.Minute {
		h.Fatalf("OldestPending %v, inserted at %v", oldest, before)
	}
}

func testClaims(h *storeHarness) {
	if c, ok := h.s.Store.(outbox.Claimer); !ok || !c.Claims() {
		h.Skip("the store does not claim the rows Due returns (not an outbox.Claimer)")
	}
	const rows, relays = 40, 6
	h.insert(rows)
	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	errs := make(chan error, relays)
	for range relays {
		wg.Go(func() {
			// Each call that finds rows takes at least one: a relay needs
			// no more calls than there are rows, and a store that hands
			// rows out again must not keep the check running.
			for range rows + 1 {
				msgs, err := h.s.Store.Due(h.ctx, time.Now(), 0, 3)
				if err != nil {
					errs <- err
					return
				}
				if len(msgs) == 0 {
					return
				}
				mu.Lock()
				for _, m := range msgs {
					seen[m.EventID]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		h.Fatalf("Due: %v", err)
	}
	for id, n := range seen {
		if n != 1 {
			h.Fatalf("concurrent Due calls handed %s out %d times", id, n)
		}
	}
	if len(seen) != rows {
		h.Fatalf("concurrent Due calls handed out %d of %d rows", len(seen), rows)
	}
}

func testNotify(h *storeHarness) {
	n, ok := h.s.Store.(outbox.Notifier)
	if !ok {
		h.Skip("the store cannot tell of new rows (not an outbox.Notifier)")
	}
	drain := func() {
		for {
			select {
			case <-n.Notify():
			default:
				return
			}
		}
	}
	wait := func(what string) {
		h.Helper()
		select {
		case <-n.Notify():
		case <-h.ctx.Done():
			h.Fatalf("no notification after %s", what)
		}
	}
	drain()
	evs := h.insert(1)
	wait("an insert")
	msgs := h.due(time.Now(), 0, 10)
	h.wantIDs("Due", msgIDs(msgs), evs[0].ID)
	h.settle(outcome(msgs[0], outbox.Rejected, "invalid_payload: no", time.Time{}))
	drain()
	if n, err := h.s.Admin.Requeue(h.ctx, nil); err != nil || n != 1 {
		h.Fatalf("Requeue: %d, %v", n, err)
	}
	wait("a requeue")
}

// testPayloadBytes: a payload comes back from Due and List byte for byte
// as it went in (compacted, with StoreFeatures.CompactsPayload), in a
// layout no JSON encoder would write: its keys out of order and repeated,
// its spacing and escapes its own, a big number.
func testPayloadBytes(h *storeHarness) {
	payloads := []string{
		`{"zeta":1,"a":2,"a":3}`,
		"{ \"s\" : \"caf\\u00e9 \\u0000 \\/\" ,\n\t\"n\": 1.50e+3, \"big\": 123456789012345678901234567890 }",
		`{"é":"日本","nested":{"b":[1, 2 ,3],"a":null}}`,
	}
	evs := make([]outbox.Event, len(payloads))
	for i, p := range payloads {
		evs[i] = event(i + 1)
		evs[i].Payload = json.RawMessage(p)
	}
	h.s.Insert(h.T, slices.Clone(evs)...)
	msgs := h.due(time.Now(), 0, 10)
	if len(msgs) != len(evs) {
		h.Fatalf("Due handed out %d rows, want %d", len(msgs), len(evs))
	}
	for i, m := range msgs {
		if want := h.stored([]byte(payloads[i])); !bytes.Equal(m.Body, want) {
			h.Fatalf("Due: message %s: Body %q, want the bytes inserted %q", m.EventID, m.Body, want)
		}
	}
	for i, r := range h.list(outbox.StatePending) {
		if want := h.stored([]byte(payloads[i])); !bytes.Equal(r.Payload, want) {
			h.Fatalf("List: row %s: Payload %q, want the bytes inserted %q", r.EventID, r.Payload, want)
		}
	}
}

// testExtend: a relay that is alive keeps its claims for as long as it
// extends them, past the claim period (clocks moved on through Due's and
// Extend's now, not waited for); an extended claim keeps its Lease, so
// its outcomes still apply; a settled row is not claimed again by an
// extension (a retry keeps its time), and once a claim ran out and
// another relay took the row, the first relay's extension and outcomes
// leave the new claim alone.
func testExtend(h *storeHarness) {
	e, ok := h.s.Store.(outbox.Extender)
	if !ok {
		h.Skip("the store's claims cannot be extended (not an outbox.Extender)")
	}
	period := e.ClaimPeriod()
	if period <= 0 {
		h.Fatalf("ClaimPeriod() = %v, want a positive period", period)
	}
	claimsOf := func(msgs []outbox.Message) []outbox.Claim {
		out := make([]outbox.Claim, len(msgs))
		for i, m := range msgs {
			out[i] = outbox.Claim{EventID: m.EventID, Seq: m.Seq, Lease: m.Lease}
		}
		return out
	}
	extend := func(now time.Time, claims []outbox.Claim) int64 {
		h.Helper()
		n, err := e.Extend(h.ctx, now, claims)
		if err != nil {
			h.Fatalf("Extend: %v", err)
		}
		return n
	}
	evs := h.insert(3)
	t0 := time.Now()
	msgs := h.due(t0, 0, 10)
	h.wantIDs("Due", msgIDs(msgs), evs[0].ID, evs[1].ID, evs[2].ID)
	// The relay beats every quarter of the period, for three periods.
	for i := 1; i <= 9; i++ {
		at := t0.Add(time.Duration(i) * period / 3)
		if n := extend(at, claimsOf(msgs)); n != 3 {
			h.Fatalf("Extend at %d/3 of the claim period extended %d of 3 claims", i, n)
		}
		if got := h.due(at.Add(period/2), 0, 10); len(got) != 0 {
			h.Fatalf("Due %d/3 + 1/2 claim periods on, the relay having extended its claims: handed out %q again", i, msgIDs(got))
		}
	}
	t1 := t0.Add(3 * period) // when the last extension was taken
	// Outcomes still apply under the lease Due handed out.
	retryAt := t1.Add(period / 10)
	h.settle(outcome(msgs[0], outbox.Delivered, "", time.Time{}),
		outcome(msgs[1], outbox.Retry, "unavailable: try later", retryAt))
	rows := h.list(outbox.StatePending)
	h.wantIDs("List(pending) after settling an extended claim", rowIDs(rows), evs[1].ID, evs[2].ID)
	if rows[0].Attempts != 1 || rows[0].LastError != "unavailable: try later" {
		h.Fatalf("a retry under an extended claim: %d attempts, last error %q; want 1 attempt and the reason", rows[0].Attempts, rows[0].LastError)
	}
	// A late beat neither revives the delivered row nor moves the retry.
	if n := extend(t1.Add(time.Millisecond), claimsOf(msgs)); n != 1 {
		h.Fatalf("Extend after two of three rows were settled extended %d claims, want 1 (the unsettled row's)", n)
	}
	again := h.due(retryAt.Add(time.Millisecond), 0, 10)
	h.wantIDs("Due at the retry time, after a late beat", msgIDs(again), evs[1].ID)
	// The relay stops beating (it died): its last claim runs out and
	// another relay takes the row.
	taken := h.due(t1.Add(time.Millisecond).Add(period+time.Second), msgs[1].Seq, 10)
	h.wantIDs("Due after the last extended claim ran out", msgIDs(taken), evs[2].ID)
	if n := extend(t1.Add(period+2*time.Second), claimsOf(msgs[2:])); n != 0 {
		h.Fatalf("the dead relay's beat extended %d claims another relay holds now", n)
	}
	h.settle(outcome(msgs[2], outbox.Rejected, "late: parked", time.Time{}))
	h.wantCounts(2, 0)
	if got := h.due(t1.Add(period+3*time.Second), 0, 10); len(got) != 0 {
		h.Fatalf("the dead relay's late outcome made %q due while another relay holds it", msgIDs(got))
	}
	h.settle(outcome(taken[0], outbox.Delivered, "", time.Time{}))
	h.wantCounts(1, 0)
}
