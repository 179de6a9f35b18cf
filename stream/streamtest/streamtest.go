package streamtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/postbox-events/postbox/stream"
)

// Features declares what a backend cannot do; the zero value claims
// everything. Each field skips the checks that need what it names.
type Features struct {
	// NotPersistent: the backend forgets everything when closed, so the
	// close-and-reopen checks are skipped.
	NotPersistent bool
	// NoAtTime: the backend cannot start a consumer at a time, so the
	// stream.StartAtTime checks are skipped.
	NoAtTime bool
}

// NewBackend opens the store called name, creating it empty the first
// time. Opening the same name again after the previous backend was closed
// must give back the same data. Names are unique per test and made of
// [a-zA-Z0-9_-]. The suite closes every backend it opens, once, and may
// open the name again right after: Close must stop whatever NewBackend
// started for the backend (a writer goroutine, a connection) and release
// the store.
type NewBackend func(t *testing.T, name string) stream.Backend

// testTimeout bounds each check.
const testTimeout = 30 * time.Second

// Run runs the conformance suite as subtests of t.
func Run(t *testing.T, features Features, newBackend NewBackend) {
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			for _, c := range g.checks {
				t.Run(c.name, func(t *testing.T) {
					if c.atTime && features.NoAtTime {
						t.Skip("the backend cannot start a consumer at a time (Features.NoAtTime)")
					}
					if c.persistent && features.NotPersistent {
						t.Skip("the backend forgets everything when closed (Features.NotPersistent)")
					}
					c.run(start(t, features, newBackend))
				})
			}
		})
	}
}

type group struct {
	name   string
	checks []check
}

type check struct {
	name       string
	run        func(h *harness)
	atTime     bool // needs stream.StartAtTime
	persistent bool // needs data to survive Close
}

var groups = []group{
	{"EnsureStream", []check{
		{name: "idempotent", run: testEnsureStreamIdempotent},
		{name: "concurrent_callers_get_one_stream", run: testEnsureStreamConcurrent},
		{name: "append_to_unknown_stream", run: testAppendUnknownStream},
	}},
	{"Append", []check{
		{name: "offsets_start_at_1_and_grow_by_one", run: testAppendOffsets},
		{name: "streams_have_independent_offsets", run: testAppendIndependentStreams},
	}},
	{"Idempotence", []check{
		{name: "duplicate_reports_the_original", run: testDuplicate},
		{name: "duplicate_within_one_call", run: testDuplicateInOneCall},
		{name: "variant_is_part_of_the_identity", run: testVariant},
		{name: "conflict_changes_nothing", run: testConflict},
		{name: "conflict_within_one_call", run: testConflictInOneCall},
		{name: "conflict_names_type_or_payload", run: testConflictField},
		{name: "mixed_batch", run: testMixedBatch},
	}},
	{"Lookup", []check{
		{name: "streams_lists_every_stream", run: testStreamsList},
		{name: "event_by_offset", run: testEventByOffset},
		{name: "lookup_by_identity", run: testLookupByIdentity},
	}},
	{"Read", []check{
		{name: "round_trips_every_field", run: testReadRoundTrip},
		{name: "from_and_limit", run: testReadFromAndLimit},
		{name: "past_the_end", run: testReadPastEnd},
		{name: "empty_stream", run: testReadEmptyStream},
		{name: "unknown_consumer", run: testReadUnknownConsumer},
	}},
	{"Consumers", []check{
		{name: "created_at_start", run: testConsumerCreated},
		{name: "ensure_again_keeps_offset", run: testEnsureConsumerKeepsOffset},
		{name: "same_id_on_another_stream", run: testConsumerOnAnotherStream},
		{name: "unknown_consumer", run: testConsumerUnknown},
		{name: "delete", run: testDeleteConsumer},
		{name: "unknown_stream", run: testConsumerUnknownStream},
		{name: "invalid_start", run: testConsumerInvalidStart},
	}},
	{"StartPolicies", []check{
		{name: "offsets", run: testStartPolicies},
		{name: "empty_stream", run: testStartPoliciesEmptyStream},
		{name: "at_time", run: testStartAtTime, atTime: true},
	}},
	{"Commit", []check{
		{name: "advances", run: testCommitAdvances},
		{name: "same_offset_again", run: testCommitAgain},
		{name: "behind", run: testCommitBehind},
		{name: "past_high_watermark", run: testCommitPastHighWatermark},
		{name: "unknown_consumer", run: testCommitUnknownConsumer},
		{name: "moves_one_consumer", run: testCommitMovesOneConsumer},
	}},
	{"Reset", []check{
		{name: "earliest_after_committing_everything", run: testResetEarliest},
		{name: "at_offset_forward_and_backward", run: testResetAtOffset},
		{name: "latest", run: testResetLatest},
		{name: "at_time", run: testResetAtTime, atTime: true},
		{name: "unknown_consumer", run: testResetUnknownConsumer},
		{name: "invalid_start", run: testResetInvalidStart},
	}},
	{"Stats", []check{
		{name: "empty_stream", run: testStatsEmpty},
		{name: "after_appends", run: testStatsAfterAppends},
		{name: "unknown_stream", run: testStatsUnknownStream},
	}},
	{"Lag", []check{
		{name: "follows_commits", run: testLagFollowsCommits},
		{name: "latest_consumer", run: testLagLatest},
		{name: "empty_stream", run: testLagEmptyStream},
		{name: "unknown_consumer", run: testLagUnknownConsumer},
	}},
	{"NoSubscription", []check{
		{name: "backlog_waits_for_later_consumers", run: testNoSubscription},
	}},
	{"Concurrency", []check{
		{name: "concurrent_appenders", run: testConcurrentAppenders},
	}},
	{"Reopen", []check{
		{name: "everything_survives_close", run: testReopen, persistent: true},
	}},
	{"ReadFrom", []check{
		{name: "scanner_reads_like_a_consumer", run: testScannerReads},
		{name: "fallback_reads_like_a_consumer", run: testReadFromFallback},
	}},
	{"Search", []check{
		{name: "by_native_id_type_and_time_newest_first", run: testSearch},
	}},
	{"Audit", []check{
		{name: "commits_and_resets_newest_first", run: testAuditMoves},
		{name: "unknown_consumer", run: testAuditUnknownConsumer},
		{name: "deleted_with_the_consumer", run: testAuditDeleted},
	}},
	{"Wait", []check{
		{name: "returns_at_once_when_ahead", run: testWaitAhead},
		{name: "blocks_until_append", run: testWaitBlocks},
		{name: "context_end", run: testWaitContextEnd},
	}},
}

// harness is one check's backend, context and assertions. Its helpers
// fail the test on an unexpected error.
type harness struct {
	*testing.T
	ctx        context.Context
	features   Features
	newBackend NewBackend
	name       string
	b          stream.Backend // the backend opened last
	cur        *opened
}

// opened is the suite's own record of whether it closed a backend, so that
// a backend's Close is called exactly once.
type opened struct {
	b      stream.Backend
	closed bool
}

func start(t *testing.T, features Features, newBackend NewBackend) *harness {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	h := &harness{T: t, ctx: ctx, features: features, newBackend: newBackend, name: storeName(t.Name())}
	h.open()
	return h
}

// storeName turns a test name into a store name: [a-zA-Z0-9_-] only.
func storeName(testName string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case 'a' <= r && r <= 'z', 'A' <= r && r <= 'Z', '0' <= r && r <= '9', r == '-', r == '_':
			return r
		}
		return '_'
	}, testName)
}

func (h *harness) open() {
	h.Helper()
	b := h.newBackend(h.T, h.name)
	if b == nil {
		h.Fatal("NewBackend returned nil")
	}
	o := &opened{b: b}
	h.Cleanup(func() {
		if err := o.close(); err != nil {
			h.Errorf("Close: %v", err)
		}
	})
	h.b, h.cur = b, o
}

func (o *opened) close() error {
	if o.closed {
		return nil
	}
	o.closed = true
	return o.b.Close()
}

// reopen closes the backend and opens the same store again.
func (h *harness) reopen() {
	h.Helper()
	if err := h.cur.close(); err != nil {
		h.Fatalf("Close: %v", err)
	}
	h.open()
}

func (h *harness) stream(sourceID string) stream.Stream {
	h.Helper()
	s, err := h.b.EnsureStream(h.ctx, sourceID)
	if err != nil {
		h.Fatalf("EnsureStream(%q): %v", sourceID, err)
	}
	return s
}

func (h *harness) append(streamID string, evs []stream.Event) []stream.AppendResult {
	h.Helper()
	res, err := h.b.Append(h.ctx, streamID, evs)
	if err != nil {
		h.Fatalf("Append(%q, %d events): %v", streamID, len(evs), err)
	}
	if len(res) != len(evs) {
		h.Fatalf("Append(%q, %d events) returned %d results", streamID, len(evs), len(res))
	}
	return res
}

// appendNew appends events none of which is stored yet and checks that
// they get the offsets first, first+1, ...
func (h *harness) appendNew(streamID string, first int64, evs []stream.Event) []stream.AppendResult {
	h.Helper()
	res := h.append(streamID, evs)
	for i, r := range res {
		if r.Err != nil || r.Duplicate || r.Offset != first+int64(i) || r.StoredAt.IsZero() {
			h.Fatalf("append %s: %+v, want a new event at offset %d with StoredAt set", evs[i].NativeID, r, first+int64(i))
		}
	}
	return res
}

