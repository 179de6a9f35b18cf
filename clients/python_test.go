package clients_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/testenv"
)

// pyModules are what the Python package's tests import: pytest and the
// drivers the package supports. Debian ships them all (pyAptLine).
var pyModules = []string{"pytest", "pytest_asyncio", "psycopg", "asyncpg", "sqlalchemy", "aiosqlite"}

const pyAptLine = "apt-get install -y python3-pytest python3-pytest-asyncio python3-psycopg python3-asyncpg python3-sqlalchemy python3-aiosqlite"

// pyInterpreter returns Debian's /usr/bin/python3 when it is there (the
// one apt-get installs the modules for), else the python3 on PATH, or
// skips the test.
func pyInterpreter(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		return "/usr/bin/python3"
	}
	p, err := exec.LookPath("python3")
	if err != nil {
		testenv.Skip(t, "python3 is not installed; the Python client's tests (clients/python) need it and: "+pyAptLine)
	}
	return p
}

// TestPython runs the Python package's tests (pytest clients/python):
// with POSTBOX_TEST_POSTGRES (and POSTBOX_TEST_REDIS) they include the
// cross-language ones against PostgreSQL, Redis, the postbox binary
// (built by the tests, or POSTBOX_BIN) and a Go dedup handler. Without
// python3 or its modules it skips, naming what to install; under
// POSTBOX_REQUIRE_SERVICES=1 it fails instead, and so do the Python tests
// that would skip for want of a service.
func TestPython(t *testing.T) {
	py := pyInterpreter(t)
	check := exec.Command(py, "-c", "import "+strings.Join(pyModules, ", "))
	if out, err := check.CombinedOutput(); err != nil {
		testenv.Skip(t, py+" lacks a module the Python client's tests need ("+strings.TrimSpace(pyLastLine(string(out)))+"): "+pyAptLine)
	}
	dir, err := filepath.Abs("python")
	if err != nil {
		t.Fatal(err)
	}
	// Stop pytest before go test's own timeout, so that its output shows.
	deadline := time.Now().Add(15 * time.Minute)
	if d, ok := t.Deadline(); ok {
		deadline = d.Add(-30 * time.Second)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "-m", "pytest", "-q", "-p", "no:cacheprovider", dir)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s -m pytest clients/python: %v\n%s", py, err, out)
	}
	t.Logf("pytest clients/python: %s", pyLastLine(string(out)))
}

func pyLastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
