// Package testenv finds the external services (PostgreSQL, Redis, NATS)
// that integration tests talk to.
//
// A test asks for a service by name; its address comes from the
// environment variable POSTBOX_TEST_<NAME>. Without it the test is skipped
// with a message saying which variable to set, unless
// POSTBOX_REQUIRE_SERVICES=1 (set by .ci/run), which turns the skip into a
// failure so that CI never passes by skipping. go test ./... ends with one
// line counting the skips and naming the variables (see countSkip).
package testenv

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// The services, each read from POSTBOX_TEST_<name>.
const (
	Postgres = "POSTGRES" // postgres://postgres@127.0.0.1:5432/test?sslmode=disable
	Redis    = "REDIS"    // redis://127.0.0.1:6379/0
	NATS     = "NATS"     // nats://127.0.0.1:4222
)

// URL returns the address of service, or skips (fails, under
// POSTBOX_REQUIRE_SERVICES=1) the test when it is not configured.
func URL(t testing.TB, service string) string {
	t.Helper()
	name := "POSTBOX_TEST_" + service
	if v := os.Getenv(name); v != "" {
		return v
	}
	msg := name + " is not set; this test needs a real " + service + " (see README, Development)"
	if os.Getenv("POSTBOX_REQUIRE_SERVICES") == "1" {
		t.Fatal(msg + " and POSTBOX_REQUIRE_SERVICES=1 forbids skipping")
	}
	countSkip(name)
	t.Skip(msg)
	return ""
}

// Skip skips the test with msg, saying what it lacks, or fails it under
// POSTBOX_REQUIRE_SERVICES=1, where every test must run.
func Skip(t testing.TB, msg string) {
	t.Helper()
	if os.Getenv("POSTBOX_REQUIRE_SERVICES") == "1" {
		t.Fatal(msg + "; POSTBOX_REQUIRE_SERVICES=1 forbids skipping")
	}
	t.Skip(msg)
}

var schemaSeq atomic.Int64

// PostgresSchema returns the URL of the test PostgreSQL with search_path
// set to a new, empty schema that is dropped when the test ends, so that
// tests sharing one database never see each other's tables.
func PostgresSchema(t testing.TB) string {
	t.Helper()
	base := URL(t, Postgres)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("connect to %s: %v", base, err)
	}
	defer conn.Close(ctx)
	schema := fmt.Sprintf("t_%d_%d_%d", os.Getpid(), time.Now().UnixNano()%1e9, schemaSeq.Add(1))
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { DropSchema(t, base, schema) })
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// DropSchema drops schema, and everything in it, from the PostgreSQL at
// url; a failure is a test error.
func DropSchema(t testing.TB, url, schema string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Errorf("drop schema %s: %v", schema, err)
		return
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
		t.Errorf("drop schema %s: %v", schema, err)
	}
}

// Eventually polls cond until it holds, failing the test after timeout.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		<-tick.C
	}
}

// Progressing polls cond until it is done, failing the test only once
// stall has passed without progress: progress is a number that changes
// while the awaited work goes on (a lag that shrinks, a count of items
// completed). Use it to wait for an amount of work, whose time depends on
// the machine: a fixed deadline for it fails on a loaded one while
// nothing is wrong (under -race on a CI machine at load 24, a SQLite store
// took 13 s to append and materialise 1,000 events), where a stalled loop
// still fails, stall after its last step.
func Progressing(t testing.TB, stall time.Duration, what string, cond func() (done bool, progress int64)) {
	t.Helper()
	start := time.Now()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	done, last := cond()
	moved := time.Now()
	for !done {
		<-tick.C
		var p int64
		if done, p = cond(); p != last {
			last, moved = p, time.Now()
		}
		if !done && time.Since(moved) > stall {
			t.Fatalf("gave up waiting for %s after %v: no progress in the last %v (stuck at %d)",
				what, time.Since(start).Round(time.Millisecond), stall, last)
		}
	}
}

// Buffer is a bytes.Buffer that a logger or a process writes while the
// test reads it.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