// fill appends n new events to an empty stream: offsets 1..n.
func (h *harness) fill(streamID string, n int) []stream.AppendResult {
	h.Helper()
	return h.appendNew(streamID, 1, events("e", n))
}

func (h *harness) ensureConsumer(id, streamID string, start stream.Start) stream.Consumer {
	h.Helper()
	c, err := h.b.EnsureConsumer(h.ctx, stream.ConsumerConfig{ID: id, StreamID: streamID, Start: start})
	if err != nil {
		h.Fatalf("EnsureConsumer(%q, %+v): %v", id, start, err)
	}
	return c
}

func (h *harness) consumer(id string) stream.Consumer {
	h.Helper()
	c, err := h.b.Consumer(h.ctx, id)
	if err != nil {
		h.Fatalf("Consumer(%q): %v", id, err)
	}
	return c
}

// wantNext checks the consumer's next offset as Consumer reports it.
func (h *harness) wantNext(id string, want int64) {
	h.Helper()
	if got := h.consumer(id).NextOffset; got != want {
		h.Errorf("consumer %s: NextOffset %d, want %d", id, got, want)
	}
}

func (h *harness) read(id string, from int64, limit int) stream.Batch {
	h.Helper()
	b, err := h.b.Read(h.ctx, id, from, limit)
	if err != nil {
		h.Fatalf("Read(%q, from %d, limit %d): %v", id, from, limit, err)
	}
	return b
}

// wantRead reads and checks the offsets of the events returned.
func (h *harness) wantRead(id string, from int64, limit int, want []int64) stream.Batch {
	h.Helper()
	b := h.read(id, from, limit)
	h.wantOffsets(fmt.Sprintf("Read(%s, from %d, limit %d)", id, from, limit), offsetsOf(b.Events), want)
	return b
}

// readAll reads from the consumer's next offset to the end, page by page,
// without committing.
func (h *harness) readAll(id string) []stream.StoredEvent {
	h.Helper()
	var all []stream.StoredEvent
	from := int64(0)
	for {
		b := h.read(id, from, 100)
		if len(b.Events) == 0 {
			return all
		}
		last := b.Events[len(b.Events)-1].Offset
		if last < from || len(all) > 100_000 {
			h.Fatalf("Read(%s, from %d) does not advance: last offset %d", id, from, last)
		}
		all = append(all, b.Events...)
		from = last + 1
	}
}

func (h *harness) commit(id string, offset int64) stream.Consumer {
	h.Helper()
	c, err := h.b.Commit(h.ctx, id, offset)
	if err != nil {
		h.Fatalf("Commit(%q, %d): %v", id, offset, err)
	}
	if c.NextOffset != offset+1 {
		h.Errorf("Commit(%q, %d) returned NextOffset %d, want %d", id, offset, c.NextOffset, offset+1)
	}
	return c
}

func (h *harness) reset(id string, start stream.Start, wantNext int64) stream.Consumer {
	h.Helper()
	c, err := h.b.Reset(h.ctx, id, start)
	if err != nil {
		h.Fatalf("Reset(%q, %+v): %v", id, start, err)
	}
	if c.NextOffset != wantNext || !sameStart(c.Start, start) {
		h.Errorf("Reset(%q, %+v) = NextOffset %d, Start %+v; want NextOffset %d and the start recorded", id, start, c.NextOffset, c.Start, wantNext)
	}
	h.wantNext(id, wantNext)
	return c
}

func (h *harness) stats(streamID string) stream.Stats {
	h.Helper()
	s, err := h.b.Stats(h.ctx, streamID)
	if err != nil {
		h.Fatalf("Stats(%q): %v", streamID, err)
	}
	return s
}

// wantStats checks the event count and offset range of a stream.
func (h *harness) wantStats(streamID string, events, first, last int64) stream.Stats {
	h.Helper()
	s := h.stats(streamID)
	if s.StreamID != streamID || s.Events != events || s.FirstOffset != first || s.LastOffset != last {
		h.Errorf("Stats(%s) = %+v, want StreamID %s, Events %d, FirstOffset %d, LastOffset %d", streamID, s, streamID, events, first, last)
	}
	return s
}

func (h *harness) wantLag(id string, next, hw, events int64) {
	h.Helper()
	l, err := h.b.Lag(h.ctx, id)
	if err != nil {
		h.Fatalf("Lag(%q): %v", id, err)
	}
	if l.ConsumerID != id || l.NextOffset != next || l.HighWatermark != hw || l.Events != events {
		h.Errorf("Lag(%s) = %+v, want NextOffset %d, HighWatermark %d, Events %d", id, l, next, hw, events)
	}
}

func (h *harness) wantErr(err, target error, what string) {
	h.Helper()
	if !errors.Is(err, target) {
		h.Errorf("%s: error %v, want %v", what, err, target)
	}
}

func (h *harness) wantOffsets(what string, got, want []int64) {
	h.Helper()
	if !slices.Equal(got, want) {
		h.Errorf("%s: offsets %v, want %v", what, abbreviate(got), abbreviate(want))
	}
}

