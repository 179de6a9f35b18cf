package server

import (
	"context"
	"net"
	"net/http"
	"reflect"
	"testing"

	"github.com/postbox-events/postbox/internal/appendq"
	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/groupcommit"
	"github.com/postbox-events/postbox/internal/ingress"
	iserver "github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/wsping"
	"github.com/postbox-events/postbox/stream/streamsqlite"
)

// fill sets every field of the struct v points to that is a number,
// string, bool or slice of strings to a value of its own, recursing into
// structs, and returns how many it set.
func fill(t *testing.T, v reflect.Value, n *int) {
	for i := range v.NumField() {
		f := v.Field(i)
		*n++
		switch f.Kind() {
		case reflect.String:
			f.SetString("s" + string(rune('a'+*n%26)))
		case reflect.Int, reflect.Int64:
			f.SetInt(int64(*n))
		case reflect.Float64:
			f.SetFloat(float64(*n))
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Slice:
			if f.Type().Elem().Kind() == reflect.String {
				f.Set(reflect.ValueOf([]string{"x", "y"}))
			}
		case reflect.Struct:
			fill(t, f, n)
		}
	}
}

// same checks that every field of pub has the same value in in under the
// same name (recursing into structs), but for the names in skip.
func same(t *testing.T, path string, pub, in reflect.Value, skip map[string]bool) {
	for i := range pub.NumField() {
		name := pub.Type().Field(i).Name
		if skip[path+name] {
			continue
		}
		f := in.FieldByName(name)
		if !f.IsValid() {
			t.Errorf("Config.%s%s has no internal field of its name: map it in Config.internal and skip it here", path, name)
			continue
		}
		if pub.Field(i).Kind() == reflect.Struct && pub.Field(i).Type().PkgPath() == pub.Type().PkgPath() {
			same(t, path+name+".", pub.Field(i), f, skip)
			continue
		}
		if !reflect.DeepEqual(pub.Field(i).Interface(), f.Interface()) {
			t.Errorf("Config.%s%s = %v maps to %v", path, name, pub.Field(i).Interface(), f.Interface())
		}
	}
}

