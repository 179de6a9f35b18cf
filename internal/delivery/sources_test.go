package delivery_test

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/stream"
)

// TestSources: a source is created with its stream and its settings as
// given, again with the same definition as a no-op and with another as a
// conflict; it has no checkpoint until one is written; a source that a
// subscription reads is not deleted (the error names it), and once that
// is deleted the source goes, its stream and events staying.
func TestSources(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		e := setup(t, kind, delivery.Config{})
		ctx := context.Background()
		src, created, err := e.d.CreateSource(ctx, delivery.Source{Name: "gh", Kind: delivery.KindWebhook,
			Settings: json.RawMessage(`{ "preset": "github",  "secrets": ["s3cret"] }`)})
		if err != nil || !created || src.Stream != "gh" || string(src.Settings) != `{"preset":"github","secrets":["s3cret"]}` {
			t.Fatalf("CreateSource: %+v %v %v", src, created, err)
		}
		if _, err := e.streams.Stats(ctx, "gh"); err != nil {
			t.Fatalf("the source's stream: %v", err)
		}
		if _, created, err := e.d.CreateSource(ctx, delivery.Source{Name: "gh", Kind: delivery.KindWebhook,
			Settings: json.RawMessage(`{"preset":"github","secrets":["s3cret"]}`)}); err != nil || created {
			t.Fatalf("CreateSource again: %v %v, want exists", created, err)
		}
		if _, _, err := e.d.CreateSource(ctx, delivery.Source{Name: "gh", Kind: delivery.KindWebhook,
			Settings: json.RawMessage(`{"preset":"stripe"}`)}); !errors.Is(err, delivery.ErrConflict) {
			t.Fatalf("CreateSource with other settings: %v, want ErrConflict", err)
		}
		for _, bad := range []delivery.Source{
			{Name: "no/slash", Kind: delivery.KindWebhook},
			{Name: "x", Kind: ""},
			{Name: "x", Kind: delivery.KindWebhook, Settings: json.RawMessage(`[1]`)},
			{Name: "x", Kind: delivery.KindWebhook, Stream: "y"},
		} {
			if _, _, err := e.d.CreateSource(ctx, bad); !errors.Is(err, delivery.ErrInvalid) {
				t.Errorf("CreateSource(%+v): %v, want ErrInvalid", bad, err)
			}
		}
		if _, _, err := e.d.CreateSource(ctx, delivery.Source{Name: "a-devices", Kind: delivery.KindDevice}); err != nil {
			t.Fatal(err)
		}
		srcs, err := e.d.Sources(ctx)
		if err != nil || len(srcs) != 2 || srcs[0].Name != "a-devices" || srcs[1].Name != "gh" || string(srcs[0].Settings) != `{}` {
			t.Fatalf("Sources: %+v %v", srcs, err)
		}
		if !srcs[1].Checkpoint.UpdatedAt.IsZero() || srcs[1].Checkpoint.Cursor != "" {
			t.Fatalf("a webhook source's checkpoint: %+v, want none", srcs[1].Checkpoint)
		}

		if _, _, err := e.d.Create(ctx, delivery.Subscription{Name: "gh-events", Source: "gh", Start: stream.Start{Policy: stream.StartEarliest}}); err != nil {
			t.Fatalf("a subscription on a created source: %v", err)
		}
		err = e.d.DeleteSource(ctx, "gh")
		if !errors.Is(err, delivery.ErrConflict) || !strings.Contains(err.Error(), "gh-events") {
			t.Fatalf("DeleteSource of a source read: %v, want ErrConflict naming gh-events", err)
		}
		if _, err := e.d.Source(ctx, "gh"); err != nil {
			t.Fatalf("the source after a refused delete: %v", err)
		}
		if err := e.d.Delete(ctx, "gh-events"); err != nil {
			t.Fatal(err)
		}
		if err := e.d.DeleteSource(ctx, "gh"); err != nil {
			t.Fatalf("DeleteSource: %v", err)
		}
		if _, err := e.d.Source(ctx, "gh"); !errors.Is(err, delivery.ErrNotFound) {
			t.Fatalf("Source after delete: %v, want ErrNotFound", err)
		}
		if err := e.d.DeleteSource(ctx, "gh"); !errors.Is(err, delivery.ErrNotFound) {
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
			_, _, err := e.d.CreateSource(ctx, delivery.Source{Name: "webhooks", Kind: delivery.KindWebhook})
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
		if err := e.d.DeleteSource(ctx, "webhooks"); err != nil {
			t.Fatal(err)
		}
		e.stop()

		e = open(t, kind, openOptions{streams: streams, state: e.stateAt})
		if err := e.d.Once(ctx, "default-sources", create); err != nil || runs != 1 {
			t.Fatalf("Once after reopening: %v, %d runs, want 1", err, runs)
		}
		if _, err := e.d.Source(ctx, "webhooks"); !errors.Is(err, delivery.ErrNotFound) {
			t.Fatalf("the deleted source after reopening: %v, want ErrNotFound", err)
		}
		ran := false
		if err := e.d.Once(ctx, "m-fails", func(context.Context) error { ran = true; return nil }); err != nil || !ran {
			t.Fatalf("Once after a failure: %v, ran %v", err, ran)
		}
	})
}
