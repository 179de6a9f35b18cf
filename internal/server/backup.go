package server

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/sqlitedb"
)

// getBackup answers GET /v1/backup: a consistent snapshot of the
// server's SQLite database, taken while it serves, written to a
// temporary file beside the database (sqlitedb.SnapshotFile, removed
// once sent) and streamed with its Content-Length. A store that is not a
// SQLite file (PostgreSQL) has its own backup tools: 501.
func (s *Server) getBackup(w http.ResponseWriter, r *http.Request) {
	if site := r.Header.Get("Sec-Fetch-Site"); site == "cross-site" || site == "same-site" {
		// A GET a page of another site can make (a link, an image), which
		// would make the server copy its whole database.
		writeError(w, api.CodeCrossOrigin, "GET /v1/backup from a page of another site (Sec-Fetch-Site: %s) refused", site)
		return
	}
	path, ok := sqlitedb.File(r.Context(), s.store.ReadDB())
	if !ok {
		writeError(w, api.CodeNotKept, "this server's store is not a SQLite file: back up PostgreSQL with its own tools (pg_dump, pg_basebackup; docs/CLUSTER.md)")
		return
	}
	f, err := sqlitedb.SnapshotFile(r.Context(), path)
	if err != nil {
		s.log.Error("backup: snapshot failed", "err", err)
		writeError(w, api.CodeUnavailable, "backup: %v", err)
		return
	}
	defer os.Remove(f.Name())
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		writeError(w, api.CodeUnavailable, "backup: %v", err)
		return
	}
	w.Header().Set("Content-Type", "application/vnd.sqlite3")
	w.Header().Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
	w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", "postbox-backup.db"))
	w.Header().Set("Cache-Control", "no-store")
	if _, err := io.Copy(w, f); err != nil {
		s.log.Warn("backup: sending the snapshot failed", "err", err)
	}
}