// TestConfigInternal: every field of Config reaches the control plane.
func TestConfigInternal(t *testing.T) {
	var cfg Config
	n := 0
	fill(t, reflect.ValueOf(&cfg).Elem(), &n)
	cfg.Synchronous = "normal"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	db, err := streamsqlite.Open(t.TempDir()+"/p.db", streamsqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	cfg.Listener, cfg.GRPCListener, cfg.Streams, cfg.Store = ln, ln, db, db
	cfg.Delivery.HTTPClient = &http.Client{}
	cfg.Tokens = Tokens{"secret": "device-1"}
	var seen *Item
	cfg.Handlers = map[string]Handler{"orders": func(_ context.Context, it *Item) error { seen = it; return nil }}

	in := cfg.internal()
	same(t, "", reflect.ValueOf(cfg), reflect.ValueOf(in), map[string]bool{"Synchronous": true, "Tokens": true, "Handlers": true, "Store": true})
	if in.Synchronous != "NORMAL" {
		t.Errorf("Synchronous %q maps to %q, want NORMAL", cfg.Synchronous, in.Synchronous)
	}
	if any(in.Store) != any(db) {
		t.Errorf("Store maps to %v, want the backend given", in.Store)
	}
	if d, ok := in.Tokens.Device("secret"); !ok || d != "device-1" {
		t.Errorf("Tokens map to %v: the token's device is %q, %v", in.Tokens, d, ok)
	}
	if _, ok := in.Tokens.Device("device-1"); ok {
		t.Error("the device id is a token")
	}
	last := "timeout"
	it := &delivery.Item{ID: 7, Inbox: "orders", Subscription: "orders-sub", Stream: "devices", Offset: 41, EventID: "evt-1",
		Type: "order.paid", Payload: []byte(`{"id":1}`), Metadata: []byte(`{}`), State: delivery.StateProcessing,
		Attempts: 2, LastError: &last}
	if err := in.Handlers["orders"](context.Background(), it); err != nil {
		t.Fatal(err)
	}
	want := &Item{ID: 7, Inbox: "orders", Subscription: "orders-sub", Stream: "devices", Offset: 41, EventID: "evt-1",
		Type: "order.paid", Payload: []byte(`{"id":1}`), Metadata: []byte(`{}`), State: StateProcessing, Attempts: 2, LastError: "timeout"}
	if !reflect.DeepEqual(seen, want) {
		t.Errorf("the handler saw %+v, want %+v", seen, want)
	}
	if (Config{}).internal().Tokens != nil {
		t.Error("nil Tokens map to a table: the ingress would require tokens no one has")
	}
	var _ ingress.Tokens = in.Tokens
}

// TestDefaults: the documented defaults are the ones the control plane
// applies.
func TestDefaults(t *testing.T) {
	for _, c := range []struct {
		name      string
		pub, want any
	}{
		{"DBPath", DefaultDBPath, iserver.DefaultDBPath},
		{"MaxBatch", DefaultMaxBatch, groupcommit.DefaultMaxBatch},
		{"QueueSize", DefaultQueueSize, groupcommit.DefaultQueueSize},
		{"QueueBytes", DefaultQueueBytes, appendq.DefaultQueueBytes},
		{"QueueBytes (SQLite)", DefaultQueueBytes, streamsqlite.DefaultQueueBytes},
		{"ReadTimeout", DefaultReadTimeout, iserver.DefaultReadTimeout},
		{"IdleTimeout", DefaultIdleTimeout, iserver.DefaultIdleTimeout},
		{"MaxHeaderBytes", DefaultMaxHeaderBytes, iserver.DefaultMaxHeaderBytes},
		{"MaxConnections", DefaultMaxConnections, iserver.DefaultMaxConnections},
		{"StoreProbeInterval", DefaultStoreProbeInterval, iserver.DefaultStoreProbeInterval},
		{"PingInterval", DefaultPingInterval, wsping.DefaultInterval},
		{"PingTimeout", DefaultPingTimeout, wsping.DefaultTimeout},
		{"WSMaxConnections", DefaultWSMaxConnections, ingress.DefaultMaxConnections},
		{"WSMaxConnectionsPerAddress", DefaultWSMaxConnectionsPerAddress, ingress.DefaultMaxConnectionsPerAddress},
		{"WSBufferBytes", int64(DefaultWSBufferBytes), int64(ingress.DefaultMaxBufferedBytes)},
		{"WSMaxFrameBytes", int64(DefaultWSMaxFrameBytes), int64(ingress.DefaultMaxFrameBytes)},
		{"WSFrameTimeout", DefaultWSFrameTimeout, ingress.DefaultFrameTimeout},
		{"Webhooks.MaxBytes", int64(DefaultWebhookMaxBytes), int64(iserver.DefaultWebhookMaxBytes)},
		{"Workers", DefaultWorkers, delivery.DefaultWorkers},
		{"MaxAttempts", DefaultMaxAttempts, delivery.DefaultMaxAttempts},
		{"RetryBaseDelay", DefaultRetryBaseDelay, delivery.DefaultRetryBaseDelay},
		{"RetryMaxDelay", DefaultRetryMaxDelay, delivery.DefaultRetryMaxDelay},
		{"HandlerTimeout", DefaultHandlerTimeout, delivery.DefaultHandlerTimeout},
		{"Retention", DefaultRetention, delivery.DefaultRetention},
		{"CleanupInterval", DefaultCleanupInterval, delivery.DefaultCleanupInterval},
		{"LeaseTTL", DefaultLeaseTTL, delivery.DefaultLeaseTTL},
		{"DeviceSource", DeviceSource, iserver.DeviceSource},
		{"WebhookSource", WebhookSource, iserver.WebhookSource},
		{"StatePending", string(StatePending), delivery.StatePending},
		{"StateProcessing", string(StateProcessing), delivery.StateProcessing},
		{"StateCompleted", string(StateCompleted), delivery.StateCompleted},
		{"StateFailed", string(StateFailed), delivery.StateFailed},
	} {
		if c.pub != c.want {
			t.Errorf("the default of %s is %v here, %v in the control plane", c.name, c.pub, c.want)
		}
	}
}
