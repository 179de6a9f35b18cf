package streamkafka

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/postbox-events/postbox/stream"
)

// commitMeta is what a consumer group's commit metadata holds of the
// postbox consumer besides its offset.
type commitMeta struct {
	Stream    string       `json:"stream"`
	Start     stream.Start `json:"start"`
	CreatedAt time.Time    `json:"created_at"`
	UpdatedAt time.Time    `json:"updated_at"`
}

func (m *commitMeta) consumer(id string, next int64) stream.Consumer {
	return stream.Consumer{
		ID: id, StreamID: m.Stream, Key: m.Stream + "/" + id, NextOffset: next,
		Start: m.Start, CreatedAt: m.CreatedAt.UTC(), UpdatedAt: m.UpdatedAt.UTC(),
	}
}

// GroupName returns the consumer group of the postbox consumer id under
// prefix.
func GroupName(prefix, id string) string { return prefix + "consumer." + id }

// consumerLock serialises the changes of one consumer within a Backend.
type consumerLock struct{ sync.Mutex }

func (b *Backend) lock(id string) func() {
	b.mu.Lock()
	l := b.locks[id]
	if l == nil {
		l = &consumerLock{}
		b.locks[id] = l
	}
	b.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// getConsumer returns the consumer id from its group's commit.
func (b *Backend) getConsumer(ctx context.Context, id string) (stream.Consumer, error) {
	if id == "" {
		return stream.Consumer{}, fmt.Errorf("%w: empty id", stream.ErrConsumerNotFound)
	}
	var resp kadm.OffsetResponses
	err := b.retrying(ctx, func(ctx context.Context) (err error) {
		resp, err = b.adm.FetchOffsets(ctx, GroupName(b.cfg.Prefix, id))
		return err
	})
	if errors.Is(err, kerr.GroupIDNotFound) {
		return stream.Consumer{}, fmt.Errorf("%w: %s", stream.ErrConsumerNotFound, id)
	}
	if err != nil {
		return stream.Consumer{}, fmt.Errorf("consumer %s: %w", id, err)
	}
	return b.fromOffsets(id, resp)
}

// fromOffsets makes the consumer id of its group's committed offsets.
func (b *Backend) fromOffsets(id string, resp kadm.OffsetResponses) (stream.Consumer, error) {
	for _, ps := range resp {
		o, ok := ps[0]
		if !ok || o.Err != nil || o.At < 0 || o.Metadata == "" {
			continue
		}
		var m commitMeta
		if err := json.Unmarshal([]byte(o.Metadata), &m); err != nil {
			return stream.Consumer{}, fmt.Errorf("consumer %s: commit metadata %q: %w", id, o.Metadata, err)
		}
		if TopicName(b.cfg.Prefix, m.Stream) != o.Topic {
			continue
		}
		return m.consumer(id, o.At+1), nil
	}
	return stream.Consumer{}, fmt.Errorf("%w: %s", stream.ErrConsumerNotFound, id)
}

// put commits c's position and metadata to its group.
func (b *Backend) put(ctx context.Context, c stream.Consumer) error {
	meta, err := json.Marshal(commitMeta{Stream: c.StreamID, Start: c.Start, CreatedAt: c.CreatedAt, UpdatedAt: c.UpdatedAt})
	if err != nil {
		return err
	}
	topic := TopicName(b.cfg.Prefix, c.StreamID)
	offsets := kadm.Offsets{topic: {0: {Topic: topic, Partition: 0, At: c.NextOffset - 1, LeaderEpoch: -1, Metadata: string(meta)}}}
	err = b.retrying(ctx, func(ctx context.Context) error {
		resp, err := b.adm.CommitOffsets(ctx, GroupName(b.cfg.Prefix, c.ID), offsets)
		if err == nil {
			err = resp.Error()
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("consumer %s: commit: %w", c.ID, err)
	}
	return nil
}

// startOffset returns the next offset of a consumer of st starting at
// start.
func (b *Backend) startOffset(ctx context.Context, st *streamState, start stream.Start) (int64, error) {
	first, end, err := b.offsets(ctx, st)
	if err != nil {
		return 0, err
	}
	switch start.Policy {
	case "", stream.StartLatest:
		return end + 1, nil
	case stream.StartEarliest:
		return first + 1, nil
	case stream.StartAtOffset:
		if start.Offset > end+1 {
			return 0, fmt.Errorf("%w: start at %d, past the next offset %d of %s", stream.ErrOffsetOutOfRange, start.Offset, end+1, st.id)
		}
		return max(start.Offset, first+1), nil // what was trimmed is gone
	case stream.StartAtTime:
		o, err := b.offsetAfter(ctx, st, start.Time)
		if err != nil {
			return 0, err
		}
		return max(o, first) + 1, nil
	}
	return 0, stream.ErrInvalidStart
}

// EnsureConsumer implements stream.Backend.
func (b *Backend) EnsureConsumer(ctx context.Context, cfg stream.ConsumerConfig) (stream.Consumer, error) {
	if cfg.ID == "" {
		return stream.Consumer{}, errors.New("ensure consumer: empty id")
	}
	if err := cfg.Start.Validate(); err != nil {
		return stream.Consumer{}, fmt.Errorf("ensure consumer %s: %w", cfg.ID, err)
	}
	defer b.lock(cfg.ID)()
	c, err := b.getConsumer(ctx, cfg.ID)
	switch {
	case err == nil && c.StreamID != cfg.StreamID:
		return stream.Consumer{}, fmt.Errorf("%w: %s is on stream %s", stream.ErrConsumerExists, cfg.ID, c.StreamID)
	case err == nil:
		return c, nil
	case !errors.Is(err, stream.ErrConsumerNotFound):
		return stream.Consumer{}, err
	}
	st, err := b.stream(ctx, cfg.StreamID)
	if err != nil {
		return stream.Consumer{}, err
	}
	next, err := b.startOffset(ctx, st, cfg.Start)
	if err != nil {
		return stream.Consumer{}, fmt.Errorf("ensure consumer %s: %w", cfg.ID, err)
	}
	now := time.Now().UTC()
	c = stream.Consumer{ID: cfg.ID, StreamID: cfg.StreamID, Key: cfg.StreamID + "/" + cfg.ID, NextOffset: next,
		Start: cfg.Start.Canonical(), CreatedAt: now, UpdatedAt: now}
	if err := b.put(ctx, c); err != nil {
		return stream.Consumer{}, fmt.Errorf("ensure consumer %s: %w", cfg.ID, err)
	}
	return c, nil
}

// Consumer implements stream.Backend.
func (b *Backend) Consumer(ctx context.Context, id string) (stream.Consumer, error) {
	return b.getConsumer(ctx, id)
}

// DeleteConsumer implements stream.Backend: it deletes the group.
func (b *Backend) DeleteConsumer(ctx context.Context, id string) error {
	defer b.lock(id)()
	if _, err := b.getConsumer(ctx, id); err != nil {
		return err
	}
	b.dropReader(id)
	group := GroupName(b.cfg.Prefix, id)
	resp, err := b.adm.DeleteGroups(ctx, group)
	if err == nil {
		if r, ok := resp[group]; ok {
			err = r.Err
		}
	}
	if err != nil && !errors.Is(err, kerr.GroupIDNotFound) {
		return fmt.Errorf("delete consumer %s: %w", id, err)
	}
	return nil
}

// Commit implements stream.Backend.
func (b *Backend) Commit(ctx context.Context, consumerID string, offset int64) (stream.Consumer, error) {
	defer b.lock(consumerID)()
	c, err := b.getConsumer(ctx, consumerID)
	if err != nil {
		return stream.Consumer{}, err
	}
	switch {
	case offset == c.NextOffset-1:
		return c, nil
	case offset < c.NextOffset-1:
		return stream.Consumer{}, fmt.Errorf("%w: %s is at %d, commit of %d", stream.ErrCommitBehind, consumerID, c.NextOffset, offset)
	}
	st, err := b.stream(ctx, c.StreamID)
	if err != nil {
		return stream.Consumer{}, err
	}
	if offset > st.last.Load() { // last only grows: ask Kafka only when it is not enough
		end, err := b.endOffset(ctx, st)
		if err != nil {
			return stream.Consumer{}, err
		}
		if offset > end {
			return stream.Consumer{}, fmt.Errorf("%w: commit of %d past the high watermark %d of %s", stream.ErrOffsetOutOfRange, offset, end, st.id)
		}
	}
	c.NextOffset, c.UpdatedAt = offset+1, time.Now().UTC()
	if err := b.put(ctx, c); err != nil {
		return stream.Consumer{}, err
	}
	return c, nil
}

// Reset implements stream.Backend.
func (b *Backend) Reset(ctx context.Context, consumerID string, start stream.Start) (stream.Consumer, error) {
	if err := start.Validate(); err != nil {
		return stream.Consumer{}, fmt.Errorf("reset %s: %w", consumerID, err)
	}
	defer b.lock(consumerID)()
	c, err := b.getConsumer(ctx, consumerID)
	if err != nil {
		return stream.Consumer{}, err
	}
	st, err := b.stream(ctx, c.StreamID)
	if err != nil {
		return stream.Consumer{}, err
	}
	next, err := b.startOffset(ctx, st, start)
	if err != nil {
		return stream.Consumer{}, fmt.Errorf("reset %s: %w", consumerID, err)
	}
	c.NextOffset, c.Start, c.UpdatedAt = next, start.Canonical(), time.Now().UTC()
	if err := b.put(ctx, c); err != nil {
		return stream.Consumer{}, err
	}
	return c, nil
}

// consumersOf returns the consumers of streamID: the groups under
// Prefix+"consumer." whose commit names the stream.
func (b *Backend) consumersOf(ctx context.Context, streamID string) ([]stream.Consumer, error) {
	listed, err := b.adm.ListGroups(ctx)
	if err != nil {
		return nil, err
	}
	prefix := GroupName(b.cfg.Prefix, "")
	var groups []string
	for g := range listed {
		if strings.HasPrefix(g, prefix) {
			groups = append(groups, g)
		}
	}
	if len(groups) == 0 {
		return nil, nil
	}
	var out []stream.Consumer
	for g, r := range b.adm.FetchManyOffsets(ctx, groups...) {
		if r.Err != nil {
			if errors.Is(r.Err, kerr.GroupIDNotFound) {
				continue
			}
			return nil, fmt.Errorf("group %s: %w", g, r.Err)
		}
		c, err := b.fromOffsets(strings.TrimPrefix(g, prefix), r.Fetched)
		if errors.Is(err, stream.ErrConsumerNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if c.StreamID == streamID {
			out = append(out, c)
		}
	}
	return out, nil
}
