package delivery

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/postbox-events/postbox/internal/sqlitedb"
)

// Replays of a time range: every item a subscription made in a range,
// completed and failed ones alike, delivered again. A replay is a job in
// the store that Run works through in batches, one transaction each, so
// that a range of millions never holds the writer long; a job that was
// running when the process stopped is resumed where it stopped.

// Bounds and defaults of ReplayRange.
const (
	DefaultReplayBatch = 1000
	MaxReplayBatch     = 10000
)

// Replay job states.
const (
	ReplayRunning   = "running"
	ReplayCompleted = "completed"
	ReplayFailed    = "failed"
)

// replayPoll is how often the leader of a shared store looks for jobs
// that no process runs (their process stopped). A job created here, or
// found running at Run's start, starts at once.
const replayPoll = 5 * time.Second

// replayWake is the key of d.inboxes that wakes the replay runner: not an
// inbox name, which holds no '/'.
const replayWake = "/replays"

// ReplayRange selects the items of one subscription to deliver again.
type ReplayRange struct {
	Subscription string
	// Since and Until bound when the items were made (their created_at:
	// when the event reached the inbox): at or after Since, before Until.
	// Since is required; a zero Until, or one after now, is now, so that a
	// job ends: items made later are new and delivered anyway.
	Since, Until time.Time
	// States are the states replayed: StateCompleted, StateFailed or both
	// (none: both). Pending and processing items are on their way and are
	// left alone.
	States []string
	// BatchSize is how many items of the range one transaction walks.
	// Defaults to DefaultReplayBatch; at most MaxReplayBatch.
	BatchSize int
}

// ReplayJob is a replay of a range and its progress.
type ReplayJob struct {
	ID           string // rpl_<ULID>
	Subscription string
	Inbox        string
	Since, Until time.Time
	States       []string
	BatchSize    int
	State        string    // ReplayRunning, ReplayCompleted or ReplayFailed
	Matched      int64     // items of the range in States when the job was created
	Replayed     int64     // items it has returned to pending so far
	Batches      int64     // transactions it has run
	Reached      time.Time // the created_at of the last item walked: the range is done up to here
	Error        string    // why it failed
	CreatedAt    time.Time
	UpdatedAt    time.Time  // its last batch
	FinishedAt   *time.Time // when it completed or failed
}

// validate checks r and fills its defaults; now is the time of the
// request.
func (r *ReplayRange) validate(now time.Time) error {
	if r.Subscription == "" {
		return errorf(ErrInvalid, "subscription: required")
	}
	if r.Since.IsZero() {
		return errorf(ErrInvalid, "since: required: the start of the range")
	}
	if len(r.States) == 0 {
		r.States = []string{StateCompleted, StateFailed}
	}
	for _, s := range r.States {
		if s != StateCompleted && s != StateFailed {
			return errorf(ErrInvalid, "states: %q: use completed, failed or both (pending and processing items are delivered already)", s)
		}
	}
	slices.Sort(r.States)
	r.States = slices.Compact(r.States)
	switch {
	case r.BatchSize == 0:
		r.BatchSize = DefaultReplayBatch
	case r.BatchSize < 0 || r.BatchSize > MaxReplayBatch:
		return errorf(ErrInvalid, "batch_size %d: want 1 to %d", r.BatchSize, MaxReplayBatch)
	}
	if !r.Until.IsZero() && !r.Since.Before(r.Until) {
		return errorf(ErrInvalid, "until %s is not after since %s", r.Until.UTC().Format(time.RFC3339Nano), r.Since.UTC().Format(time.RFC3339Nano))
	}
	if r.Until.IsZero() || r.Until.After(now) {
		r.Until = now
	}
	if !r.Since.Before(r.Until) {
		return errorf(ErrInvalid, "since %s is not in the past", r.Since.UTC().Format(time.RFC3339Nano))
	}
	return nil
}

