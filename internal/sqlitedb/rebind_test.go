package sqlitedb_test

import (
	"testing"

	"github.com/postbox-events/postbox/internal/sqlitedb"
)

// TestRebind: SQLite's ? and ?N parameters become PostgreSQL's $N,
// numbered as SQLite numbers them.
func TestRebind(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`SELECT 1`, `SELECT 1`},
		{`SELECT ? , ?`, `SELECT $1 , $2`},
		{`WHERE a = ?1 AND b = ?2 OR c = ?1`, `WHERE a = $1 AND b = $2 OR c = $1`},
		{`VALUES (?1, ?2, ?3) WHERE x <= ?`, `VALUES ($1, $2, $3) WHERE x <= $4`},
		{`?3, ?`, `$3, $4`},
		{`?10`, `$10`},
	} {
		if got := sqlitedb.Rebind(c.in); got != c.want {
			t.Errorf("Rebind(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
