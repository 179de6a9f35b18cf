package sqlitedb

import (
	"strconv"
	"strings"
)

// Rebind rewrites a query written with SQLite's parameters for
// PostgreSQL: ?N becomes $N, and a bare ? takes the number after the
// largest one so far, as SQLite numbers it. It is for postbox's own
// queries, which hold no ? in literals; stores that run one query on
// both (delivery, intake) write it once, for SQLite.
func Rebind(query string) string {
	if !strings.Contains(query, "?") {
		return query
	}
	var b strings.Builder
	b.Grow(len(query) + 8)
	largest := 0
	for i := 0; i < len(query); i++ {
		if query[i] != '?' {
			b.WriteByte(query[i])
			continue
		}
		j := i + 1
		for j < len(query) && query[j] >= '0' && query[j] <= '9' {
			j++
		}
		n := largest + 1
		if j > i+1 {
			n, _ = strconv.Atoi(query[i+1 : j])
		}
		largest = max(largest, n)
		b.WriteByte('$')
		b.WriteString(strconv.Itoa(n))
		i = j - 1
	}
	return b.String()
}