// ReplayRange starts a job that returns the items r selects to pending,
// due now with their attempts reset, so that they are delivered again:
// a fresh attempt budget, their attempt log kept (new attempts append),
// counted in their replays and replayed_at as a dead letter's replay is.
// Run works through the job; ReplayJob shows its progress. Each item is
// replayed at most once by a job, across restarts too.
//
// An unknown subscription is ErrNotFound; a bad range ErrInvalid; a
// subscription with a job running already ErrConflict (two jobs would
// deliver the items of their common range twice).
func (d *Delivery) ReplayRange(ctx context.Context, r ReplayRange) (ReplayJob, error) {
	now := d.now().UTC().Truncate(time.Microsecond)
	if err := r.validate(now); err != nil {
		return ReplayJob{}, err
	}
	sub, err := d.Subscription(ctx, r.Subscription)
	if err != nil {
		return ReplayJob{}, err
	}
	j := ReplayJob{ID: "rpl_" + ulid.Make().String(), Subscription: sub.Name, Inbox: sub.Inbox,
		Since: r.Since.UTC().Truncate(time.Microsecond), Until: r.Until.UTC().Truncate(time.Microsecond),
		States: r.States, BatchSize: r.BatchSize, State: ReplayRunning, CreatedAt: now, UpdatedAt: now}
	since, until, nowText := j.Since.Format(sqlitedb.Time), j.Until.Format(sqlitedb.Time), now.Format(sqlitedb.Time)
	states := strings.Join(j.States, ",")
	err = d.update(ctx, func(tx conn) error {
		var running string
		err := tx.QueryRowContext(ctx, `SELECT replay_id FROM replays WHERE subscription_uid = ? AND state = 'running' LIMIT 1`,
			sub.UID).Scan(&running)
		switch {
		case err == nil:
			return errorf(ErrConflict, "subscription %q has replay %s running: wait for it to end", sub.Name, running)
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
		args := []any{sub.UID, since, until}
		for _, s := range j.States {
			args = append(args, s)
		}
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM inbox_items WHERE subscription_uid = ? AND created_at >= ? AND created_at < ?
			AND state IN (`+strings.Repeat(",?", len(j.States))[1:]+`)`, args...).Scan(&j.Matched); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO replays (replay_id, subscription_id, subscription_uid, inbox_id, since, until, states,
			batch_size, state, matched, cursor_at, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'running', ?, ?, ?, ?)`,
			j.ID, sub.Name, sub.UID, sub.Inbox, since, until, states, j.BatchSize, j.Matched, since, nowText, nowText)
		return err
	})
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			return ReplayJob{}, err
		}
		return ReplayJob{}, fmt.Errorf("replay %s: %w", sub.Name, err)
	}
	d.log.Info("delivery: replay started", "replay", j.ID, "subscription", sub.Name, "inbox", sub.Inbox,
		"since", since, "until", until, "states", states, "matched", j.Matched)
	d.inboxes.notify(replayWake)
	return j, nil
}

const replayColumns = `replay_id, subscription_id, inbox_id, since, until, states, batch_size, state, matched, replayed, batches,
	error, created_at, updated_at, finished_at, cursor_at`

// ReplayJob returns the replay job id, or ErrNotFound.
func (d *Delivery) ReplayJob(ctx context.Context, id string) (ReplayJob, error) {
	jobs, err := d.replayJobs(ctx, ` WHERE replay_id = ?`, id)
	if err != nil {
		return ReplayJob{}, err
	}
	if len(jobs) == 0 {
		return ReplayJob{}, errorf(ErrNotFound, "replay %q: no such replay", id)
	}
	return jobs[0], nil
}

// ReplayJobs returns the replay jobs of subscription (of every one when
// ""), newest first.
func (d *Delivery) ReplayJobs(ctx context.Context, subscription string) ([]ReplayJob, error) {
	if subscription == "" {
		return d.replayJobs(ctx, ` ORDER BY created_at DESC, replay_id DESC`)
	}
	return d.replayJobs(ctx, ` WHERE subscription_id = ? ORDER BY created_at DESC, replay_id DESC`, subscription)
}

