package main_test

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
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
		{"kafka://broker:9092", 2, []string{"--streams", "sqlite", "nats://", "postgres://"}},
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
