// Package streamtest is the conformance suite every stream backend runs:
// it checks, through stream.Backend alone, the rules the interface's doc
// comments state (dense per-stream offsets, idempotent append with
// duplicates and conflicts, reads that move no offset, consumers that start
// at a policy and only move forwards through Commit, Reset, stats and lag,
// appends with no consumer, concurrent appenders, durability across close
// and reopen, and stream.Waiter and stream.Auditor when the backend has
// them).
//
// A backend's test calls Run with the features it lacks and a function
// that opens a store by name. The name must map to the same data when it
// is opened again, so a file-based backend keeps its files in a directory
// of the outer test (t.TempDir returns a new directory on every call), and
// a backend that needs a goroutine running (streamsqlite's writer) stops it
// in the Close of what it returns (see streamsqlite's conformance_test.go):
//
//	func TestConformance(t *testing.T) {
//		dir := t.TempDir()
//		streamtest.Run(t, streamtest.Features{}, func(t *testing.T, name string) stream.Backend {
//			b, err := streamfile.Open(filepath.Join(dir, name))
//			if err != nil {
//				t.Fatal(err)
//			}
//			return b
//		})
//	}
//
// The package's own test runs the suite on a minimal in-memory backend,
// which shows that a backend keeping every rule passes it.
//
// Each check is a subtest named after what it checks, for example
// TestConformance/Idempotence/conflict_changes_nothing, and opens its own
// store, named after the subtest. Run never runs subtests in parallel; a
// check that needs concurrency makes it itself.
package streamtest
