package kafkatest_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/postbox-events/postbox/internal/kafkatest"
)

// TestRestartKeepsRecords: records produced before Stop are there after
// Restart, on the same address.
func TestRestartKeepsRecords(t *testing.T) {
	c := kafkatest.Start(t, 1, "t")
	produce := func(v string) {
		t.Helper()
		cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers()...), kgo.DefaultProduceTopic("t"))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	produce("a")
	c.Stop()
	c.Restart()
	produce("b")
	if n := c.Count("t"); n != 2 {
		t.Fatalf("count %d after a restart, want 2", n)
	}
	recs := c.Read("t", 2)
	if string(recs[0].Value) != "a" || string(recs[1].Value) != "b" {
		t.Errorf("read %q, %q; want a, b", recs[0].Value, recs[1].Value)
	}
}
