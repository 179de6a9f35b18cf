//go:build race

package agent_test

// raceDetector is whether the race detector is on: it slows the server
// (SQLite above all) several times, and tests that need a loaded link
// size their load by it.
const raceDetector = true
