package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/outbox/outboxkafka"
	"github.com/postbox-events/postbox/outbox/outboxredis"
)

// sink is where both sides forward to: a Redis stream or a Kafka topic,
// one fresh per side and run.
type sink interface {
	// describe names the sink for the report's first line.
	describe(ctx context.Context) string
	// fresh returns the name of an empty stream (topic) for side's run.
	fresh(ctx context.Context, side string, run int) (string, error)
	// count returns the entries (records) name holds.
	count(ctx context.Context, name string) (int64, error)
	wmPublisher(logger watermill.LoggerAdapter) (message.Publisher, error)
	pbPublisher(name string) (outbox.Publisher, func(), error)
	cleanup(ctx context.Context)
	close()
}

type redisSink struct {
	opts  *redis.Options
	admin *redis.Client
}

func newRedisSink(ctx context.Context, url string) (*redisSink, error) {
	ropts, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("redis url: %w", err)
	}
	admin := redis.NewClient(ropts)
	if err := admin.Ping(ctx).Err(); err != nil {
		admin.Close()
		return nil, fmt.Errorf("redis: %w", err)
	}
	return &redisSink{ropts, admin}, nil
}

func (s *redisSink) describe(ctx context.Context) string {
	v := "?"
	if info, err := s.admin.Info(ctx, "server").Result(); err == nil {
		for line := range strings.SplitSeq(info, "\n") {
			if x, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
				v = x
			}
		}
	}
	return "Redis " + v
}

func (s *redisSink) fresh(ctx context.Context, side string, _ int) (string, error) {
	name := "bench:" + side
	return name, s.admin.Del(ctx, name).Err()
}

func (s *redisSink) count(ctx context.Context, name string) (int64, error) {
	return s.admin.XLen(ctx, name).Result()
}

func (s *redisSink) wmPublisher(logger watermill.LoggerAdapter) (message.Publisher, error) {
	rdb := redis.NewClient(s.opts) // closed by the publisher's Close
	return redisstream.NewPublisher(redisstream.PublisherConfig{Client: rdb}, logger)
}

func (s *redisSink) pbPublisher(name string) (outbox.Publisher, func(), error) {
	rdb := redis.NewClient(s.opts)
	pub, err := outboxredis.NewPublisher(rdb, outboxredis.PublisherConfig{Stream: name})
	if err != nil {
		rdb.Close()
		return nil, nil, err
	}
	return pub, func() { rdb.Close() }, nil
}

func (s *redisSink) cleanup(ctx context.Context) {
	if err := s.admin.Del(ctx, "bench:"+sideWM, "bench:"+sidePostbox).Err(); err != nil {
		fmt.Println("cleanup:", err)
	}
}

func (s *redisSink) close() { s.admin.Close() }

// kafkaSink forwards to Kafka: brokers given, or a kfake cluster started
// in this process on a loopback port. Each run gets a new topic of
// partitions partitions, bench-SIDE-RUN, deleted at the end.
type kafkaSink struct {
	brokers    []string
	partitions int32
	fake       *kfake.Cluster
	admin      *kgo.Client
	topics     []string
}

func newKafkaSink(brokers string, partitions int) (*kafkaSink, error) {
	s := &kafkaSink{partitions: int32(partitions)}
	if brokers == "" {
		c, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			return nil, fmt.Errorf("kfake: %w", err)
		}
		s.fake, s.brokers = c, c.ListenAddrs()
	} else {
		s.brokers = strings.Split(brokers, ",")
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.brokers...))
	if err != nil {
		s.close()
		return nil, err
	}
	s.admin = cl
	return s, nil
}

func (s *kafkaSink) describe(context.Context) string {
	if s.fake != nil {
		return fmt.Sprintf("Kafka (franz-go kfake, in this process, on %s, %d partitions)", s.brokers[0], s.partitions)
	}
	return fmt.Sprintf("Kafka %s (%d partitions)", strings.Join(s.brokers, ","), s.partitions)
}

func (s *kafkaSink) fresh(ctx context.Context, side string, run int) (string, error) {
	name := fmt.Sprintf("bench-%s-%d", side, run)
	req := kmsg.NewPtrCreateTopicsRequest()
	t := kmsg.NewCreateTopicsRequestTopic()
	t.Topic, t.NumPartitions, t.ReplicationFactor = name, s.partitions, -1
	req.Topics = append(req.Topics, t)
	resp, err := req.RequestWith(ctx, s.admin)
	if err != nil {
		return "", fmt.Errorf("create topic %s: %w", name, err)
	}
	if err := kerr.ErrorForCode(resp.Topics[0].ErrorCode); err != nil {
		return "", fmt.Errorf("create topic %s: %w", name, err)
	}
	s.topics = append(s.topics, name)
	return name, nil
}

func (s *kafkaSink) count(ctx context.Context, name string) (int64, error) {
	meta := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr(name)
	meta.Topics = append(meta.Topics, mt)
	mresp, err := meta.RequestWith(ctx, s.admin)
	if err != nil {
		return 0, err
	}
	req := kmsg.NewPtrListOffsetsRequest()
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = name
	for _, p := range mresp.Topics[0].Partitions {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition, rp.Timestamp = p.Partition, -1
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	var n int64
	for _, sh := range s.admin.RequestSharded(ctx, req) {
		if sh.Err != nil {
			return 0, sh.Err
		}
		for _, t := range sh.Resp.(*kmsg.ListOffsetsResponse).Topics {
			for _, p := range t.Partitions {
				if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
					return 0, err
				}
				n += p.Offset
			}
		}
	}
	return n, nil
}

// wmPublisher is watermill-kafka's publisher with its defaults (a sarama
// SyncProducer) except acks: all in-sync replicas, as postbox's.
func (s *kafkaSink) wmPublisher(logger watermill.LoggerAdapter) (message.Publisher, error) {
	sc := wmkafka.DefaultSaramaSyncPublisherConfig()
	sc.Producer.RequiredAcks = sarama.WaitForAll
	return wmkafka.NewPublisher(wmkafka.PublisherConfig{Brokers: s.brokers, Marshaler: wmkafka.DefaultMarshaler{}, OverwriteSaramaConfig: sc}, logger)
}

func (s *kafkaSink) pbPublisher(name string) (outbox.Publisher, func(), error) {
	pub, err := outboxkafka.New(outboxkafka.Config{Brokers: s.brokers, Topic: name})
	if err != nil {
		return nil, nil, err
	}
	return pub, pub.Close, nil
}

func (s *kafkaSink) cleanup(ctx context.Context) {
	if len(s.topics) == 0 || s.fake != nil {
		return
	}
	req := kmsg.NewPtrDeleteTopicsRequest()
	for _, name := range s.topics {
		t := kmsg.NewDeleteTopicsRequestTopic()
		t.Topic = kmsg.StringPtr(name)
		req.Topics = append(req.Topics, t)
		req.TopicNames = append(req.TopicNames, name)
	}
	if _, err := req.RequestWith(ctx, s.admin); err != nil {
		fmt.Println("cleanup:", err)
	}
}

func (s *kafkaSink) close() {
	if s.admin != nil {
		s.admin.Close()
	}
	if s.fake != nil {
		s.fake.Close()
	}
}
