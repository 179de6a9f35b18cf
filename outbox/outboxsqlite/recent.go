package outboxsqlite

import (
	"sort"
	"sync"
	"time"

	"github.com/postbox-events/postbox/outbox"
)

// maxRecent bounds the rows recent keeps; past it, Due reads the file
// until the relay catches up with what is inserted after.
const maxRecent = 1 << 16

// recent keeps the rows this Store inserted, as Due hands them out, so
// that a relay reading just behind the inserts gets them from memory
// instead of reading back what was just written.
//
// It covers the seqs (lo, hi]: while valid, every row of the table with a
// seq in that range was inserted by this Store's writer after lo was read
// in its transaction, and is in rows unless deleted since (gone). Any
// other change to a row in range (rejected, retried later, requeued)
// makes it invalid; so does a row some other connection inserted (the
// next flush finds sqlite_sequence past hi), and so does growing past
// maxRecent. The next flush with inserts starts a new range.
//
// Outcomes find their row by seq; one without a seq (not from a Message)
// makes the range invalid too, rather than have every row indexed by id
// for it.
type recent struct {
	mu    sync.Mutex
	valid bool
	lo    int64
	hi    int64
	rows  []recentRow // by seq from head on; delivered rows leave from the front
	head  int
	live  int // rows not gone
}

type recentRow struct {
	msg  outbox.Message
	next time.Time // next_attempt_at
	gone bool      // deleted: delivered
}

// committed records what a committed flush did: the rows it inserted
// (from == the sqlite_sequence value its transaction found before them,
// to == after them; from < 0 without inserts) and the settles it wrote.
func (r *recent) committed(from, to int64, inserted []*write, settles []*write) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if from >= 0 {
		if !r.valid || from != r.hi {
			r.reset(from)
		}
		for _, it := range inserted {
			if it.seq == 0 {
				continue // a duplicate or a conflict: not written
			}
			if len(r.rows) == cap(r.rows) && r.head >= len(r.rows)/2 {
				// Full, half of it left behind: move the rest to the
				// front rather than grow.
				n := copy(r.rows, r.rows[r.head:])
				clear(r.rows[n:])
				r.rows, r.head = r.rows[:n], 0
			}
			r.rows = append(r.rows, recentRow{msg: it.msg, next: it.next})
			r.rows[len(r.rows)-1].msg.Seq = it.seq
			r.live++
		}
		r.hi = to
		if r.live > maxRecent {
			r.invalidate()
		}
	}
	for _, it := range settles {
		for _, o := range it.settle {
			if !r.valid {
				return
			}
			if o.Seq == 0 {
				r.invalidate()
				return
			}
			row := r.row(o.Seq)
			if row == nil || row.gone {
				continue // not in range (Due reads it from the file), or delivered before
			}
			if row.msg.EventID != o.EventID { // not this store's row: trust the file
				r.invalidate()
				return
			}
			switch o.Kind {
			case outbox.Delivered:
				row.gone = true
				r.live--
			case outbox.Unanswered: // unchanged but for its last error
			default:
				r.invalidate()
				return
			}
		}
	}
	for r.head < len(r.rows) && r.rows[r.head].gone {
		r.rows[r.head] = recentRow{} // its payload is free to go
		r.head++
	}
}

// row returns the row of seq, or nil when the range does not hold it.
func (r *recent) row(seq int64) *recentRow {
	rows := r.rows[r.head:]
	i := sort.Search(len(rows), func(i int) bool { return rows[i].msg.Seq >= seq })
	if i == len(rows) || rows[i].msg.Seq != seq {
		return nil
	}
	return &rows[i]
}

func (r *recent) reset(from int64) {
	r.valid, r.lo, r.hi = true, from, from
	r.rows, r.head, r.live = nil, 0, 0
}

// invalidate drops the range: Due reads the file until the next flush
// with inserts starts a new one.
func (r *recent) invalidate() {
	r.valid = false
	r.rows, r.head, r.live = nil, 0, 0
}

// due returns up to limit rows after seq due at now, and hi; ok is false
// when the range does not cover after, and Due must read the file. Rows
// after hi are the file's to give.
func (r *recent) due(now time.Time, after int64, limit int) (out []outbox.Message, hi int64, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.valid || after < r.lo {
		return nil, 0, false
	}
	rows := r.rows[r.head:]
	i := sort.Search(len(rows), func(i int) bool { return rows[i].msg.Seq > after })
	for ; i < len(rows) && len(out) < limit; i++ {
		if row := &rows[i]; !row.gone && !row.next.After(now) {
			out = append(out, row.msg)
		}
	}
	return out, r.hi, true
}
