// Command godedup runs one delivery through Go's dedup.Handle, for the
// Python tests that check a Go handler and a Python handler share one
// inbox table. Its function records the delivery in the table effects
// (handler, id), in the dedup transaction. It prints "ran" or "skipped".
//
//	godedup -db postgres://...?search_path=S|FILE -handler H -id X
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"os"
	"strings"

	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/postbox-events/postbox/dedup"
)

func main() {
	dsn := flag.String("db", "", "postgres:// URL or SQLite file")
	handler := flag.String("handler", "", "handler name")
	id := flag.String("id", "", "the delivery's id")
	migrate := flag.Bool("migrate", false, "create the inbox table first (dedup.Migrate)")
	flag.Parse()
	driver, source := "sqlite", "file:"+*dsn+"?_pragma=busy_timeout(5000)"
	if strings.HasPrefix(*dsn, "postgres://") || strings.HasPrefix(*dsn, "postgresql://") {
		driver, source = "pgx", *dsn
	}
	db, err := sql.Open(driver, source)
	if err == nil {
		defer db.Close()
		err = run(db, *migrate, *handler, *id)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "godedup:", err)
		os.Exit(1)
	}
}

func run(db *sql.DB, migrate bool, handler, id string) error {
	ctx := context.Background()
	if migrate {
		return dedup.Migrate(ctx, db)
	}
	ran, err := dedup.Handle(ctx, db, handler, id, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO effects (handler, id) VALUES ($1, $2)`, handler, id)
		return err
	})
	if err != nil {
		return err
	}
	if ran {
		fmt.Println("ran")
	} else {
		fmt.Println("skipped")
	}
	return nil
}
