package intake_test

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/intake"
	"github.com/postbox-events/postbox/stream"
)

// TestSources: a source is created with its stream and its settings as
// given, again with the same definition as a no-op and with another as a
// conflict; it has no checkpoint until one is written; a source that a
// subscription reads is not deleted (the error names it), and once that
// is deleted the source goes, its stream and events staying.
func TestSources(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		e := open(t, kind, openOptions{})
		ctx := context.Background()
		src, created, err := e.st.CreateSource(ctx, intake.Source{Name: "gh", Kind: intake.KindWebhook,
			Settings: json.RawMessage(`{ "preset": "github",  "secrets": ["s3cret"] }`)})
		if err != nil || !created || src.Stream != "gh" || string(src.Settings) != `{"preset":"github","secrets":["s3cret"]}` {
			t.Fatalf("CreateSource: %+v %v %v", src, created, err)
		}
		if _, err := e.streams.Stats(ctx, "gh"); err != nil {
			t.Fatalf("the source's stream: %v", err)
		}
		if _, created, err := e.st.CreateSource(ctx, intake.Source{Name: "gh", Kind: intake.KindWebhook,
			Settings: json.RawMessage(`{"preset":"github","secrets":["s3cret"]}`)}); err != nil || created {
			t.Fatalf("CreateSource again: %v %v, want exists", created, err)
		}
		if _, _, err := e.st.CreateSource(ctx, intake.Source{Name: "gh", Kind: intake.KindWebhook,
			Settings: json.RawMessage(`{"preset":"stripe"}`)}); !errors.Is(err, intake.ErrConflict) {
			t.Fatalf("CreateSource with other settings: %v, want ErrConflict", err)
		}
		for _, bad := range []intake.Source{
			{Name: "no/slash", Kind: intake.KindWebhook},
			{Name: "x", Kind: ""},
			{Name: "x", Kind: intake.KindWebhook, Settings: json.RawMessage(`[1]`)},
			{Name: "x", Kind: intake.KindWebhook, Stream: "y"},
		} {
			if _, _, err := e.st.CreateSource(ctx, bad); !errors.Is(err, intake.ErrInvalid) {
				t.Errorf("CreateSource(%+v): %v, want ErrInvalid", bad, err)
			}
		}
		if _, _, err := e.st.CreateSource(ctx, intake.Source{Name: "a-devices", Kind: intake.KindDevice}); err != nil {
			t.Fatal(err)
		}
		srcs, err := e.st.Sources(ctx)
		if err != nil || len(srcs) != 2 || srcs[0].Name != "a-devices" || srcs[1].Name != "gh" || string(srcs[0].Settings) != `{}` {
			t.Fatalf("Sources: %+v %v", srcs, err)
		}
		if !srcs[1].Checkpoint.UpdatedAt.IsZero() || srcs[1].Checkpoint.Cursor != "" {
			t.Fatalf("a webhook source's checkpoint: %+v, want none", srcs[1].Checkpoint)
		}

		if _, _, err := e.d.Create(ctx, delivery.Subscription{Name: "gh-events", Source: "gh", Start: stream.Start{Policy: stream.StartEarliest}}); err != nil {
			t.Fatalf("a subscription on a created source: %v", err)
		}
		err = e.st.DeleteSource(ctx, "gh")
		if !errors.Is(err, intake.ErrConflict) || !strings.Contains(err.Error(), "gh-events") {
			t.Fatalf("DeleteSource of a source read: %v, want ErrConflict naming gh-events", err)
		}
		if _, err := e.st.Source(ctx, "gh"); err != nil {
			t.Fatalf("the source after a refused delete: %v", err)
		}
		if err := e.d.Delete(ctx, "gh-events"); err != nil {
			t.Fatal(err)
		}
		if err := e.st.DeleteSource(ctx, "gh"); err != nil {
			t.Fatalf("DeleteSource: %v", err)
		}
		if _, err := e.st.Source(ctx, "gh"); !errors.Is(err, intake.ErrNotFound) {
			t.Fatalf("Source after delete: %v, want ErrNotFound", err)
		}
		if err := e.st.DeleteSource(ctx, "gh"); !errors.Is(err, intake.ErrNotFound) {
			t.Fatalf("DeleteSource again: %v, want ErrNotFound", err)
		}
		if _, err := e.streams.Stats(ctx, "gh"); err != nil {
			t.Fatalf("the stream after its source was deleted: %v", err)
		}
	})
}

