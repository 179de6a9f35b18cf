package migrate_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/postbox-events/postbox/internal/migrate"
)

func files(names ...string) fstest.MapFS {
	fsys := fstest.MapFS{}
	for _, n := range names {
		fsys[n] = &fstest.MapFile{Data: []byte("-- " + n)}
	}
	return fsys
}

func TestReadAndPending(t *testing.T) {
	for _, tc := range []struct {
		name    string
		fsys    fstest.MapFS
		current int
		pending []string // names, in order
		err     string   // a substring of Read's error
	}{
		{name: "fresh database applies all in number order", fsys: files("0002_b.sql", "0010_c.sql", "0001_a.sql"),
			pending: []string{"0001_a.sql", "0002_b.sql", "0010_c.sql"}},
		{name: "applied ones are skipped", fsys: files("0001_a.sql", "0002_b.sql", "0003_c.sql"), current: 2,
			pending: []string{"0003_c.sql"}},
		{name: "up to date", fsys: files("0001_a.sql", "0002_b.sql"), current: 2},
		{name: "a database ahead of the files applies nothing", fsys: files("0001_a.sql"), current: 7},
		{name: "a gap is not an error", fsys: files("0001_a.sql", "0003_c.sql"), current: 1,
			pending: []string{"0003_c.sql"}},
		{name: "other files are ignored", fsys: files("0001_a.sql", "README.md", "0002_b.sql.orig"),
			pending: []string{"0001_a.sql"}},
		{name: "no files", fsys: files("README.md"), err: "no *.sql files"},
		{name: "a name without a number", fsys: files("0001_a.sql", "init.sql"), err: "init.sql: name must start with a number"},
		{name: "a number without an underscore", fsys: files("0001.sql"), err: "0001.sql: name must start with a number"},
		{name: "two files with one number", fsys: files("0001_a.sql", "0002_b.sql", "0002_c.sql"), err: "0002_c.sql: number 2 is also 0002_b.sql's"},
		{name: "numbers of different widths", fsys: files("9_a.sql", "10_b.sql"), err: "9_a.sql: number 9 sorts after 10_b.sql's 10"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			all, err := migrate.Read(tc.fsys)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Read: err %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Read: %v", err)
			}
			for _, m := range all {
				if m.SQL != "-- "+m.Name {
					t.Errorf("%s: SQL %q, want the file's contents", m.Name, m.SQL)
				}
			}
			var got []string
			for _, m := range migrate.Pending(all, tc.current) {
				got = append(got, m.Name)
			}
			if !reflect.DeepEqual(got, tc.pending) {
				t.Fatalf("pending at version %d: %q, want %q", tc.current, got, tc.pending)
			}
		})
	}
}

func TestReadNoFilesIsErrNoFiles(t *testing.T) {
	if _, err := migrate.Read(fstest.MapFS{}); !errors.Is(err, migrate.ErrNoFiles) {
		t.Fatalf("Read of an empty directory: %v, want ErrNoFiles", err)
	}
}

func TestCheck(t *testing.T) {
	all, err := migrate.Read(files("0001_a.sql", "0002_b.sql", "0003_c.sql"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		current int
		err     string // a substring of Check's error; none for nil
	}{
		{current: 0},
		{current: 2},
		{current: 3},
		{current: 5, err: "database holds delivery schema 5; this postbox ("},
	} {
		err := migrate.Check("delivery", all, tc.current)
		if tc.err == "" {
			if err != nil {
				t.Errorf("Check at %d: %v, want nil", tc.current, err)
			}
			continue
		}
		var tooNew *migrate.TooNewError
		if !errors.As(err, &tooNew) || tooNew.Have != tc.current || tooNew.Know != 3 || tooNew.Component != "delivery" ||
			!strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), ") knows up to 3: it was written by a newer postbox") {
			t.Errorf("Check at %d: %v, want a *TooNewError saying %q", tc.current, err, tc.err)
		}
	}
}
