package powercut_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/postbox-events/postbox/internal/powercut"
)

// write writes data at off in the file at path, creating it, and syncs
// it when sync is set.
func write(t *testing.T, path string, data string, off int64, sync bool) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte(data), off); err != nil {
		t.Fatal(err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
}

func content(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestCut: after a cut each file holds what its last sync made durable,
// whatever was written, grown or truncated since; a file created and
// never synced is empty; and the directory works again afterwards.
func TestCut(t *testing.T) {
	pc := powercut.Mount(t)
	synced := filepath.Join(pc.Dir(), "synced")
	write(t, synced, "hello world", 0, true)
	write(t, synced, "HELLO", 0, false)
	write(t, synced, " and more", 11, false)

	unsynced := filepath.Join(pc.Dir(), "unsynced")
	write(t, unsynced, "never synced", 0, false)

	truncated := filepath.Join(pc.Dir(), "truncated")
	write(t, truncated, "0123456789abcdefghij", 0, true)
	if err := os.Truncate(truncated, 5); err != nil {
		t.Fatal(err)
	}
	write(t, truncated, "XY", 8, false)
	if got := content(t, truncated); got != "01234\x00\x00\x00XY" {
		t.Fatalf("before the cut: %q", got)
	}

	twice := filepath.Join(pc.Dir(), "twice")
	write(t, twice, "first", 0, true)
	write(t, twice, "second", 0, true)
	write(t, twice, "third", 0, false)

	lost, err := pc.Cut(false)
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{synced: "hello world", unsynced: "", truncated: "0123456789abcdefghij", twice: "second"} {
		if got := content(t, path); got != want {
			t.Errorf("%s after the cut: %q, want %q", filepath.Base(path), got, want)
		}
	}
	if lost != 6 {
		t.Errorf("lost %d operations, want 6", lost)
	}

	write(t, synced, "!", 11, true)
	if _, err := pc.Cut(false); err != nil {
		t.Fatal(err)
	}
	if got := content(t, synced); got != "hello world!" {
		t.Errorf("written after a cut and synced, then cut again: %q", got)
	}
}

// TestCutKeepsSome: with keep, the writes after the last sync are each
// kept or lost, and those kept are applied in order.
func TestCutKeepsSome(t *testing.T) {
	pc := powercut.Mount(t)
	path := filepath.Join(pc.Dir(), "log")
	const n = 64
	for i := range n {
		write(t, path, "x", int64(i), false)
	}
	lost, err := pc.Cut(true)
	if err != nil {
		t.Fatal(err)
	}
	got := []byte(content(t, path))
	kept := bytes.Count(got, []byte("x"))
	if kept+lost != n || bytes.Count(got, []byte{0})+kept != len(got) {
		t.Fatalf("after the cut: %q, %d lost of %d", got, lost, n)
	}
	if kept == 0 || lost == 0 {
		t.Fatalf("kept %d and lost %d of %d writes: want some of each (1 in 2^63)", kept, lost, n)
	}
}
