package streamkafka_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/kafkatest"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/stream"
	"github.com/postbox-events/postbox/stream/streamkafka"
	"github.com/postbox-events/postbox/stream/streamtest"
)

// features: Kafka and the index can do everything the suite checks.
var features = streamtest.Features{}

// TestConformance runs the suite on one kfake broker with a SQLite index:
// a file per store name in a directory of the outer test, and a topic
// prefix per store name.
func TestConformance(t *testing.T) {
	c := kafkatest.Start(t, 1)
	dir := t.TempDir()
	streamtest.Run(t, features, newBackend(c, func(name string) string { return filepath.Join(dir, name+".db") }, streamkafka.Config{}))
}

// TestConformancePostgres runs the suite with the index in the
// PostgreSQL of POSTBOX_TEST_POSTGRES, in a schema per store name,
// dropped when the test ends.
func TestConformancePostgres(t *testing.T) {
	url := testenv.URL(t, testenv.Postgres)
	c := kafkatest.Start(t, 1)
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	streamtest.Run(t, features, func(t *testing.T, name string) stream.Backend {
		schema := "sk_" + run + "_" + hash(name)
		t.Cleanup(func() { testenv.DropSchema(t, url, schema) })
		return open(t, c, streamkafka.Config{Index: url, IndexSchema: schema, Prefix: prefix(name)})
	})
}

// TestConformanceCluster runs the suite on a 3-broker cluster with every
// topic on 3 replicas.
func TestConformanceCluster(t *testing.T) {
	c := kafkatest.Start(t, 3)
	dir := t.TempDir()
	streamtest.Run(t, features, newBackend(c, func(name string) string { return filepath.Join(dir, name+".db") }, streamkafka.Config{ReplicationFactor: 3}))
}

// newBackend opens a Backend per store name, each under its own prefix
// and with its own index.
func newBackend(c *kafkatest.Cluster, index func(name string) string, cfg streamkafka.Config) streamtest.NewBackend {
	return func(t *testing.T, name string) stream.Backend {
		cfg := cfg
		cfg.Index, cfg.Prefix = index(name), prefix(name)
		return open(t, c, cfg)
	}
}

func open(t testing.TB, c *kafkatest.Cluster, cfg streamkafka.Config) *streamkafka.Backend {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg.Brokers = c.Brokers()
	b, err := streamkafka.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// prefix is a topic prefix of its own for a store name: short, since
// test names are long.
func prefix(name string) string { return "t" + hash(name) + "." }

func hash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:6])
}
