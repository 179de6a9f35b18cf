package main

import (
	"bytes"
	"flag"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/sqlitedb"
)

// TestDurationFlag: every duration flag takes Go syntax or bare seconds,
// and refuses what is not a duration or is under its minimum, saying so.
func TestDurationFlag(t *testing.T) {
	for _, c := range []struct {
		min     time.Duration
		arg     string
		want    time.Duration
		wantErr string
	}{
		{1, "30", 30 * time.Second, ""},
		{1, "1.5", 1500 * time.Millisecond, ""},
		{1, "2m30s", 150 * time.Second, ""},
		{1, "0", 0, "not a positive duration"},
		{1, "forever", 0, `"forever" is not a duration`},
		{0, "0", 0, ""},
		{0, "-1s", 0, "under 0s"},
		{math.MinInt64, "-1", -time.Second, ""},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		d := durationVar(fs, "d", 7*time.Second, c.min, "a duration")
		err := fs.Parse([]string{"--d", c.arg})
		switch {
		case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
			t.Errorf("min %v, %q: %v, want an error saying %q", c.min, c.arg, err, c.wantErr)
		case c.wantErr == "" && (err != nil || *d != c.want):
			t.Errorf("min %v, %q: %v %v, want %v", c.min, c.arg, *d, err, c.want)
		}
	}
}

// TestOutboxCommandsRefuseOtherFiles: an outbox command given a file that
// holds no outbox (an empty file, a server's database) says so, exits 1,
// and leaves the file as it was.
func TestOutboxCommandsRefuseOtherFiles(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.db")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "other.db")
	db, err := sqlitedb.Open(other, sqlitedb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE stream_events (pos INTEGER PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	for _, path := range []string{empty, other} {
		before, _ := os.ReadFile(path)
		for _, cmd := range [][]string{{"outbox", "list"}, {"outbox", "requeue", "--all"}} {
			r := cli(t, append(cmd, "--outbox", path)...)
			if r.code != 1 || !strings.Contains(r.stderr, "no outbox in this file") {
				t.Errorf("%v on %s: %+v, want exit 1 saying there is no outbox", cmd, filepath.Base(path), r)
			}
		}
		if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
			t.Errorf("%s changed: %d bytes before, %d after", filepath.Base(path), len(before), len(after))
		}
	}
}
