package streamnats_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-events/postbox/internal/natstest"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/stream"
	"github.com/postbox-events/postbox/stream/streamnats"
	"github.com/postbox-events/postbox/stream/streamtest"
)

// features: JetStream can do everything the suite checks.
var features = streamtest.Features{}

func TestConformance(t *testing.T) {
	url := natstest.Start(t)
	streamtest.Run(t, features, newBackend(url, "T_", streamnats.Config{}))
}

// TestConformanceServer runs the suite against the NATS of
// POSTBOX_TEST_NATS, under a prefix of its own that it deletes afterwards.
func TestConformanceServer(t *testing.T) {
	url := testenv.URL(t, testenv.NATS)
	prefix := runPrefix()
	t.Cleanup(func() { deleteStreams(t, url, prefix) })
	streamtest.Run(t, features, newBackend(url, prefix, streamnats.Config{}))
}

// TestConformanceCluster runs the suite on a 3-node cluster with every
// stream and the consumer bucket on 3 replicas.
func TestConformanceCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-node cluster is slow to start; -short skips it")
	}
	c := natstest.StartCluster(t, 3)
	streamtest.Run(t, features, newBackend(c.URL(), "T_", streamnats.Config{Replicas: 3}))
}

// newBackend opens a Backend per store name, each under its own prefix.
func newBackend(url, prefix string, cfg streamnats.Config) streamtest.NewBackend {
	return func(t *testing.T, name string) stream.Backend {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		cfg := cfg
		cfg.URL, cfg.Prefix = url, prefix+name+"_"
		b, err := streamnats.Open(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
}

var runSeq int

// runPrefix is a prefix no other test run uses.
func runPrefix() string {
	runSeq++
	return fmt.Sprintf("PBT%d_%d_%d_", os.Getpid(), time.Now().UnixNano()%1e9, runSeq)
}

// deleteStreams deletes every stream whose name begins with prefix,
// consumer buckets included.
func deleteStreams(t testing.TB, url, prefix string) {
	nc, err := nats.Connect(url)
	if err != nil {
		t.Errorf("clean up %s: %v", prefix, err)
		return
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	names := js.StreamNames(ctx)
	var doomed []string
	for n := range names.Name() {
		if strings.HasPrefix(n, prefix) || strings.HasPrefix(n, "KV_"+prefix) {
			doomed = append(doomed, n)
		}
	}
	for _, n := range doomed {
		if err := js.DeleteStream(ctx, n); err != nil {
			t.Errorf("clean up stream %s: %v", n, err)
		}
	}
}
