package main_test

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestServeTargetPolicy: a webhook target at the cloud metadata address
// stops serve at startup with the reason, unless link-local targets are
// allowed; --deny-private-targets, here from its environment variable,
// refuses a loopback one.
func TestServeTargetPolicy(t *testing.T) {
	for _, c := range []struct {
		env  []string
		args []string
		want string
	}{
		{[]string{"WEBHOOK_TARGET_URL=http://169.254.169.254/latest/meta-data/"}, nil,
			"target address 169.254.169.254 is link-local: refused (--allow-link-local-targets)"},
		{[]string{"POSTBOX_DENY_PRIVATE_TARGETS=true"}, []string{"--webhook-target", "http://127.0.0.1:9/in"},
			"target address 127.0.0.1 is loopback: refused (--deny-private-targets)"},
		{[]string{"POSTBOX_ALLOW_LINK_LOCAL_TARGETS=maybe"}, nil, "environment variable POSTBOX_ALLOW_LINK_LOCAL_TARGETS"},
	} {
		args := append([]string{"serve", "--addr", "127.0.0.1:0", "--db", filepath.Join(t.TempDir(), "p.db")}, c.args...)
		cmd := exec.Command(binary, args...)
		cmd.Env = append(cmd.Environ(), c.env...)
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), c.want) {
			t.Errorf("%v %v: want a startup error saying %q, got %v: %s", c.env, c.args, c.want, err, out)
		}
	}
}
