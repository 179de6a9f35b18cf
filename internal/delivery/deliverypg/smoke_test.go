package deliverypg_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/delivery/deliverypg"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/stream"
	"github.com/postbox-events/postbox/stream/streamsqlite"
)

func TestSmoke(t *testing.T) {
	u := testenv.PostgresSchema(t)
	pu, _ := url.Parse(u)
	schema := pu.Query().Get("search_path")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	streams, err := streamsqlite.Open(filepath.Join(t.TempDir(), "s.db"), streamsqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	go streams.Run(ctx)
	streams.EnsureStream(ctx, "devices")
	var ds []*delivery.Delivery
	for i := range 2 {
		st, err := deliverypg.Open(ctx, deliverypg.Config{URL: u, Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		d, err := delivery.New(ctx, streams, st, delivery.Config{Node: fmt.Sprint("n", i)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.Recover(ctx); err != nil {
			t.Fatal(err)
		}
		go d.Run(ctx)
		ds = append(ds, d)
	}
	if _, _, err := ds[0].Create(ctx, delivery.Subscription{Name: "s1", Source: "devices", Start: stream.Start{Policy: stream.StartEarliest}}); err != nil {
		t.Fatal(err)
	}
	var evs []stream.Event
	for i := range 50 {
		evs = append(evs, stream.Event{NativeID: fmt.Sprint("e", i), Type: "t", OccurredAt: time.Now(), Metadata: json.RawMessage(`{}`), Payload: json.RawMessage(`{"a":1}`)})
	}
	if _, err := streams.Append(ctx, "devices", evs); err != nil {
		t.Fatal(err)
	}
	got := 0
	for got < 50 {
		l, err := ds[got%2].Lease(ctx, "s1", 7, time.Minute, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var ids []int64
		for _, it := range l.Items {
			ids = append(ids, it.ID)
		}
		res, err := ds[1].Ack(ctx, "s1", ids, l.Token)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			if r.Err != nil {
				t.Fatal(r.Err)
			}
		}
		got += len(ids)
		t.Log("leased", len(ids))
	}
	c, err := ds[0].Inboxes(ctx)
	t.Log(c, err)
}