// TestOnce: Once runs its function once in the store's life, across
// reopening the store, and not again after what it created was deleted;
// a function that fails is run again next time.
func TestOnce(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		streams := filepath.Join(t.TempDir(), "p.db")
		e := open(t, kind, openOptions{streams: streams})
		ctx := context.Background()
		runs := 0
		create := func(ctx context.Context) error {
			runs++
			_, _, err := e.st.CreateSource(ctx, intake.Source{Name: "webhooks", Kind: intake.KindWebhook})
			return err
		}
		failing := func(context.Context) error { return errors.New("not now") }
		if err := e.d.Once(ctx, "m-fails", failing); err == nil {
			t.Fatal("Once of a failing function: no error")
		}
		if err := e.d.Once(ctx, "default-sources", create); err != nil || runs != 1 {
			t.Fatalf("Once: %v, %d runs", err, runs)
		}
		if err := e.d.Once(ctx, "default-sources", create); err != nil || runs != 1 {
			t.Fatalf("Once again: %v, %d runs, want 1", err, runs)
		}
		if err := e.st.DeleteSource(ctx, "webhooks"); err != nil {
			t.Fatal(err)
		}
		e.stop()

		e = open(t, kind, openOptions{streams: streams, state: e.stateAt})
		if err := e.d.Once(ctx, "default-sources", create); err != nil || runs != 1 {
			t.Fatalf("Once after reopening: %v, %d runs, want 1", err, runs)
		}
		if _, err := e.st.Source(ctx, "webhooks"); !errors.Is(err, intake.ErrNotFound) {
			t.Fatalf("the deleted source after reopening: %v, want ErrNotFound", err)
		}
		ran := false
		if err := e.d.Once(ctx, "m-fails", func(context.Context) error { ran = true; return nil }); err != nil || !ran {
			t.Fatalf("Once after a failure: %v, ran %v", err, ran)
		}
	})
}

// TestClaimDigest: a digest claimed by one key is that key's for the
// window, whoever else claims it, also at once; the same key claims it
// again; after the window the next key takes it; sources are apart.
func TestClaimDigest(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		ctx := context.Background()
		e := open(t, kind, openOptions{})
		claim := func(source, digest, key string) string {
			t.Helper()
			owner, err := e.st.ClaimDigest(ctx, source, digest, key, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			return owner
		}
		if got := claim("gh", "d1", "delivery-1"); got != "delivery-1" {
			t.Fatalf("first claim: owner %q", got)
		}
		if got := claim("gh", "d1", "delivery-1"); got != "delivery-1" {
			t.Fatalf("the same key again: owner %q", got)
		}
		if got := claim("gh", "d1", "replay-1"); got != "delivery-1" {
			t.Fatalf("another key within the window: owner %q, want delivery-1", got)
		}
		if got := claim("gh2", "d1", "replay-1"); got != "replay-1" {
			t.Fatalf("another source: owner %q", got)
		}
		owners := make([]string, 8)
		var wg sync.WaitGroup
		for i := range owners {
			wg.Go(func() { owners[i] = claim("gh", "d2", string(rune('a'+i))) })
		}
		wg.Wait()
		for _, o := range owners {
			if o != owners[0] {
				t.Fatalf("claims at once: owners %q, want one", owners)
			}
		}
		e.clock.Advance(time.Hour + time.Second)
		if got := claim("gh", "d1", "later-1"); got != "later-1" {
			t.Fatalf("after the window: owner %q, want later-1", got)
		}
		// Claims delete expired rows (d2's and gh2's d1 expired).
		if n := e.count(t, `SELECT COUNT(*) FROM webhook_digests WHERE expires_at <= ?`, e.clock.Now().Format("2006-01-02T15:04:05.000000Z")); n != 0 {
			t.Fatalf("%d expired rows left after a claim", n)
		}
	})
}