func (d *Delivery) replayJobs(ctx context.Context, where string, args ...any) ([]ReplayJob, error) {
	rows, err := d.db.QueryContext(ctx, `SELECT `+replayColumns+` FROM replays`+where, args...)
	if err != nil {
		return nil, fmt.Errorf("replays: %w", err)
	}
	defer rows.Close()
	jobs := []ReplayJob{}
	for rows.Next() {
		var j ReplayJob
		var since, until, states, created, updated, reached string
		var errText, finished sql.NullString
		if err := rows.Scan(&j.ID, &j.Subscription, &j.Inbox, &since, &until, &states, &j.BatchSize, &j.State, &j.Matched,
			&j.Replayed, &j.Batches, &errText, &created, &updated, &finished, &reached); err != nil {
			return nil, fmt.Errorf("replays: %w", err)
		}
		j.Since, _ = sqlitedb.ParseTime(since)
		j.Until, _ = sqlitedb.ParseTime(until)
		j.States = strings.Split(states, ",")
		j.Error = errText.String
		j.CreatedAt, _ = sqlitedb.ParseTime(created)
		j.UpdatedAt, _ = sqlitedb.ParseTime(updated)
		j.FinishedAt = nullTime(finished)
		j.Reached, _ = sqlitedb.ParseTime(reached)
		jobs = append(jobs, j)
	}
	return jobs, rows.Err()
}

// runReplays works through the running replay jobs, one at a time, until
// ctx ends: those running when it starts (a restart resumes them where
// they stopped), then each new one. The leader of a shared store also
// takes over, every replayPoll, jobs whose process stopped; two
// processes running one job take turns at its batches and replay no item
// twice.
func (d *Delivery) runReplays(ctx context.Context) {
	t := time.NewTicker(replayPoll)
	defer t.Stop()
	first := true
	for {
		wake := d.inboxes.channel(replayWake) // before looking, so no wake-up is missed
		if first || d.leads() {
			d.replayAll(ctx)
		}
		first = false
		select {
		case <-ctx.Done():
			return
		case <-wake:
			d.replayAll(ctx)
		case <-t.C:
		}
	}
}

// replayAll runs every running job to its end, or until ctx ends.
func (d *Delivery) replayAll(ctx context.Context) {
	for ctx.Err() == nil {
		var id string
		err := d.db.QueryRowContext(ctx, `SELECT replay_id FROM replays WHERE state = 'running' ORDER BY created_at, replay_id LIMIT 1`).Scan(&id)
		if errors.Is(err, sql.ErrNoRows) {
			return
		}
		if err != nil {
			if ctx.Err() == nil {
				d.log.Warn("delivery: looking for replays to run failed; retrying", "err", err)
			}
			return
		}
		if !d.runReplay(ctx, id) {
			return // tried again at the next wake-up or poll
		}
	}
}

// runReplay runs the batches of job id until it ends or ctx does, and
// reports whether it ended. A batch that fails fails the job, with its
// error: the items it replayed stay replayed, and a new job for the rest
// of the range (since its Reached) replays the others.
func (d *Delivery) runReplay(ctx context.Context, id string) bool {
	for {
		if ctx.Err() != nil {
			return false // still running: resumed at the next start
		}
		p, err := d.replayBatch(ctx, id)
		if err != nil {
			if ctx.Err() != nil {
				return false
			}
			d.log.Error("delivery: replay failed", "replay", id, "err", err)
			return d.endReplay(ctx, id, err)
		}
		if p.replayed > 0 {
			d.inboxes.notify(p.inbox)
			d.cfg.Metrics.replayed(p.inbox, p.replayed)
		}
		if p.state != ReplayRunning {
			if p.state == ReplayCompleted && p.batches > 0 {
				d.log.Info("delivery: replay completed", "replay", id, "replayed", p.total, "batches", p.batches)
			}
			return true
		}
		d.log.DebugContext(ctx, "delivery: replay batch", "replay", id, "replayed", p.total, "batches", p.batches)
	}
}

// replayProgress is what one batch did.
type replayProgress struct {
	inbox    string
	state    string // the job's state after the batch
	replayed int    // items this batch returned to pending
	total    int64  // the job's replayed count
	batches  int64
}

