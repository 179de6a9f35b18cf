package main_test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/servertest"
	"github.com/postbox-events/postbox/internal/testenv"
)

// TestOperatorCommandsOverTLS: the operator commands reach a server with
// a self-signed certificate given --ca-cert or POSTBOX_CA_CERT, and
// without it say which flag is missing.
func TestOperatorCommandsOverTLS(t *testing.T) {
	dir := t.TempDir()
	certPath, keyPath, _ := servertest.SelfSignedCert(t, dir)
	addr := freePort(t)
	start(t, "serve", "--addr", addr, "--db", filepath.Join(dir, "pb.db"), "--tls-cert", certPath, "--tls-key", keyPath)
	base := "https://" + addr
	testenv.Eventually(t, 20*time.Second, "streams over TLS with --ca-cert to answer", func() bool {
		out, code := run(t, "streams", "--server", base, "--ca-cert", certPath)
		return code == 0 && strings.Contains(out, "webhooks")
	})
	out, code := run(t, "streams", "--server", base)
	if code == 0 || !strings.Contains(out, "--ca-cert") {
		t.Fatalf("streams over TLS without the CA: exit %d\n%s\nwant a failure naming --ca-cert", code, out)
	}
	out, code = runWithEnv(t, []string{"POSTBOX_CA_CERT=" + certPath, "POSTBOX_API_URL=" + base}, "sources", "list")
	if code != 0 || !strings.Contains(out, "webhooks") {
		t.Fatalf("sources list with POSTBOX_CA_CERT: exit %d\n%s", code, out)
	}
	out, code = run(t, "streams", "--server", base, "--ca-cert", keyPath)
	if code != 2 || !strings.Contains(out, "--ca-cert: "+keyPath+": no PEM certificate") {
		t.Fatalf("streams --ca-cert of a key: exit %d\n%s\nwant a usage error naming the file", code, out)
	}
}
