package streamnats

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-events/postbox/stream"
)

// consumerRecord is a consumer as its KV entry holds it.
type consumerRecord struct {
	ID         string       `json:"id"`
	Stream     string       `json:"stream"`
	NextOffset int64        `json:"next_offset"`
	Start      stream.Start `json:"start"`
	CreatedAt  time.Time    `json:"created_at"`
	UpdatedAt  time.Time    `json:"updated_at"`
}

func (r *consumerRecord) consumer() stream.Consumer {
	return stream.Consumer{
		ID: r.ID, StreamID: r.Stream, Key: r.Stream + "/" + r.ID, NextOffset: r.NextOffset,
		Start: r.Start, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt,
	}
}

// BucketName returns the name of the consumer bucket under prefix.
func BucketName(prefix string) string { return prefix + "consumers" }

// openConsumers creates the consumer bucket if needed and binds it. The
// bucket's stream is made here rather than by CreateKeyValue so that it
// refuses direct gets: every read goes to the leader and sees the last
// write, also with replicas.
func (b *Backend) openConsumers(ctx context.Context) error {
	bucket := BucketName(b.cfg.Prefix)
	_, err := b.js.CreateStream(ctx, jetstream.StreamConfig{
		Name:              "KV_" + bucket,
		Description:       "postbox consumer positions",
		Subjects:          []string{"$KV." + bucket + ".>"},
		Storage:           jetstream.FileStorage,
		Replicas:          b.cfg.Replicas,
		MaxMsgsPerSubject: 1,
		MaxMsgs:           -1,
		MaxBytes:          -1,
		MaxAge:            0,
		MaxMsgSize:        -1,
		Discard:           jetstream.DiscardNew,
		AllowRollup:       true,
		DenyDelete:        true,
		Duplicates:        2 * time.Minute,
	})
	if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return fmt.Errorf("streamnats: create consumer bucket %s: %w", bucket, err)
	}
	// In a cluster another node may have just created the bucket: its
	// stream can be in use and not yet found while its replicas form.
	give := time.Now().Add(30 * time.Second)
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		b.kv, err = b.js.KeyValue(ctx, bucket)
		if !errors.Is(err, jetstream.ErrBucketNotFound) || time.Now().After(give) {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("streamnats: consumer bucket %s: %w (%w)", bucket, err, ctx.Err())
		case <-time.After(wait):
		}
	}
	if err != nil {
		return fmt.Errorf("streamnats: consumer bucket %s: %w", bucket, err)
	}
	if b.kvs, err = b.js.Stream(ctx, "KV_"+bucket); err != nil {
		return fmt.Errorf("streamnats: consumer bucket %s: %w", bucket, err)
	}
	return nil
}

// getConsumer returns the record of id and its revision.
func (b *Backend) getConsumer(ctx context.Context, id string) (*consumerRecord, uint64, error) {
	if id == "" {
		return nil, 0, fmt.Errorf("%w: empty id", stream.ErrConsumerNotFound)
	}
	e, err := b.kv.Get(ctx, encodeName(id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, fmt.Errorf("%w: %s", stream.ErrConsumerNotFound, id)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("consumer %s: %w", id, err)
	}
	var r consumerRecord
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return nil, 0, fmt.Errorf("consumer %s: %w", id, err)
	}
	if r.ID != id {
		return nil, 0, fmt.Errorf("consumer %s: its key holds consumer %q", id, r.ID)
	}
	return &r, e.Revision(), nil
}

