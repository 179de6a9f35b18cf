package main_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestBenchAgentJSON runs bench agent small, two rounds: each run of the
// agent path stored every event once and left the outbox empty, direct
// ingest ran beside it, and the ratio is of the two medians.
func TestBenchAgentJSON(t *testing.T) {
	cmd := exec.Command(binary, "bench", "agent", "--events", "3000", "--chunk", "500", "--rounds", "2", "--devices", "4", "--json")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bench agent: %v\n%s%s", err, out, stderr.String())
	}
	if !strings.Contains(stderr.String(), "bench agent: round 2: agent path 3000 events") {
		t.Errorf("stderr has no progress of the second round's agent path:\n%s", stderr.String())
	}
	var res struct {
		Events  int    `json:"events"`
		Chunk   int    `json:"chunk"`
		Senders int    `json:"senders"`
		Sync    string `json:"synchronous"`
		Agent   []struct {
			IntakeS    float64 `json:"intake_s"`
			DurationS  float64 `json:"duration_s"`
			EventsPerS float64 `json:"events_per_s"`
			Stored     int64   `json:"stored"`
			Duplicates int64   `json:"duplicates_stored"`
			Pending    int64   `json:"outbox_pending"`
			Rejected   int64   `json:"outbox_rejected"`
		} `json:"agent"`
		Direct     []float64 `json:"direct_events_per_s"`
		AgentRate  float64   `json:"agent_events_per_s"`
		DirectRate float64   `json:"direct_events_per_s_median"`
		Ratio      float64   `json:"ratio"`
		Components string    `json:"components"`
	}
	lastJSON(t, out, &res)
	if res.Events != 3000 || res.Chunk != 500 || res.Senders < 1 || res.Sync != "FULL" || res.Components != "in-process" {
		t.Errorf("settings: %+v", res)
	}
	if len(res.Agent) != 2 || len(res.Direct) != 2 {
		t.Fatalf("want two runs of each path, got %d agent, %d direct", len(res.Agent), len(res.Direct))
	}
	for i, r := range res.Agent {
		if r.Stored != 3000 || r.Duplicates != 0 || r.Pending != 0 || r.Rejected != 0 {
			t.Errorf("agent run %d: %+v; want 3000 stored once each and an empty outbox", i, r)
		}
		if r.IntakeS <= 0 || r.IntakeS > r.DurationS || r.EventsPerS <= 0 {
			t.Errorf("agent run %d: want 0 < intake <= end to end, got %+v", i, r)
		}
	}
	if res.AgentRate <= 0 || res.DirectRate <= 0 || res.Ratio <= 0 || res.Ratio != res.AgentRate/res.DirectRate {
		t.Errorf("want positive medians and their ratio, got %v / %v = %v", res.AgentRate, res.DirectRate, res.Ratio)
	}
}

// TestBenchAgentHelp: the mode has its own --help, and bench's names it.
func TestBenchAgentHelp(t *testing.T) {
	out, err := exec.Command(binary, "bench", "agent", "--help").Output()
	if err != nil || !strings.Contains(string(out), "Usage: postbox bench agent") || !strings.Contains(string(out), "--senders") {
		t.Fatalf("bench agent --help: %v\n%s", err, out)
	}
	out, err = exec.Command(binary, "bench", "--help").Output()
	if err != nil || !strings.Contains(string(out), "postbox bench agent") {
		t.Fatalf("bench --help does not name bench agent: %v\n%s", err, out)
	}
}
