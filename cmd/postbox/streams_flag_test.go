package main_test

import (
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/postbox-events/postbox/internal/testenv"
)

// TestServeStreamsBadInput: a --streams (or POSTBOX_STREAMS) value that
// names no backend, has a bad option or points at a peer that is not
// there stops serve at once with a message naming it, and never prints a
// password.
func TestServeStreamsBadInput(t *testing.T) {
	for _, tc := range []struct {
		spec string
		code int
		want []string
	}{
		{"amqp://broker:5672", 2, []string{"--streams", "sqlite", "nats://", "kafka://", "postgres://"}},
		{"kafka://127.0.0.1:9092?colour=blue", 2, []string{"--streams", "colour", "replication_factor"}},
		{"kafka://127.0.0.1:9092?replication_factor=0", 2, []string{"--streams", "replication_factor"}},
		{"kafka://127.0.0.1:9092?claim_timeout=soon", 2, []string{"--streams", "claim_timeout"}},
		{"kafka://pat:hunter2@127.0.0.1:9092?sasl_mechanism=gssapi", 2, []string{"--streams", "sasl_mechanism"}},
		{"kafka://a,,b", 2, []string{"--streams", "empty broker address"}},
		{"nats://127.0.0.1:4222?replicas=2", 2, []string{"--streams", "replicas"}},
		{"nats://127.0.0.1:4222?colour=blue", 2, []string{"--streams", "colour"}},
		{"nats://pat:hunter2@127.0.0.1:1", 1, []string{"--streams", "127.0.0.1:1"}},
		{"postgres://pat:hunter2@127.0.0.1:1/db?connect_timeout=2", 1, []string{"--streams", "127.0.0.1"}},
		{"postgres://127.0.0.1:1/db?schema=bad-schema", 1, []string{"--streams", "bad-schema"}},
	} {
		out, code := run(t, "serve", "--addr", "127.0.0.1:0", "--db", filepath.Join(t.TempDir(), "p.db"), "--streams", tc.spec)
		if code != tc.code {
			t.Errorf("serve --streams %s: exit %d, want %d: %s", tc.spec, code, tc.code, out)
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("serve --streams %s: output does not name %q: %s", tc.spec, w, out)
			}
		}
		if strings.Contains(out, "hunter2") {
			t.Errorf("serve --streams %s: the password is in the output: %s", tc.spec, out)
		}
	}
	cmd := exec.Command(binary, "serve", "--addr", "127.0.0.1:0", "--db", filepath.Join(t.TempDir(), "p.db"))
	cmd.Env = append(cmd.Environ(), "POSTBOX_STREAMS=redis://x")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "POSTBOX_STREAMS") {
		t.Errorf("POSTBOX_STREAMS=redis://x: want a startup error naming it, got %v: %s", err, out)
	}
}

// TestServeStoreBadInput: a --store serve cannot use stops it at start,
// naming the flag and what is wrong, without printing a password.
func TestServeStoreBadInput(t *testing.T) {
	nats := "nats://127.0.0.1:1" // never dialled: --store is checked first, or fails first
	for _, tc := range []struct {
		store, streams string
		code           int
		want           []string
	}{
		{"mysql://db:3306/postbox", "sqlite", 2, []string{"--store", "sqlite", "postgres://"}},
		{"postgres://pat:hunter2@127.0.0.1:5432/db", "sqlite", 2, []string{"--store", "--streams sqlite", "nats://"}},
		{"postgres://pat:hunter2@127.0.0.1:1/db?connect_timeout=2", "postgres://pat:hunter2@127.0.0.1:1/db?connect_timeout=2", 1, []string{"--streams", "127.0.0.1"}},
		{"postgres://pat:hunter2@127.0.0.1:1/db", nats, 1, []string{"--streams", "127.0.0.1:1"}},
	} {
		out, code := run(t, "serve", "--addr", "127.0.0.1:0", "--db", filepath.Join(t.TempDir(), "p.db"), "--store", tc.store, "--streams", tc.streams)
		if code != tc.code {
			t.Errorf("serve --store %s --streams %s: exit %d, want %d: %s", tc.store, tc.streams, code, tc.code, out)
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("serve --store %s: output does not name %q: %s", tc.store, w, out)
			}
		}
		if strings.Contains(out, "hunter2") {
			t.Errorf("serve --store %s: the password is in the output: %s", tc.store, out)
		}
	}
	t.Run("dead store", func(t *testing.T) { serveDeadStore(t) })
}

// serveDeadStore: a dead PostgreSQL behind --store, with streams that
// work, stops serve naming --store.
func serveDeadStore(t *testing.T) {
	pg := testenv.URL(t, testenv.Postgres)
	schema := "t_store_" + strconv.Itoa(os.Getpid())
	t.Cleanup(func() { testenv.DropSchema(t, pg, schema) })
	u, err := url.Parse(pg)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("schema", schema)
	u.RawQuery = q.Encode()
	streams := u.String()
	out, code := run(t, "serve", "--addr", "127.0.0.1:0", "--db", filepath.Join(t.TempDir(), "p.db"), "--streams", streams,
		"--store", "postgres://pat:hunter2@127.0.0.1:1/db?connect_timeout=2")
	if code != 1 || !strings.Contains(out, "--store") || strings.Contains(out, "hunter2") {
		t.Errorf("serve with a dead --store: exit %d, want 1 naming --store without the password: %s", code, out)
	}
}