// replayBatch runs one batch of job id in one transaction: it walks the
// next BatchSize items of the range after the job's cursor, returns those
// in the job's states to pending, and moves the cursor past them; when
// none are left it completes the job. A job that is not running (it ended
// in another process) is left alone.
func (d *Delivery) replayBatch(ctx context.Context, id string) (replayProgress, error) {
	var p replayProgress
	err := d.update(ctx, func(tx conn) error {
		p = replayProgress{}
		var uid, until, states, cursorAt string
		var batch int
		var cursorID int64
		err := tx.QueryRowContext(ctx, `SELECT subscription_uid, inbox_id, until, states, batch_size, state, cursor_at, cursor_id,
			replayed, batches FROM replays WHERE replay_id = ?`+d.forUpdate(), id).Scan(&uid, &p.inbox, &until, &states, &batch, &p.state,
			&cursorAt, &cursorID, &p.total, &p.batches)
		if err != nil || p.state != ReplayRunning {
			return err
		}
		now := d.now().UTC().Format(sqlitedb.Time)
		rows, err := tx.QueryContext(ctx, `SELECT item_id, created_at, state FROM inbox_items
			WHERE subscription_uid = ?1 AND created_at < ?2 AND (created_at, item_id) > (?3, ?4)
			ORDER BY created_at, item_id LIMIT ?5`, uid, until, cursorAt, cursorID, batch)
		if err != nil {
			return err
		}
		wanted := strings.Split(states, ",")
		var walked int
		var moves []move
		for rows.Next() {
			var m move
			var state string
			if err := rows.Scan(&m.id, &cursorAt, &state); err != nil {
				rows.Close()
				return err
			}
			cursorID, walked = m.id, walked+1
			if slices.Contains(wanted, state) {
				moves = append(moves, m)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if len(moves) > 0 {
			// The state is checked again: an item may have moved since the
			// walk read it (on PostgreSQL, where writers run at once). One
			// statement a state, so that each is counted as it leaves it.
			t := tally{}
			for _, state := range wanted {
				args := []any{now, state}
				for _, m := range moves {
					args = append(args, m.id)
				}
				rows, err := tx.QueryContext(ctx, `UPDATE inbox_items SET state = 'pending', attempts = 0, next_attempt_at = ?1,
					lease_token = NULL, lease_expires_at = NULL, failed_at = NULL, completed_at = NULL,
					replayed_at = ?1, replays = replays + 1, updated_at = ?1
					WHERE state = ?2 AND item_id IN (`+strings.Repeat(",?", len(moves))[1:]+`) RETURNING inbox_id, subscription_uid`, args...)
				if err != nil {
					return err
				}
				for rows.Next() {
					var inbox, sub string
					if err := rows.Scan(&inbox, &sub); err != nil {
						rows.Close()
						return err
					}
					p.replayed++
					t.move(inbox, sub, state, StatePending, 1)
				}
				rows.Close()
				if err := rows.Err(); err != nil {
					return err
				}
			}
			if err := t.write(ctx, d, tx); err != nil {
				return err
			}
		}
		p.total += int64(p.replayed)
		p.batches++
		var finished any
		if walked < batch { // the range is walked
			p.state, finished = ReplayCompleted, now
		}
		_, err = tx.ExecContext(ctx, `UPDATE replays SET cursor_at = ?, cursor_id = ?, replayed = ?, batches = ?, state = ?,
			finished_at = ?, updated_at = ? WHERE replay_id = ?`, cursorAt, cursorID, p.total, p.batches, p.state, finished, now, id)
		return err
	})
	return p, err
}

// endReplay fails job id with cause, and reports whether it could.
func (d *Delivery) endReplay(ctx context.Context, id string, cause error) bool {
	now := d.now().UTC().Format(sqlitedb.Time)
	err := d.update(ctx, func(tx conn) error {
		_, err := tx.ExecContext(ctx, `UPDATE replays SET state = 'failed', error = ?1, finished_at = ?2, updated_at = ?2
			WHERE replay_id = ?3 AND state = 'running'`, cause.Error(), now, id)
		return err
	})
	if err != nil && ctx.Err() == nil {
		d.log.Error("delivery: recording a failed replay failed", "replay", id, "err", err)
	}
	return err == nil
}
