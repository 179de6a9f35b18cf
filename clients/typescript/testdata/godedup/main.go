// Command godedup handles ids with Go's dedup.HandlePgx on the inbox
// table of a PostgreSQL schema, for the TypeScript client's test that a
// Go handler and a TypeScript handler share one table. For each id it
// prints "ID ran" or "ID skipped"; its handler's write is a row of
// dedup_effects (id, 'go').
//
//	go run ./clients/typescript/testdata/godedup -db 'postgres://...?search_path=s' -handler shipping evt_1 evt_2
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-events/postbox/dedup"
)

func main() {
	db := flag.String("db", "", "the PostgreSQL URL (with search_path)")
	handler := flag.String("handler", "", "the handler's name")
	flag.Parse()
	if err := run(*db, *handler, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "godedup:", err)
		os.Exit(1)
	}
}

func run(db, handler string, ids []string) error {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, db)
	if err != nil {
		return err
	}
	defer pool.Close()
	for _, id := range ids {
		ran, err := dedup.HandlePgx(ctx, pool, handler, id, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO dedup_effects (id, by) VALUES ($1, 'go')`, id)
			return err
		})
		if err != nil {
			return err
		}
		if ran {
			fmt.Println(id, "ran")
		} else {
			fmt.Println(id, "skipped")
		}
	}
	return nil
}
