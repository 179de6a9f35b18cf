package dedup_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/postbox-events/postbox/dedup"
	_ "modernc.org/sqlite"
)

// A workflow orchestrator starts one workflow per command,
// however often the API retries the dispatch: the handler is the
// orchestrator's name and the id the command's id. The workflow's row and
// the inbox record commit together.
func ExampleHandle() {
	dir, _ := os.MkdirTemp("", "dedup-example-*")
	defer os.RemoveAll(dir)
	ctx := context.Background()

	// busy_timeout makes concurrent deliveries wait for each other.
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if err := dedup.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE workflows (command_id TEXT PRIMARY KEY, kind TEXT NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	type StartWorkflow struct{ CommandID, Kind string }
	startWorkflow := func(ctx context.Context, cmd StartWorkflow) error {
		started, err := dedup.Handle(ctx, db, "worker_orchestrator", cmd.CommandID, func(tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO workflows (command_id, kind) VALUES ($1, $2)`, cmd.CommandID, cmd.Kind)
			return err
		})
		if err != nil {
			return err // nothing recorded: the retried command runs again
		}
		fmt.Printf("%s: started %v\n", cmd.CommandID, started)
		return nil
	}

	cmd := StartWorkflow{CommandID: "6f1c2a9e-3b7d-4c2e-9f00-5a1b2c3d4e5f", Kind: "render_asset"}
	for range 3 { // the API dispatched it, timed out, and retried twice
		if err := startWorkflow(ctx, cmd); err != nil {
			log.Fatal(err)
		}
	}
	var n int
	db.QueryRow(`SELECT count(*) FROM workflows`).Scan(&n)
	fmt.Println(n, "workflow")
	// Output:
	// 6f1c2a9e-3b7d-4c2e-9f00-5a1b2c3d4e5f: started true
	// 6f1c2a9e-3b7d-4c2e-9f00-5a1b2c3d4e5f: started false
	// 6f1c2a9e-3b7d-4c2e-9f00-5a1b2c3d4e5f: started false
	// 1 workflow
}
