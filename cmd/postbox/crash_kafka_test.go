package main_test

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/kafkatest"
	"github.com/postbox-events/postbox/stream/streamkafka"
)

// TestCrashServerKafka kills postbox serve --streams kafka://... with
// SIGKILL at random moments while agents stream events and restarts it;
// once in the run it stops the whole Kafka cluster under the running
// postbox and starts it again on the same ports and data instead. The
// cluster is three in-process kfake brokers on loopback ports, the topics
// three replicas. At the end every event an agent accepted is in the
// Kafka stream exactly once, at dense offsets, every outbox is drained,
// and a subscription created afterwards from the earliest event gets each
// event once.
func TestCrashServerKafka(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test runs the real binary")
	}
	kc := kafkatest.Start(t, 3)
	// A short claim: a kill leaves claimed identities that the agents'
	// redeliveries wait out before they look for them in the topic.
	streams := kc.URL() + "?replication_factor=3&claim_timeout=2s"
	crashes := 0
	crashRunOn(t, 3, []string{"--streams", streams}, nil,
		func(srv *proc, srvURL string, _ map[string]*proc) {
			crashes++
			if crashes == 3 {
				kc.Stop()
				time.Sleep(time.Duration(200+rand.IntN(500)) * time.Millisecond)
				kc.Restart()
				waitHTTP(t, srvURL+"/ready", srv)
				return
			}
			srv.kill()
			time.Sleep(time.Duration(rand.IntN(300)) * time.Millisecond) // down for a random while
			srv.restart()
			waitHTTP(t, srvURL+"/ready", srv)
		},
		auditFromEarliest(t, streamkafka.BackendName),
		func(t *testing.T, dbPath string, producers []*producer) {
			checkAudited(t, dbPath, producers)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			b, err := streamkafka.Open(ctx, streamkafka.Config{Brokers: kc.Brokers(),
				Index: filepath.Join(filepath.Dir(dbPath), "postbox-kafka-index.db")})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			checkStreamAudited(t, b, dbPath)
		})
}
