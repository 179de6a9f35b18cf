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
type recent struct {
	mu    sync.Mutex
	valid bool
	lo    int64
	hi    int64
	rows  []*recentRow // by seq
	byID  map[string]*recentRow
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
			row := &recentRow{msg: it.msg, next: it.next}
			row.msg.Seq = it.seq
			r.rows = append(r.rows, row)
			r.byID[row.msg.EventID] = row
		}
		r.hi = to
		if len(r.byID) > maxRecent {
			r.invalidate()
		}
	}
	for _, it := range settles {
		for _, o := range it.settle {
			row := r.byID[o.EventID]
			if row == nil {
				continue // not in range: Due reads it from the file
			}
			switch o.Kind {
			case outbox.Delivered:
				row.gone = true
				delete(r.byID, o.EventID)
			case outbox.Unanswered: // unchanged but for its last error
			default:
				r.invalidate()
				return
			}
		}
	}
	for len(r.rows) > 0 && r.rows[0].gone {
		r.rows[0] = nil
		r.rows = r.rows[1:]
	}
}

func (r *recent) reset(from int64) {
	r.valid, r.lo, r.hi = true, from, from
	r.rows, r.byID = nil, map[string]*recentRow{}
}

// invalidate drops the range: Due reads the file until the next flush
// with inserts starts a new one.
func (r *recent) invalidate() {
	r.valid = false
	r.rows, r.byID = nil, nil
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
	i := sort.Search(len(r.rows), func(i int) bool { return r.rows[i].msg.Seq > after })
	for ; i < len(r.rows) && len(out) < limit; i++ {
		if row := r.rows[i]; !row.gone && !row.next.After(now) {
			out = append(out, row.msg)
		}
	}
	return out, r.hi, true
}
