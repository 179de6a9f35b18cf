package streamsqlite_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/postbox-events/postbox/stream/streamsqlite"
)

// TestSearchUsesIndexes: each filter of Search reads an index, newest
// first: a native id the identity's (sorting its few variants), a type
// stream_events_by_type, no filter (a time range is a range of keys) the
// primary key.
func TestSearchUsesIndexes(t *testing.T) {
	b, err := streamsqlite.Open(filepath.Join(t.TempDir(), "s.db"), streamsqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, c := range []struct {
		what, nativeID, typ, want string
		sorts                     bool
	}{
		{"every event", "", "", "USING INTEGER PRIMARY KEY", false},
		{"by native id", "evt-1", "", "USING INDEX sqlite_autoindex_stream_events", true},
		{"by type", "", "order.created", "USING INDEX stream_events_by_type", false},
	} {
		q, args := streamsqlite.SearchSQL("orders", 1<<40, 1<<41, c.nativeID, c.typ, 100)
		rows, err := b.ReadDB().Query(`EXPLAIN QUERY PLAN `+q, args...)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		var plan []string
		for rows.Next() {
			var id, parent, unused int
			var detail string
			if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
		}
		rows.Close()
		p := strings.Join(plan, "; ")
		if !strings.Contains(p, c.want) || strings.Contains(p, "TEMP B-TREE") != c.sorts || strings.HasPrefix(p, "SCAN") {
			t.Errorf("%s: plan %q, want %q (a sort: %v)", c.what, p, c.want, c.sorts)
		}
	}
}