// EnsureConsumer implements stream.Backend.
func (b *Backend) EnsureConsumer(ctx context.Context, cfg stream.ConsumerConfig) (stream.Consumer, error) {
	if cfg.ID == "" {
		return stream.Consumer{}, errors.New("ensure consumer: empty id")
	}
	if err := cfg.Start.Validate(); err != nil {
		return stream.Consumer{}, fmt.Errorf("ensure consumer %s: %w", cfg.ID, err)
	}
	for {
		r, _, err := b.getConsumer(ctx, cfg.ID)
		switch {
		case err == nil && r.Stream != cfg.StreamID:
			return stream.Consumer{}, fmt.Errorf("%w: %s is on stream %s", stream.ErrConsumerExists, cfg.ID, r.Stream)
		case err == nil:
			return r.consumer(), nil
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
		r = &consumerRecord{ID: cfg.ID, Stream: cfg.StreamID, NextOffset: next, Start: cfg.Start.Canonical(), CreatedAt: now, UpdatedAt: now}
		data, _ := json.Marshal(r)
		_, err = b.kv.Create(ctx, encodeName(cfg.ID), data)
		if errors.Is(err, jetstream.ErrKeyExists) {
			continue // created by someone else meanwhile: take theirs
		}
		if err != nil {
			return stream.Consumer{}, fmt.Errorf("ensure consumer %s: %w", cfg.ID, err)
		}
		return r.consumer(), nil
	}
}

// Consumer implements stream.Backend.
func (b *Backend) Consumer(ctx context.Context, id string) (stream.Consumer, error) {
	r, _, err := b.getConsumer(ctx, id)
	if err != nil {
		return stream.Consumer{}, err
	}
	return r.consumer(), nil
}

// DeleteConsumer implements stream.Backend.
func (b *Backend) DeleteConsumer(ctx context.Context, id string) error {
	_, rev, err := b.getConsumer(ctx, id)
	if err != nil {
		return err
	}
	b.dropReader(id)
	if err := b.kv.Purge(ctx, encodeName(id), jetstream.LastRevision(rev)); err != nil {
		if isWrongLastSeq(err) {
			return b.DeleteConsumer(ctx, id) // changed meanwhile: delete what is there now
		}
		return fmt.Errorf("delete consumer %s: %w", id, err)
	}
	return nil
}

// Commit implements stream.Backend.
func (b *Backend) Commit(ctx context.Context, consumerID string, offset int64) (stream.Consumer, error) {
	return b.update(ctx, consumerID, func(r *consumerRecord, st *streamState) error {
		switch {
		case offset == r.NextOffset-1:
			return errUnchanged
		case offset < r.NextOffset-1:
			return fmt.Errorf("%w: %s is at %d, commit of %d", stream.ErrCommitBehind, consumerID, r.NextOffset, offset)
		}
		if uint64(offset) > st.last.Load() { // last only grows: ask JetStream only when it is not enough
			info, err := st.js.Info(ctx)
			if err != nil {
				return mapErr(err)
			}
			st.grow(info.State.LastSeq)
			if uint64(offset) > info.State.LastSeq {
				return fmt.Errorf("%w: commit of %d past the high watermark %d of %s", stream.ErrOffsetOutOfRange, offset, info.State.LastSeq, st.ID)
			}
		}
		r.NextOffset = offset + 1
		return nil
	})
}

// Reset implements stream.Backend.
func (b *Backend) Reset(ctx context.Context, consumerID string, start stream.Start) (stream.Consumer, error) {
	if err := start.Validate(); err != nil {
		return stream.Consumer{}, fmt.Errorf("reset %s: %w", consumerID, err)
	}
	return b.update(ctx, consumerID, func(r *consumerRecord, st *streamState) error {
		next, err := b.startOffset(ctx, st, start)
		if err != nil {
			return err
		}
		r.NextOffset, r.Start = next, start.Canonical()
		return nil
	})
}

// errUnchanged tells update that fn changed nothing.
var errUnchanged = errors.New("unchanged")

// update applies fn to the consumer's record and stores it if the record
// did not change meanwhile, or tries again.
func (b *Backend) update(ctx context.Context, id string, fn func(*consumerRecord, *streamState) error) (stream.Consumer, error) {
	for {
		r, rev, err := b.getConsumer(ctx, id)
		if err != nil {
			return stream.Consumer{}, err
		}
		st, err := b.stream(ctx, r.Stream)
		if err != nil {
			return stream.Consumer{}, err
		}
		err = fn(r, st)
		if err == errUnchanged {
			return r.consumer(), nil
		}
		if err != nil {
			return stream.Consumer{}, err
		}
		r.UpdatedAt = time.Now().UTC()
		data, _ := json.Marshal(r)
		if _, err := b.kv.Update(ctx, encodeName(id), data, rev); err != nil {
			if isWrongLastSeq(err) || errors.Is(err, jetstream.ErrKeyExists) {
				continue
			}
			return stream.Consumer{}, fmt.Errorf("update consumer %s: %w", id, err)
		}
		return r.consumer(), nil
	}
}

// minNextOffset returns the lowest next offset of streamID's consumers,
// and whether it has any.
//
// The keys come from the bucket stream's subjects, one answer the server
// gives under the stream's lock, and not from ListKeys: its watcher ends
// the initial keys at the first message with nothing pending after it,
// and a key updated meanwhile (a consumer committing) came after that
// and was missed, so Trim deleted events that consumer had not read. A
// consumer created after the list is read is not counted: it starts
// from what the trim leaves.
func (b *Backend) minNextOffset(ctx context.Context, streamID string) (int64, bool, error) {
	prefix := "$KV." + BucketName(b.cfg.Prefix) + "."
	info, err := b.kvs.Info(ctx, jetstream.WithSubjectFilter(prefix+">"))
	if err != nil {
		return 0, false, err
	}
	var lowest int64
	found := false
	for subject := range info.State.Subjects {
		e, err := b.kv.Get(ctx, strings.TrimPrefix(subject, prefix))
		if errors.Is(err, jetstream.ErrKeyNotFound) { // deleted
			continue
		}
		if err != nil {
			return 0, false, err
		}
		var r consumerRecord
		if json.Unmarshal(e.Value(), &r) != nil || r.Stream != streamID {
			continue
		}
		if !found || r.NextOffset < lowest {
			lowest, found = r.NextOffset, true
		}
	}
	return lowest, found, nil
}