// waitClockPast returns once the wall clock is in a later millisecond
// than t, so that what is stored from now on is stored after t, even by a
// backend that keeps milliseconds only.
func (h *harness) waitClockPast(t time.Time) {
	h.Helper()
	until := t.Truncate(time.Millisecond).Add(time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(until) {
		if time.Now().After(deadline) {
			h.Fatalf("the clock did not pass %v within 5s: is the backend's clock ahead?", t)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// checkEvent compares what a stream returned with what was appended.
// Times are compared to the microsecond and JSON by value.
func (h *harness) checkEvent(got stream.StoredEvent, want stream.Event) {
	h.Helper()
	id := fmt.Sprintf("event %s/%s at offset %d", want.NativeID, want.Variant, got.Offset)
	if got.NativeID != want.NativeID || got.Variant != want.Variant {
		h.Errorf("%s: identity %q/%q", id, got.NativeID, got.Variant)
	}
	if got.Type != want.Type {
		h.Errorf("%s: Type %q, want %q", id, got.Type, want.Type)
	}
	if !sameTime(got.OccurredAt, want.OccurredAt) {
		h.Errorf("%s: OccurredAt %v, want %v", id, got.OccurredAt, want.OccurredAt)
	}
	switch {
	case want.Sequence == nil && got.Sequence != nil:
		h.Errorf("%s: Sequence %d, want nil", id, *got.Sequence)
	case want.Sequence != nil && got.Sequence == nil:
		h.Errorf("%s: Sequence nil, want %d", id, *want.Sequence)
	case want.Sequence != nil && *got.Sequence != *want.Sequence:
		h.Errorf("%s: Sequence %d, want %d", id, *got.Sequence, *want.Sequence)
	}
	if !sameJSON(got.Metadata, want.Metadata) {
		h.Errorf("%s: Metadata %s, want %s", id, got.Metadata, want.Metadata)
	}
	if !sameJSON(got.Payload, want.Payload) {
		h.Errorf("%s: Payload %.200s, want %.200s", id, got.Payload, want.Payload)
	}
	if len(want.DeliveryHandle) == 0 {
		if !emptyJSON(got.DeliveryHandle) {
			h.Errorf("%s: DeliveryHandle %s, want none", id, got.DeliveryHandle)
		}
	} else if !sameJSON(got.DeliveryHandle, want.DeliveryHandle) {
		h.Errorf("%s: DeliveryHandle %s, want %s", id, got.DeliveryHandle, want.DeliveryHandle)
	}
}

// eventTime is every built event's OccurredAt: microsecond precision, so
// that a backend that keeps microseconds gives it back exactly.
var eventTime = time.Date(2025, 6, 1, 12, 0, 0, 123456000, time.UTC)

// events builds n events prefix-1..prefix-n with payloads {"n":i}.
func events(prefix string, n int) []stream.Event {
	evs := make([]stream.Event, n)
	for i := range evs {
		evs[i] = event(fmt.Sprintf("%s-%d", prefix, i+1), fmt.Sprintf(`{"n":%d}`, i+1))
	}
	return evs
}

func event(nativeID, payload string) stream.Event {
	return stream.Event{
		NativeID:   nativeID,
		Type:       "test.event",
		OccurredAt: eventTime,
		Metadata:   json.RawMessage(`{"device_id":"d1"}`),
		Payload:    json.RawMessage(payload),
	}
}

func earliest() stream.Start { return stream.Start{Policy: stream.StartEarliest} }
func latest() stream.Start   { return stream.Start{Policy: stream.StartLatest} }
func atOffset(o int64) stream.Start {
	return stream.Start{Policy: stream.StartAtOffset, Offset: o}
}
func atTime(t time.Time) stream.Start {
	return stream.Start{Policy: stream.StartAtTime, Time: t}
}

// sameStart reports whether a consumer's recorded start is want.
func sameStart(got, want stream.Start) bool {
	switch want.Policy {
	case "", stream.StartLatest:
		return got.Policy == "" || got.Policy == stream.StartLatest
	case stream.StartAtOffset:
		return got.Policy == want.Policy && got.Offset == want.Offset
	case stream.StartAtTime:
		return got.Policy == want.Policy && sameTime(got.Time, want.Time)
	}
	return got.Policy == want.Policy
}

func sameTime(a, b time.Time) bool {
	return a.Truncate(time.Microsecond).Equal(b.Truncate(time.Microsecond))
}

func sameJSON(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

func emptyJSON(b []byte) bool {
	b = bytes.TrimSpace(b)
	return len(b) == 0 || string(b) == "null"
}

func offsetsOf(evs []stream.StoredEvent) []int64 {
	o := make([]int64, len(evs))
	for i, e := range evs {
		o[i] = e.Offset
	}
	return o
}

// span returns first..last; nothing when last < first.
func span(first, last int64) []int64 {
	var o []int64
	for i := first; i <= last; i++ {
		o = append(o, i)
	}
	if o == nil {
		o = []int64{}
	}
	return o
}

// abbreviate keeps long offset lists readable in failures.
func abbreviate(o []int64) string {
	if len(o) <= 20 {
		return fmt.Sprint(o)
	}
	return fmt.Sprintf("%v ... %v (%d offsets)", o[:10], o[len(o)-10:], len(o))
}

func ptr[T any](v T) *T { return &v }

func testEnsureStreamIdempotent(h *harness) {
	first := h.stream("source-a")
	if first.ID == "" || first.SourceID != "source-a" || first.Backend == "" || first.CreatedAt.IsZero() {
		h.Errorf("EnsureStream(source-a) = %+v, want ID, Backend and CreatedAt set and SourceID source-a", first)
	}
	again := h.stream("source-a")
	if again.ID != first.ID || again.SourceID != first.SourceID || again.Backend != first.Backend || !sameTime(again.CreatedAt, first.CreatedAt) {
		h.Errorf("EnsureStream(source-a) again = %+v, want %+v", again, first)
	}
	if other := h.stream("source-b"); other.ID == first.ID || other.SourceID != "source-b" {
		h.Errorf("EnsureStream(source-b) = %+v, want its own stream (source-a's is %s)", other, first.ID)
	}
}

func testEnsureStreamConcurrent(h *harness) {
	ids := make([]string, 8)
	var g errgroup.Group
	for i := range ids {
		g.Go(func() error {
			s, err := h.b.EnsureStream(h.ctx, "source")
			ids[i] = s.ID
			return err
		})
	}
	if err := g.Wait(); err != nil {
		h.Fatalf("concurrent EnsureStream: %v", err)
	}
	want := h.stream("source").ID
	for i, id := range ids {
		if id != want {
			h.Errorf("caller %d got stream %q, want %q", i, id, want)
		}
	}
}

func testAppendUnknownStream(h *harness) {
	_, err := h.b.Append(h.ctx, "no-such-stream", events("e", 1))
	h.wantErr(err, stream.ErrStreamNotFound, "Append to an unknown stream")
}

func testAppendOffsets(h *harness) {
	s := h.stream("source")
	var want []stream.Event
	for i, n := range []int{1, 3, 5, 2} {
		evs := events(fmt.Sprintf("batch%d", i), n)
		h.appendNew(s.ID, int64(len(want))+1, evs)
		want = append(want, evs...)
	}
	c := h.ensureConsumer("reader", s.ID, earliest())
	got := h.readAll(c.ID)
	h.wantOffsets("read all", offsetsOf(got), span(1, int64(len(want))))
	for i := range min(len(got), len(want)) {
		if got[i].NativeID != want[i].NativeID {
			h.Errorf("offset %d holds %s, want %s (results out of order?)", got[i].Offset, got[i].NativeID, want[i].NativeID)
		}
	}
}

func testAppendIndependentStreams(h *harness) {
	a, b := h.stream("source-a"), h.stream("source-b")
	h.appendNew(a.ID, 1, events("a", 3))
	h.appendNew(b.ID, 1, events("b", 2))
	h.appendNew(a.ID, 4, events("a-more", 1))
	h.appendNew(b.ID, 3, events("b-more", 1))
	h.ensureConsumer("reader-b", b.ID, earliest())
	for _, e := range h.readAll("reader-b") {
		if e.StreamID != b.ID || e.SourceID != "source-b" || !strings.HasPrefix(e.NativeID, "b") {
			h.Errorf("stream b holds %s at offset %d (stream %s, source %s)", e.NativeID, e.Offset, e.StreamID, e.SourceID)
		}
	}
	h.wantStats(a.ID, 4, 1, 4)
	h.wantStats(b.ID, 3, 1, 3)
}

func testDuplicate(h *harness) {
	s := h.stream("source")
	evs := events("e", 3)
	orig := h.fill(s.ID, 3)
	h.waitClockPast(orig[2].StoredAt) // a backend reporting the retry's time is caught
	r := h.append(s.ID, evs[1:2])[0]
	if !r.Duplicate || r.Err != nil || r.Offset != 2 || !sameTime(r.StoredAt, orig[1].StoredAt) {
		h.Errorf("append e-2 again = %+v, want Duplicate at offset 2, StoredAt %v", r, orig[1].StoredAt)
	}
	h.appendNew(s.ID, 4, events("next", 1)) // the duplicate took no offset
	h.wantStats(s.ID, 4, 1, 4)
}

func testDuplicateInOneCall(h *harness) {
	s := h.stream("source")
	x, y := event("x", `{"n":1}`), event("y", `{"n":2}`)
	res := h.append(s.ID, []stream.Event{x, y, x})
	if r := res[0]; r.Duplicate || r.Err != nil || r.Offset != 1 {
		h.Errorf("x: %+v, want new at offset 1", r)
	}
	if r := res[1]; r.Duplicate || r.Err != nil || r.Offset != 2 {
		h.Errorf("y: %+v, want new at offset 2", r)
	}
	if r := res[2]; !r.Duplicate || r.Err != nil || r.Offset != 1 || !sameTime(r.StoredAt, res[0].StoredAt) {
		h.Errorf("x again in the same call: %+v, want Duplicate at offset 1, StoredAt %v", r, res[0].StoredAt)
	}
	h.appendNew(s.ID, 3, events("next", 1))
	h.wantStats(s.ID, 3, 1, 3)
}

func testVariant(h *harness) {
	s := h.stream("source")
	plain := event("a", `{"n":1}`)
	variant := plain
	variant.Variant = "v2"
	h.appendNew(s.ID, 1, []stream.Event{plain})
	h.appendNew(s.ID, 2, []stream.Event{variant})
	res := h.append(s.ID, []stream.Event{variant, plain})
	if !res[0].Duplicate || res[0].Offset != 2 || !res[1].Duplicate || res[1].Offset != 1 {
		h.Errorf("appending both again: %+v, want Duplicate at offsets 2 and 1", res)
	}
	h.ensureConsumer("reader", s.ID, earliest())
	got := h.readAll("reader")
	if len(got) != 2 || got[0].Variant != "" || got[1].Variant != "v2" {
		h.Errorf("read %+v, want a/\"\" then a/v2", got)
	}
}

func testConflict(h *harness) {
	s := h.stream("source")
	h.appendNew(s.ID, 1, []stream.Event{event("a", `{"n":1}`)})
	r := h.append(s.ID, []stream.Event{event("a", `{"n":2}`)})[0]
	if !errors.Is(r.Err, stream.ErrConflict) || r.Duplicate {
		h.Errorf("append a with another payload: %+v, want Err ErrConflict, not Duplicate", r)
	}
	h.ensureConsumer("reader", s.ID, earliest())
	got := h.readAll("reader")
	if len(got) != 1 || !sameJSON(got[0].Payload, []byte(`{"n":1}`)) {
		h.Errorf("after the conflict the stream holds %d events, first payload %s; want 1 with {\"n\":1}", len(got), payloadOf(got))
	}
	h.appendNew(s.ID, 2, events("next", 1)) // the conflict took no offset
}

func testConflictInOneCall(h *harness) {
	s := h.stream("source")
	res := h.append(s.ID, []stream.Event{event("a", `{"n":1}`), event("a", `{"n":2}`)})
	if r := res[0]; r.Err != nil || r.Duplicate || r.Offset != 1 {
		h.Errorf("first a: %+v, want new at offset 1", r)
	}
	if r := res[1]; !errors.Is(r.Err, stream.ErrConflict) || r.Duplicate {
		h.Errorf("second a with another payload: %+v, want Err ErrConflict", r)
	}
	h.ensureConsumer("reader", s.ID, earliest())
	if got := h.readAll("reader"); len(got) != 1 || !sameJSON(got[0].Payload, []byte(`{"n":1}`)) {
		h.Errorf("the stream holds %d events, first payload %s; want 1 with {\"n\":1}", len(got), payloadOf(got))
	}
	h.wantStats(s.ID, 1, 1, 1)
}

// testConflictField: the same identity with another type is a conflict,
// not a duplicate, and the ConflictError names what differs: the type
// before the payload.
func testConflictField(h *harness) {
	s := h.stream("source")
	orig := event("a", `{"n":1}`)
	h.appendNew(s.ID, 1, []stream.Event{orig})
	retyped := orig
	retyped.Type = "other.type"
	both := retyped
	both.Payload = json.RawMessage(`{"n":2}`)
	changed := orig
	changed.Payload = json.RawMessage(`{"n":2}`)
	for _, c := range []struct {
		name  string
		batch []stream.Event
		field string // of the last result
	}{
		{"another type", []stream.Event{retyped}, stream.FieldType},
		{"another type and payload", []stream.Event{both}, stream.FieldType},
		{"another payload", []stream.Event{changed}, stream.FieldPayload},
		{"another type in one call with a new event", []stream.Event{event("b", `{"n":1}`), func() stream.Event {
			e := event("b", `{"n":1}`)
			e.Type = "other.type"
			return e
		}()}, stream.FieldType},
	} {
		res := h.append(s.ID, c.batch)
		r := res[len(res)-1]
		var ce *stream.ConflictError
		if !errors.Is(r.Err, stream.ErrConflict) || !errors.As(r.Err, &ce) || r.Duplicate {
			h.Errorf("%s: %+v, want Err a *stream.ConflictError (ErrConflict), not Duplicate", c.name, r)
			continue
		}
		if ce.Field != c.field {
			h.Errorf("%s: ConflictError names %q, want %q", c.name, ce.Field, c.field)
		}
	}
	if r := h.append(s.ID, []stream.Event{orig})[0]; !r.Duplicate || r.Err != nil || r.Offset != 1 {
		h.Errorf("the original again: %+v, want Duplicate at offset 1", r)
	}
	h.ensureConsumer("reader", s.ID, earliest())
	got := h.readAll("reader")
	if len(got) != 2 || got[0].Type != orig.Type || got[1].Type != orig.Type || !sameJSON(got[0].Payload, orig.Payload) {
		h.Errorf("after the conflicts the stream holds %+v; want a and b with their first type and payload", got)
	}
	h.wantStats(s.ID, 2, 1, 2)
}

func payloadOf(evs []stream.StoredEvent) string {
	if len(evs) == 0 {
		return "(none)"
	}
	return string(evs[0].Payload)
}

func testMixedBatch(h *harness) {
	s := h.stream("source")
	p1, p2 := event("p1", `{"n":1}`), event("p2", `{"n":2}`)
	pre := h.appendNew(s.ID, 1, []stream.Event{p1, p2})
	n1, n2, n3 := event("n1", `{"n":3}`), event("n2", `{"n":4}`), event("n3", `{"n":5}`)
	batch := []stream.Event{n1, p1, event("p2", `{"n":"changed"}`), n2, n1, n3}
	res := h.append(s.ID, batch)
	want := []struct {
		offset    int64
		duplicate bool
		conflict  bool
	}{{3, false, false}, {1, true, false}, {0, false, true}, {4, false, false}, {3, true, false}, {5, false, false}}
	for i, w := range want {
		r := res[i]
		switch {
		case w.conflict:
			if !errors.Is(r.Err, stream.ErrConflict) || r.Duplicate {
				h.Errorf("result %d (%s): %+v, want Err ErrConflict", i, batch[i].NativeID, r)
			}
		case r.Err != nil || r.Duplicate != w.duplicate || r.Offset != w.offset:
			h.Errorf("result %d (%s): %+v, want Offset %d, Duplicate %t", i, batch[i].NativeID, r, w.offset, w.duplicate)
		}
	}
	if !sameTime(res[1].StoredAt, pre[0].StoredAt) {
		h.Errorf("duplicate p1: StoredAt %v, want the original %v", res[1].StoredAt, pre[0].StoredAt)
	}
	h.ensureConsumer("reader", s.ID, earliest())
	got := h.readAll("reader")
	h.wantOffsets("read all", offsetsOf(got), span(1, 5))
	for i, w := range []stream.Event{p1, p2, n1, n2, n3} {
		if i < len(got) {
			h.checkEvent(got[i], w)
		}
	}
	h.wantStats(s.ID, 5, 1, 5)
}

func testReadRoundTrip(h *harness) {
	s, other := h.stream("source-a"), h.stream("source-b")
	zone := time.FixedZone("UTC+2", 2*60*60)
	large := fmt.Sprintf(`{"blob":%q}`, strings.Repeat("x", 64<<10))
	evs := []stream.Event{{
		NativeID:       "full",
		Variant:        "v2",
		Type:           "order.created",
		OccurredAt:     time.Date(2025, 6, 1, 14, 30, 15, 123456000, zone),
		Sequence:       ptr(int64(42)),
		Metadata:       json.RawMessage(`{"device_id": "d1", "headers": {"x-trace": ["a", "b"]}}`),
		Payload:        json.RawMessage(`{"n": 1, "text": "h\u00e9llo \"quoted\"", "nested": {"list": [1, 2.5, null, true]}}`),
		DeliveryHandle: json.RawMessage(`{"kind": "ws", "session": "s1"}`),
	}, {
		NativeID:   "minimal",
		Type:       "ping",
		OccurredAt: time.Date(2024, 2, 29, 0, 0, 0, 0, time.UTC),
		Metadata:   json.RawMessage(`{}`),
		Payload:    json.RawMessage(`{}`),
	}, {
		NativeID:   "sequence-zero",
		Type:       "ping",
		OccurredAt: eventTime,
		Sequence:   ptr(int64(0)),
		Metadata:   json.RawMessage(`{"device_id":"d2"}`),
		Payload:    json.RawMessage(`{"n":3}`),
	}, {
		NativeID:   "large",
		Type:       "blob",
		OccurredAt: eventTime,
		Metadata:   json.RawMessage(`{"device_id":"d1"}`),
		Payload:    json.RawMessage(large),
	}}
	res := h.appendNew(s.ID, 1, evs)
	h.appendNew(other.ID, 1, events("o", 2))
	h.ensureConsumer("reader", s.ID, earliest())
	h.ensureConsumer("reader-other", other.ID, earliest())
	got := h.readAll("reader")
	h.wantOffsets("read all", offsetsOf(got), span(1, 4))
	ids := map[string]bool{}
	for i := range min(len(got), len(evs)) {
		e := got[i]
		h.checkEvent(e, evs[i])
		if e.ID == "" || e.StreamID != s.ID || e.SourceID != "source-a" || !sameTime(e.StoredAt, res[i].StoredAt) {
			h.Errorf("%s: ID %q, StreamID %q, SourceID %q, StoredAt %v; want an ID, %q, source-a, %v", e.NativeID, e.ID, e.StreamID, e.SourceID, e.StoredAt, s.ID, res[i].StoredAt)
		}
		ids[e.ID] = true
	}
	for _, e := range h.readAll("reader-other") {
		ids[e.ID] = true
	}
	if len(ids) != len(evs)+2 {
		h.Errorf("%d distinct event IDs across two streams of %d events, want every ID unique", len(ids), len(evs)+2)
	}
}

func testReadFromAndLimit(h *harness) {
	s := h.stream("source")
	h.fill(s.ID, 5)
	h.ensureConsumer("reader", s.ID, atOffset(3))
	h.wantRead("reader", 0, 100, span(3, 5))
	b := h.wantRead("reader", 0, 2, span(3, 4))
	if b.HighWatermark != 5 {
		h.Errorf("HighWatermark %d, want 5", b.HighWatermark)
	}
	if b.Consumer.ID != "reader" || b.Consumer.NextOffset != 3 {
		h.Errorf("Batch.Consumer = %+v, want reader at NextOffset 3", b.Consumer)
	}
	h.wantRead("reader", 1, 2, span(1, 2))
	h.wantRead("reader", 4, 10, span(4, 5))
	h.wantRead("reader", 5, 1, span(5, 5))
	h.wantNext("reader", 3) // reads moved nothing
}

func testReadPastEnd(h *harness) {
	s := h.stream("source")
	h.fill(s.ID, 5)
	h.ensureConsumer("reader", s.ID, earliest())
	for _, from := range []int64{6, 100} {
		if b := h.wantRead("reader", from, 10, span(1, 0)); b.HighWatermark != 5 {
			h.Errorf("Read from %d: HighWatermark %d, want 5", from, b.HighWatermark)
		}
	}
	h.ensureConsumer("latest", s.ID, latest())
	h.wantRead("latest", 0, 10, span(1, 0))
}

func testReadEmptyStream(h *harness) {
	s := h.stream("source")
	h.ensureConsumer("reader", s.ID, earliest())
	if b := h.wantRead("reader", 0, 10, span(1, 0)); b.HighWatermark != 0 {
		h.Errorf("HighWatermark %d on an empty stream, want 0", b.HighWatermark)
	}
}

func testReadUnknownConsumer(h *harness) {
	h.stream("source")
	_, err := h.b.Read(h.ctx, "nobody", 0, 10)
	h.wantErr(err, stream.ErrConsumerNotFound, "Read with an unknown consumer")
}

func testConsumerCreated(h *harness) {
	s := h.stream("source")
	h.fill(s.ID, 2)
	c := h.ensureConsumer("sub-a", s.ID, atOffset(2))
	if c.ID != "sub-a" || c.StreamID != s.ID || c.Key == "" || c.NextOffset != 2 || !sameStart(c.Start, atOffset(2)) || c.CreatedAt.IsZero() || c.UpdatedAt.IsZero() {
		h.Errorf("EnsureConsumer = %+v, want sub-a on %s with a Key, NextOffset 2, Start at_offset 2, times set", c, s.ID)
	}
	got := h.consumer("sub-a")
	if got.ID != c.ID || got.StreamID != c.StreamID || got.Key != c.Key || got.NextOffset != c.NextOffset || !sameStart(got.Start, c.Start) || !sameTime(got.CreatedAt, c.CreatedAt) {
		h.Errorf("Consumer(sub-a) = %+v, want %+v", got, c)
	}
	if d := h.ensureConsumer("sub-b", s.ID, earliest()); d.Key == c.Key {
		h.Errorf("two consumers share the Key %q", d.Key)
	}
}

func testEnsureConsumerKeepsOffset(h *harness) {
	s := h.stream("source")
	h.fill(s.ID, 5)
	c := h.ensureConsumer("sub", s.ID, earliest())
	h.commit("sub", 3)
	for _, start := range []stream.Start{latest(), atOffset(1), earliest()} {
		again := h.ensureConsumer("sub", s.ID, start)
		if again.NextOffset != 4 || !sameStart(again.Start, earliest()) || again.Key != c.Key || !sameTime(again.CreatedAt, c.CreatedAt) {
			h.Errorf("EnsureConsumer(sub, %+v) again = %+v, want the existing consumer at NextOffset 4, started at earliest", start, again)
		}
	}
	h.wantNext("sub", 4)
}

func testConsumerOnAnotherStream(h *harness) {
	a, b := h.stream("source-a"), h.stream("source-b")
	h.ensureConsumer("sub", a.ID, earliest())
	_, err := h.b.EnsureConsumer(h.ctx, stream.ConsumerConfig{ID: "sub", StreamID: b.ID, Start: earliest()})
	h.wantErr(err, stream.ErrConsumerExists, "EnsureConsumer with the id of a consumer on another stream")
	if c := h.consumer("sub"); c.StreamID != a.ID {
		h.Errorf("consumer sub moved to stream %s, want %s", c.StreamID, a.ID)
	}
}

func testConsumerUnknown(h *harness) {
	h.stream("source")
	_, err := h.b.Consumer(h.ctx, "nobody")
	h.wantErr(err, stream.ErrConsumerNotFound, "Consumer(unknown)")
}

func testDeleteConsumer(h *harness) {
	s := h.stream("source")
	h.fill(s.ID, 3)
	h.ensureConsumer("gone", s.ID, earliest())
	h.commit("gone", 3)
	h.ensureConsumer("stays", s.ID, atOffset(2))
	if err := h.b.DeleteConsumer(h.ctx, "gone"); err != nil {
		h.Fatalf("DeleteConsumer: %v", err)
	}
	_, err := h.b.Consumer(h.ctx, "gone")
	h.wantErr(err, stream.ErrConsumerNotFound, "Consumer after DeleteConsumer")
	h.wantErr(h.b.DeleteConsumer(h.ctx, "gone"), stream.ErrConsumerNotFound, "DeleteConsumer twice")
	h.wantErr(h.b.DeleteConsumer(h.ctx, "nobody"), stream.ErrConsumerNotFound, "DeleteConsumer(unknown)")
	h.wantNext("stays", 2)
	if c := h.ensureConsumer("gone", s.ID, earliest()); c.NextOffset != 1 {
		h.Errorf("consumer created again after delete: NextOffset %d, want 1 (a fresh consumer)", c.NextOffset)
	}
}

func testConsumerUnknownStream(h *harness) {
	_, err := h.b.EnsureConsumer(h.ctx, stream.ConsumerConfig{ID: "sub", StreamID: "no-such-stream", Start: earliest()})
	h.wantErr(err, stream.ErrStreamNotFound, "EnsureConsumer on an unknown stream")
	_, err = h.b.Consumer(h.ctx, "sub")
	h.wantErr(err, stream.ErrConsumerNotFound, "Consumer after EnsureConsumer failed")
}

// invalidStarts are start positions no backend accepts.
var invalidStarts = []stream.Start{
	{Policy: "beginning"},
	{Policy: stream.StartAtOffset},
	{Policy: stream.StartAtOffset, Offset: -1},
	{Policy: stream.StartAtTime},
}

func testConsumerInvalidStart(h *harness) {
	s := h.stream("source")
	h.fill(s.ID, 2)
	for _, start := range invalidStarts {
		_, err := h.b.EnsureConsumer(h.ctx, stream.ConsumerConfig{ID: "sub", StreamID: s.ID, Start: start})
		h.wantErr(err, stream.ErrInvalidStart, fmt.Sprintf("EnsureConsumer(%+v)", start))
		_, err = h.b.Consumer(h.ctx, "sub")
		h.wantErr(err, stream.ErrConsumerNotFound, fmt.Sprintf("Consumer after EnsureConsumer(%+v) failed", start))
	}
}

// startCase is a consumer's start and the NextOffset it must begin at.
type startCase struct {
	id    string
	start stream.Start
	next  int64
}

func testStartPolicies(h *harness) {
	s := h.stream("source")
	h.fill(s.ID, 5)
	cases := []startCase{
		{"latest", latest(), 6},
		{"default", stream.Start{}, 6},
		{"earliest", earliest(), 1},
		{"at-offset-1", atOffset(1), 1},
		{"at-offset-3", atOffset(3), 3},
		{"at-offset-next", atOffset(6), 6},
	}
	_, err := h.b.EnsureConsumer(h.ctx, stream.ConsumerConfig{ID: "too-far", StreamID: s.ID, Start: atOffset(7)})
	h.wantErr(err, stream.ErrOffsetOutOfRange, "EnsureConsumer at_offset high watermark + 2")
	_, err = h.b.Consumer(h.ctx, "too-far")
	h.wantErr(err, stream.ErrConsumerNotFound, "Consumer after EnsureConsumer failed")
	h.checkStarts(s.ID, cases, 5)
}

func testStartPoliciesEmptyStream(h *harness) {
	s := h.stream("source")
	cases := []startCase{
		{"latest", latest(), 1},
		{"default", stream.Start{}, 1},
		{"earliest", earliest(), 1},
		{"at-offset-1", atOffset(1), 1},
	}
	if !h.features.NoAtTime {
		cases = append(cases, startCase{"at-time", atTime(time.Now()), 1})
	}
	_, err := h.b.EnsureConsumer(h.ctx, stream.ConsumerConfig{ID: "too-far", StreamID: s.ID, Start: atOffset(2)})
	h.wantErr(err, stream.ErrOffsetOutOfRange, "EnsureConsumer at_offset 2 on an empty stream")
	h.checkStarts(s.ID, cases, 0)
}

// checkStarts creates one consumer per case on a stream whose high
// watermark is hw, checks where each begins and what it reads, then
// appends one event and checks that each reads on to it.
func (h *harness) checkStarts(streamID string, cases []startCase, hw int64) {
	h.Helper()
	for _, c := range cases {
		got := h.ensureConsumer(c.id, streamID, c.start)
		if got.NextOffset != c.next || !sameStart(got.Start, c.start) {
			h.Errorf("consumer %s: NextOffset %d, Start %+v; want %d and %+v", c.id, got.NextOffset, got.Start, c.next, c.start)
		}
		h.wantRead(c.id, 0, 100, span(c.next, hw))
	}
	h.appendNew(streamID, hw+1, events("late", 1))
	for _, c := range cases {
		h.wantRead(c.id, 0, 100, span(c.next, hw+1))
		h.wantNext(c.id, c.next)
	}
}

// storeTwoBatches appends 3 events, waits for the clock to pass them,
// appends 3 more and returns the stored events and a time T after the
// first batch's StoredAt and at or before the second's.
func (h *harness) storeTwoBatches(streamID string) ([]stream.StoredEvent, time.Time) {
	h.Helper()
	h.appendNew(streamID, 1, events("before", 3))
	h.ensureConsumer("all", streamID, earliest())
	var last time.Time
	for _, e := range h.readAll("all") {
		if e.StoredAt.After(last) {
			last = e.StoredAt
		}
	}
	t := last.Add(time.Microsecond)
	h.waitClockPast(t)
	h.appendNew(streamID, 4, events("after", 3))
	all := h.readAll("all")
	if len(all) != 6 {
		h.Fatalf("read %d events, want 6", len(all))
	}
	for _, e := range all[3:] {
		if e.StoredAt.Before(t) {
			h.Fatalf("%s appended after the clock passed %v has StoredAt %v", e.NativeID, t, e.StoredAt)
		}
	}
	return all, t
}

func testStartAtTime(h *harness) {
	s := h.stream("source")
	all, t := h.storeTwoBatches(s.ID)
	cases := []startCase{
		{"after-first-batch", atTime(t), 4},
		{"at-a-stored-time", atTime(all[3].StoredAt), 4},
		{"before-everything", atTime(all[0].StoredAt.Add(-time.Hour)), 1},
		{"future", atTime(time.Now().Add(time.Hour)), 7},
	}
	h.checkStarts(s.ID, cases, 6)
}

func testCommitAdvances(h *harness) {
	s := h.stream("source")
	h.fill(s.ID, 5)
	prev := h.ensureConsumer("sub", s.ID, earliest())
	for _, offset := range []int64{2, 5} {
		c := h.commit("sub", offset)
		if c.UpdatedAt.Before(prev.UpdatedAt) {
			h.Errorf("commit %d: UpdatedAt %v before the previous %v", offset, c.UpdatedAt, prev.UpdatedAt)
		}
		h.wantNext("sub", offset+1)
		h.wantRead("sub", 0, 100, span(offset+1, 5))
		prev = c
	}
}

func testCommitAgain(h *harness) {
	s := h.stream("source")
	h.fill(s.ID, 5)
	h.ensureConsumer("sub", s.ID, earliest())
	h.commit("sub", 3)
	h.commit("sub", 3)
	h.wantNext("sub", 4)
}

func testCommitBehind(h *harness) {
	s := h.stream("source")
	h.fill(s.ID, 5)
	h.ensureConsumer("sub", s.ID, earliest())
	h.commit("sub", 3)
	for _, offset := range []int64{2, 1} {
		_, err := h.b.Commit(h.ctx, "sub", offset)
		h.wantErr(err, stream.ErrCommitBehind, fmt.Sprintf("Commit(%d) at NextOffset 4", offset))
	}
	h.wantNext("sub", 4)
}

func testCommitPastHighWatermark(h *harness) {
	s := h.stream("source")
	h.fill(s.ID, 5)
	h.ensureConsumer("sub", s.ID, earliest())
	for _, offset := range []int64{6, 100} {
		_, err := h.b.Commit(h.ctx, "sub", offset)
		h.wantErr(err, stream.ErrOffsetOutOfRange, fmt.Sprintf("Commit(%d) with high watermark 5", offset))
	}
	h.wantNext("sub", 1)
}

func testCommitUnknownConsumer(h *harness) {
	h.fill(h.stream("source").ID, 1)
	_, err := h.b.Commit(h.ctx, "nobody", 1)
	h.wantErr(err, stream.ErrConsumerNotFound, "Commit(unknown)")
}

func testCommitMovesOneConsumer(h *harness) {
	s, other := h.stream("source"), h.stream("other")
	h.fill(s.ID, 5)
	h.fill(other.ID, 5)
	h.ensureConsumer("a", s.ID, earliest())
	h.ensureConsumer("b", s.ID, earliest())
	h.ensureConsumer("c", other.ID, earliest())
	h.commit("a", 3)
	h.wantNext("a", 4)
	h.wantNext("b", 1)
	h.wantNext("c", 1)
	h.commit("b", 5)
	h.wantNext("a", 4)
	h.wantNext("b", 6)
	h.wantNext("c", 1)
	h.wantLag("a", 4, 5, 2)
	h.wantLag("c", 1, 5, 5)
}

func testResetEarliest(h *harness) {
	s := h.stream("source")
	h.fill(s.ID, 5)
	h.ensureConsumer("sub", s.ID, latest())
	h.reset("sub", earliest(), 1)
	h.commit("sub", 5)
	h.reset("sub", earliest(), 1)
	h.wantOffsets("read after reset", offsetsOf(h.readAll("sub")), span(1, 5))
}

func testResetAtOffset(h *harness) {
	s := h.stream("source")
	h.fill(s.ID, 5)
	h.ensureConsumer("sub", s.ID, earliest())
	h.reset("sub", atOffset(4), 4)
	h.wantRead("sub", 0, 100, span(4, 5))
	h.reset("sub", atOffset(2), 2)
	h.wantRead("sub", 0, 100, span(2, 5))
	h.reset("sub", atOffset(6), 6)
	_, err := h.b.Reset(h.ctx, "sub", atOffset(7))
	h.wantErr(err, stream.ErrOffsetOutOfRange, "Reset at_offset high watermark + 2")
	h.wantNext("sub", 6)
}

func testResetLatest(h *harness) {
	s := h.stream("source")
	h.fill(s.ID, 5)
	h.ensureConsumer("sub", s.ID, earliest())
	h.reset("sub", latest(), 6)
	h.wantRead("sub", 0, 100, span(1, 0))
	h.reset("sub", stream.Start{}, 6)
}

func testResetAtTime(h *harness) {
	s := h.stream("source")
	all, t := h.storeTwoBatches(s.ID)
	h.ensureConsumer("sub", s.ID, earliest())
	h.reset("sub", atTime(t), 4)
	h.wantRead("sub", 0, 100, span(4, 6))
	h.reset("sub", atTime(time.Now().Add(time.Hour)), 7)
	h.reset("sub", atTime(all[0].StoredAt.Add(-time.Hour)), 1)
}

func testResetUnknownConsumer(h *harness) {
	h.stream("source")
	_, err := h.b.Reset(h.ctx, "nobody", earliest())
	h.wantErr(err, stream.ErrConsumerNotFound, "Reset(unknown)")
}

func testResetInvalidStart(h *harness) {
	s := h.stream("source")
	h.fill(s.ID, 5)
	h.ensureConsumer("sub", s.ID, atOffset(3))
	for _, start := range invalidStarts {
		_, err := h.b.Reset(h.ctx, "sub", start)
		h.wantErr(err, stream.ErrInvalidStart, fmt.Sprintf("Reset(%+v)", start))
	}
	h.wantNext("sub", 3)
}

func testStatsEmpty(h *harness) {
	s := h.stream("source")
	if st := h.wantStats(s.ID, 0, 0, 0); !st.FirstStoredAt.IsZero() {
		h.Errorf("FirstStoredAt %v on an empty stream, want zero", st.FirstStoredAt)
	}
}

func testStatsAfterAppends(h *harness) {
	s := h.stream("source")
	h.appendNew(s.ID, 1, events("a", 4))
	h.appendNew(s.ID, 5, events("b", 3))
	h.append(s.ID, events("a", 2)) // duplicates count for nothing
	st := h.wantStats(s.ID, 7, 1, 7)
	if st.FirstStoredAt.IsZero() || st.LastStoredAt.IsZero() || st.LastStoredAt.Before(st.FirstStoredAt) {
		h.Errorf("FirstStoredAt %v, LastStoredAt %v; want both set, first not after last", st.FirstStoredAt, st.LastStoredAt)
	}
}

func testStatsUnknownStream(h *harness) {
	_, err := h.b.Stats(h.ctx, "no-such-stream")
	h.wantErr(err, stream.ErrStreamNotFound, "Stats(unknown)")
}

func testLagFollowsCommits(h *harness) {
	s := h.stream("source")
	h.fill(s.ID, 5)
	h.ensureConsumer("sub", s.ID, earliest())
	h.wantLag("sub", 1, 5, 5)
	h.commit("sub", 3)
	h.wantLag("sub", 4, 5, 2)
	h.appendNew(s.ID, 6, events("more", 2))
	h.wantLag("sub", 4, 7, 4)
	h.commit("sub", 7)
	h.wantLag("sub", 8, 7, 0)
}

func testLagLatest(h *harness) {
	s := h.stream("source")
	h.fill(s.ID, 5)
	h.ensureConsumer("sub", s.ID, latest())
	h.wantLag("sub", 6, 5, 0)
}

func testLagEmptyStream(h *harness) {
	s := h.stream("source")
	h.ensureConsumer("sub", s.ID, earliest())
	h.wantLag("sub", 1, 0, 0)
}

func testLagUnknownConsumer(h *harness) {
	h.stream("source")
	_, err := h.b.Lag(h.ctx, "nobody")
	h.wantErr(err, stream.ErrConsumerNotFound, "Lag(unknown)")
}

func testNoSubscription(h *harness) {
	const total = 1000
	s := h.stream("source")
	evs := events("e", total)
	for i := 0; i < total; i += 10 {
		h.appendNew(s.ID, int64(i)+1, evs[i:i+10])
	}
	h.wantStats(s.ID, total, 1, total)

	h.ensureConsumer("late", s.ID, earliest())
	next := int64(1)
	for {
		b := h.read("late", 0, 64)
		if len(b.Events) == 0 {
			break
		}
		for _, e := range b.Events {
			if e.Offset != next || e.NativeID != evs[next-1].NativeID {
				h.Fatalf("read %s at offset %d, want %s at %d", e.NativeID, e.Offset, evs[next-1].NativeID, next)
			}
			next++
		}
		h.commit("late", next-1)
	}
	if next != total+1 {
		h.Errorf("the earliest consumer read up to offset %d, want %d", next-1, total)
	}
	h.wantLag("late", total+1, total, 0)
	h.ensureConsumer("latest", s.ID, latest())
	h.wantLag("latest", total+1, total, 0)
}

func testConcurrentAppenders(h *harness) {
	const writers, each = 8, 250
	s := h.stream("source")
	ev := func(w, i int) stream.Event {
		return event(fmt.Sprintf("w%d-%d", w, i), fmt.Sprintf(`{"w":%d,"n":%d}`, w, i))
	}
	stored := make([]map[string]int64, writers) // per writer: native id → offset
	g, ctx := errgroup.WithContext(h.ctx)
	for w := range writers {
		g.Go(func() error {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			mine := map[string]int64{}
			var sent []int
			for next := 0; next < each; {
				n := min(1+rng.IntN(10), each-next)
				var batch []stream.Event
				var again []bool // again[i]: batch[i] is a redelivery
				for i := next; i < next+n; i++ {
					batch, again = append(batch, ev(w, i)), append(again, false)
				}
				for range rng.IntN(3) {
					if len(sent) > 0 {
						at := rng.IntN(len(batch) + 1)
						batch = slices.Insert(batch, at, ev(w, sent[rng.IntN(len(sent))]))
						again = slices.Insert(again, at, true)
					}
				}
				res, err := h.b.Append(ctx, s.ID, batch)
				if err != nil {
					return fmt.Errorf("writer %d: append: %w", w, err)
				}
				if len(res) != len(batch) {
					return fmt.Errorf("writer %d: %d results for %d events", w, len(res), len(batch))
				}
				for i, r := range res {
					id := batch[i].NativeID
					if again[i] {
						if !r.Duplicate || r.Err != nil || r.Offset != mine[id] {
							return fmt.Errorf("writer %d: redelivered %s: %+v, want Duplicate at offset %d", w, id, r, mine[id])
						}
						continue
					}
					if r.Duplicate || r.Err != nil || r.Offset < 1 {
						return fmt.Errorf("writer %d: %s: %+v, want a new event", w, id, r)
					}
					mine[id] = r.Offset
				}
				for i := next; i < next+n; i++ {
					sent = append(sent, i)
				}
				next += n
			}
			stored[w] = mine
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		h.Fatal(err)
	}

	byOffset := map[int64]string{}
	for _, mine := range stored {
		for id, o := range mine {
			if prev, ok := byOffset[o]; ok {
				h.Errorf("offset %d given to both %s and %s", o, prev, id)
			}
			byOffset[o] = id
		}
	}
	offsets := slices.Sorted(maps.Keys(byOffset))
	h.wantOffsets("offsets handed out", offsets, span(1, writers*each))
	h.wantStats(s.ID, writers*each, 1, writers*each)
	h.ensureConsumer("reader", s.ID, earliest())
	got := h.readAll("reader")
	h.wantOffsets("read all", offsetsOf(got), span(1, writers*each))
	for _, e := range got {
		if byOffset[e.Offset] != e.NativeID {
			h.Errorf("offset %d holds %s, but Append reported it for %s", e.Offset, e.NativeID, byOffset[e.Offset])
		}
	}
}

func testReopen(h *harness) {
	s := h.stream("source")
	evs := events("e", 5)
	orig := h.appendNew(s.ID, 1, evs)
	h.ensureConsumer("a", s.ID, earliest())
	h.commit("a", 3)
	h.ensureConsumer("b", s.ID, atOffset(2))
	before := h.read("b", 1, 100).Events
	consumers := []stream.Consumer{h.consumer("a"), h.consumer("b")}

	h.reopen()

	if again := h.stream("source"); again.ID != s.ID || !sameTime(again.CreatedAt, s.CreatedAt) {
		h.Errorf("EnsureStream after reopen = %+v, want %+v", again, s)
	}
	for _, c := range consumers {
		got := h.consumer(c.ID)
		if got.StreamID != c.StreamID || got.Key != c.Key || got.NextOffset != c.NextOffset || !sameStart(got.Start, c.Start) {
			h.Errorf("consumer %s after reopen = %+v, want %+v", c.ID, got, c)
		}
	}
	after := h.wantRead("b", 1, 100, span(1, 5)).Events
	for i := range min(len(after), len(before)) {
		h.checkEvent(after[i], evs[i])
		if after[i].ID != before[i].ID || !sameTime(after[i].StoredAt, before[i].StoredAt) {
			h.Errorf("offset %d after reopen: ID %q, StoredAt %v; want %q, %v", after[i].Offset, after[i].ID, after[i].StoredAt, before[i].ID, before[i].StoredAt)
		}
	}
	r := h.append(s.ID, evs[1:2])[0]
	if !r.Duplicate || r.Offset != 2 || !sameTime(r.StoredAt, orig[1].StoredAt) {
		h.Errorf("append e-2 again after reopen = %+v, want Duplicate at offset 2, StoredAt %v", r, orig[1].StoredAt)
	}
	h.appendNew(s.ID, 6, events("new", 2))
	h.wantRead("a", 0, 100, span(4, 7))
	h.commit("a", 7)
	h.wantStats(s.ID, 7, 1, 7)
}

func (h *harness) waiter() stream.Waiter {
	h.Helper()
	w, ok := h.b.(stream.Waiter)
	if !ok {
		h.Skip("the backend does not implement stream.Waiter")
	}
	return w
}

// startWait calls Wait in a goroutine. The goroutine ends when Wait
// returns; the test's cleanup cancels the context and waits for it.
func (h *harness) startWait(ctx context.Context, w stream.Waiter, streamID string, after int64) <-chan error {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		done <- w.Wait(ctx, streamID, after)
	}()
	h.Cleanup(func() {
		cancel()
		select {
		case <-ended:
		case <-time.After(5 * time.Second):
			h.Errorf("Wait did not return within 5s of its context's end")
		}
	})
	return done
}

// wantBlocked checks that Wait has not returned after a short while.
func (h *harness) wantBlocked(done <-chan error, what string) {
	h.Helper()
	select {
	case err := <-done:
		h.Fatalf("%s: Wait returned %v, want it blocked", what, err)
	case <-time.After(50 * time.Millisecond):
	}
}

// wantReturn checks that Wait returns within a few seconds.
func (h *harness) wantReturn(done <-chan error, what string) error {
	h.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		h.Fatalf("%s: Wait did not return within 5s", what)
		return nil
	}
}

func testWaitAhead(h *harness) {
	w := h.waiter()
	s := h.stream("source")
	h.fill(s.ID, 2)
	for _, after := range []int64{0, 1} {
		done := h.startWait(h.ctx, w, s.ID, after)
		if err := h.wantReturn(done, fmt.Sprintf("Wait(after %d) with high watermark 2", after)); err != nil {
			h.Errorf("Wait(after %d): %v", after, err)
		}
	}
}

func testWaitBlocks(h *harness) {
	w := h.waiter()
	s, other := h.stream("source"), h.stream("other")
	h.fill(s.ID, 1)
	done := h.startWait(h.ctx, w, s.ID, 1)
	h.wantBlocked(done, "Wait(after 1) with high watermark 1")
	h.fill(other.ID, 1)
	h.wantBlocked(done, "Wait after an append to another stream")
	h.appendNew(s.ID, 2, events("late", 1))
	if err := h.wantReturn(done, "Wait after an append"); err != nil {
		h.Errorf("Wait: %v", err)
	}
}

func testWaitContextEnd(h *harness) {
	w := h.waiter()
	s := h.stream("source")
	h.fill(s.ID, 1)
	ctx, cancel := context.WithCancel(h.ctx)
	done := h.startWait(ctx, w, s.ID, 1)
	h.wantBlocked(done, "Wait(after 1) with high watermark 1")
	cancel()
	h.wantErr(h.wantReturn(done, "Wait after cancel"), context.Canceled, "Wait after cancel")

	ctx, cancel = context.WithTimeout(h.ctx, 20*time.Millisecond)
	defer cancel()
	done = h.startWait(ctx, w, s.ID, 1)
	h.wantErr(h.wantReturn(done, "Wait past its deadline"), context.DeadlineExceeded, "Wait past its deadline")
}

func testStreamsList(h *harness) {
	got, err := h.b.Streams(h.ctx)
	if err != nil {
		h.Fatalf("Streams on an empty backend: %v", err)
	}
	if len(got) != 0 {
		h.Errorf("Streams on an empty backend = %+v, want none", got)
	}
	b, a := h.stream("source-b"), h.stream("source-a")
	got, err = h.b.Streams(h.ctx)
	if err != nil {
		h.Fatalf("Streams: %v", err)
	}
	want := []stream.Stream{a, b}
	if b.ID < a.ID {
		want = []stream.Stream{b, a}
	}
	if len(got) != 2 {
		h.Fatalf("Streams = %+v, want %+v", got, want)
	}
	for i := range got {
		if got[i].ID != want[i].ID || got[i].SourceID != want[i].SourceID || got[i].Backend != want[i].Backend || !sameTime(got[i].CreatedAt, want[i].CreatedAt) {
			h.Errorf("Streams[%d] = %+v, want %+v (every stream, by id)", i, got[i], want[i])
		}
	}
}

func testEventByOffset(h *harness) {
	s := h.stream("source")
	evs := events("e", 3)
	evs[1].Variant = "v"
	h.appendNew(s.ID, 1, evs)
	for i, want := range evs {
		got, err := h.b.Event(h.ctx, s.ID, int64(i+1))
		if err != nil {
			h.Fatalf("Event(%d): %v", i+1, err)
		}
		if got.Offset != int64(i+1) || got.StreamID != s.ID || got.SourceID != s.SourceID || got.ID == "" || got.StoredAt.IsZero() {
			h.Errorf("Event(%d) = offset %d, stream %q, source %q, id %q, stored %v", i+1, got.Offset, got.StreamID, got.SourceID, got.ID, got.StoredAt)
		}
		h.checkEvent(got, want)
	}
	for _, off := range []int64{0, 4, 1000} {
		_, err := h.b.Event(h.ctx, s.ID, off)
		h.wantErr(err, stream.ErrNotFound, fmt.Sprintf("Event(%d) of a stream holding 1..3", off))
	}
	_, err := h.b.Event(h.ctx, "no-such-stream", 1)
	h.wantErr(err, stream.ErrStreamNotFound, "Event in an unknown stream")
}

func testLookupByIdentity(h *harness) {
	s := h.stream("source")
	plain := event("a", `{"n":1}`)
	variant := event("a", `{"n":2}`)
	variant.Variant = "v2"
	other := event("b", `{"n":3}`)
	h.appendNew(s.ID, 1, []stream.Event{plain, variant, other})
	for _, c := range []struct {
		ev     stream.Event
		offset int64
	}{{plain, 1}, {variant, 2}, {other, 3}} {
		got, err := h.b.Lookup(h.ctx, s.ID, c.ev.NativeID, c.ev.Variant)
		if err != nil {
			h.Fatalf("Lookup(%s/%s): %v", c.ev.NativeID, c.ev.Variant, err)
		}
		if got.Offset != c.offset {
			h.Errorf("Lookup(%s/%s) = offset %d, want %d", c.ev.NativeID, c.ev.Variant, got.Offset, c.offset)
		}
		h.checkEvent(got, c.ev)
	}
	_, err := h.b.Lookup(h.ctx, s.ID, "a", "no-such-variant")
	h.wantErr(err, stream.ErrNotFound, "Lookup of a stored id under another variant")
	_, err = h.b.Lookup(h.ctx, s.ID, "never-stored", "")
	h.wantErr(err, stream.ErrNotFound, "Lookup of an id never stored")
	_, err = h.b.Lookup(h.ctx, "no-such-stream", "a", "")
	h.wantErr(err, stream.ErrStreamNotFound, "Lookup in an unknown stream")
}

func (h *harness) scanner() stream.Scanner {
	h.Helper()
	sc, ok := h.b.(stream.Scanner)
	if !ok {
		h.Skip("the backend does not implement stream.Scanner")
	}
	return sc
}

// backendOnly hides every optional interface of a backend, so that
// stream.ReadFrom takes its fallback.
type backendOnly struct{ stream.Backend }

func testScannerReads(h *harness) {
	sc := h.scanner()
	checkReadFrom(h, "Scanner.ReadFrom", sc.ReadFrom)
}

func testReadFromFallback(h *harness) {
	b := backendOnly{h.b}
	checkReadFrom(h, "stream.ReadFrom without a Scanner", func(ctx context.Context, streamID string, from int64, limit int) ([]stream.StoredEvent, error) {
		return stream.ReadFrom(ctx, b, streamID, from, limit)
	})
}

// checkReadFrom checks that read returns what a consumer's Read returns,
// by offset and limit.
func checkReadFrom(h *harness, what string, read func(ctx context.Context, streamID string, from int64, limit int) ([]stream.StoredEvent, error)) {
	s, other := h.stream("source"), h.stream("other")
	h.fill(s.ID, 5)
	h.fill(other.ID, 2)
	h.ensureConsumer("reader", s.ID, earliest())
	want := h.read("reader", 1, 100).Events
	for _, c := range []struct {
		from  int64
		limit int
		want  []int64
	}{{1, 100, span(1, 5)}, {3, 2, span(3, 4)}, {5, 1, span(5, 5)}, {6, 10, span(1, 0)}, {100, 10, span(1, 0)}} {
		got, err := read(h.ctx, s.ID, c.from, c.limit)
		if err != nil {
			h.Fatalf("%s(from %d, limit %d): %v", what, c.from, c.limit, err)
		}
		h.wantOffsets(fmt.Sprintf("%s(from %d, limit %d)", what, c.from, c.limit), offsetsOf(got), c.want)
		for _, e := range got {
			if w := want[e.Offset-1]; !reflect.DeepEqual(e, w) {
				h.Errorf("%s: offset %d is\n%+v\nwhere Read gives\n%+v", what, e.Offset, e, w)
			}
		}
	}
	_, err := read(h.ctx, "nowhere", 1, 10)
	h.wantErr(err, stream.ErrStreamNotFound, what+" of an unknown stream")
	_, err = read(h.ctx, s.ID, 0, 10)
	h.wantErr(err, stream.ErrOffsetOutOfRange, what+" from 0")
}

func (h *harness) auditor() stream.Auditor {
	h.Helper()
	a, ok := h.b.(stream.Auditor)
	if !ok {
		h.Skip("the backend does not implement stream.Auditor")
	}
	return a
}

func (h *harness) moves(a stream.Auditor, id string, limit int) []stream.Move {
	h.Helper()
	ms, err := a.Moves(h.ctx, id, limit)
	if err != nil {
		h.Fatalf("Moves(%q, %d): %v", id, limit, err)
	}
	return ms
}

func testAuditMoves(h *harness) {
	a := h.auditor()
	s := h.stream("source")
	h.fill(s.ID, 5)
	h.ensureConsumer("sub", s.ID, earliest())
	h.ensureConsumer("other", s.ID, earliest())
	if ms := h.moves(a, "sub", 10); len(ms) != 0 {
		h.Errorf("Moves of a new consumer = %+v, want none (creating one is no move)", ms)
	}
	h.commit("sub", 2)
	h.commit("sub", 2) // changes nothing: no move
	h.commit("other", 1)
	h.commit("sub", 4)
	h.reset("sub", atOffset(2), 2)
	h.commit("sub", 5)
	ms := h.moves(a, "sub", 10)
	type got struct {
		kind   string
		offset int64
		start  string
	}
	var gots []got
	for _, m := range ms {
		g := got{kind: m.Kind, offset: m.Offset}
		if m.Start != nil {
			g.start = fmt.Sprintf("%s@%d", m.Start.Policy, m.Start.Offset)
		}
		if m.ConsumerID != "sub" || m.StreamID != s.ID || m.At.IsZero() {
			h.Errorf("Moves: %+v, want consumer sub of stream %s and a time", m, s.ID)
		}
		gots = append(gots, g)
	}
	want := []got{{stream.MoveCommit, 5, ""}, {stream.MoveReset, 1, "at_offset@2"}, {stream.MoveCommit, 4, ""}, {stream.MoveCommit, 2, ""}}
	if !reflect.DeepEqual(gots, want) {
		h.Errorf("Moves(sub) = %+v, want %+v (newest first; a reset carries its start)", gots, want)
	}
	for i := 1; i < len(ms); i++ {
		if ms[i].At.After(ms[i-1].At) {
			h.Errorf("Moves(sub)[%d] at %v is after [%d] at %v: want newest first", i, ms[i].At, i-1, ms[i-1].At)
		}
	}
	if ms := h.moves(a, "sub", 2); len(ms) != 2 || ms[0].Offset != 5 || ms[1].Kind != stream.MoveReset {
		h.Errorf("Moves(sub, limit 2) = %+v, want the newest 2", ms)
	}
	if ms := h.moves(a, "other", 10); len(ms) != 1 || ms[0].Offset != 1 {
		h.Errorf("Moves(other) = %+v, want its one commit", ms)
	}
}

func testAuditUnknownConsumer(h *harness) {
	a := h.auditor()
	_, err := a.Moves(h.ctx, "nobody", 10)
	h.wantErr(err, stream.ErrConsumerNotFound, "Moves(unknown)")
}

func testAuditDeleted(h *harness) {
	a := h.auditor()
	s := h.stream("source")
	h.fill(s.ID, 3)
	h.ensureConsumer("sub", s.ID, earliest())
	h.commit("sub", 3)
	if err := h.b.DeleteConsumer(h.ctx, "sub"); err != nil {
		h.Fatalf("DeleteConsumer: %v", err)
	}
	_, err := a.Moves(h.ctx, "sub", 10)
	h.wantErr(err, stream.ErrConsumerNotFound, "Moves(deleted)")
	h.ensureConsumer("sub", s.ID, earliest())
	if ms := h.moves(a, "sub", 10); len(ms) != 0 {
		h.Errorf("Moves of a consumer made again under a deleted one's id = %+v, want none (the old moves went with it)", ms)
	}
}

// testSearch checks a stream.Searcher: each filter alone and together,
// newest first, by pages, and every event as Event returns it.
func testSearch(h *harness) {
	sr, ok := h.b.(stream.Searcher)
	if !ok {
		h.Skip("the backend does not implement stream.Searcher")
	}
	s, other := h.stream("source"), h.stream("other")
	h.fill(other.ID, 2)
	typed := func(id, variant, typ string) stream.Event {
		e := event(id, `{}`)
		e.Variant, e.Type = variant, typ
		return e
	}
	first := h.appendNew(s.ID, 1, []stream.Event{typed("a", "", "x"), typed("b", "", "y"), typed("c", "", "x")})
	h.waitClockPast(first[2].StoredAt)
	second := h.appendNew(s.ID, 4, []stream.Event{typed("d", "", "x"), typed("b", "v2", "y"), typed("e", "", "x")})
	tB := second[0].StoredAt
	if !tB.After(first[2].StoredAt) {
		h.Fatalf("the second batch is stored at %s, not after the first's %s", tB, first[2].StoredAt)
	}
	for _, c := range []struct {
		what string
		q    stream.Query
		want []int64
	}{
		{"every event", stream.Query{}, []int64{6, 5, 4, 3, 2, 1}},
		{"a page", stream.Query{Limit: 2}, []int64{6, 5}},
		{"the next page", stream.Query{Limit: 2, Before: 5}, []int64{4, 3}},
		{"by type", stream.Query{Type: "x"}, []int64{6, 4, 3, 1}},
		{"by type, a page", stream.Query{Type: "x", Before: 4, Limit: 1}, []int64{3}},
		{"by native id, any variant", stream.Query{NativeID: "b"}, []int64{5, 2}},
		{"since", stream.Query{Since: tB}, []int64{6, 5, 4}},
		{"until", stream.Query{Until: tB}, []int64{3, 2, 1}},
		{"since, by type", stream.Query{Since: tB, Type: "y"}, []int64{5}},
		{"until, by native id", stream.Query{Until: tB, NativeID: "b"}, []int64{2}},
		{"an empty range", stream.Query{Since: tB, Until: tB}, nil},
		{"no such type", stream.Query{Type: "z"}, nil},
	} {
		got, err := sr.Search(h.ctx, s.ID, c.q)
		if err != nil {
			h.Fatalf("Search(%s): %v", c.what, err)
		}
		h.wantOffsets("Search("+c.what+")", offsetsOf(got), c.want)
		for _, e := range got {
			want, err := h.b.Event(h.ctx, s.ID, e.Offset)
			if err != nil {
				h.Fatalf("Event(%d): %v", e.Offset, err)
			}
			if !reflect.DeepEqual(e, want) {
				h.Errorf("Search(%s): offset %d is\n%+v\nwhere Event gives\n%+v", c.what, e.Offset, e, want)
			}
		}
	}
	_, err := sr.Search(h.ctx, "nowhere", stream.Query{})
	h.wantErr(err, stream.ErrStreamNotFound, "Search of an unknown stream")
}
