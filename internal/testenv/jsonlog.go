package testenv

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// JSONLog collects what a logger writes as JSON lines, for tests that
// read what was logged. Its zero value is ready; it may be written from
// many goroutines.
type JSONLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write implements io.Writer.
func (l *JSONLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// Logger returns a logger that writes JSON lines at INFO and above to l.
func (l *JSONLog) Logger() *slog.Logger { return slog.New(slog.NewJSONHandler(l, nil)) }

// Lines returns the lines logged so far whose message is msg (every line
// when msg is ""), each as its JSON object.
func (l *JSONLog) Lines(t testing.TB, msg string) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.b.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if msg == "" || m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}
