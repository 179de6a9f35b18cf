package main_test

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

// TestBenchWebhooksJSON runs bench webhooks small: every webhook is
// answered 202, stored exactly once, and the do-nothing baseline ran.
func TestBenchWebhooksJSON(t *testing.T) {
	out, err := exec.Command(binary, "bench", "webhooks", "--requests", "2000", "--connections", "8", "--json").Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("bench webhooks: %v\n%s%s", err, out, stderr)
	}
	var res struct {
		Requests     int              `json:"requests"`
		Connections  int              `json:"connections"`
		Accepted     int64            `json:"accepted"`
		Statuses     map[string]int64 `json:"statuses"`
		Stored       int64            `json:"stored"`
		Duplicates   int64            `json:"duplicates_stored"`
		AcceptedPerS float64          `json:"accepted_per_s"`
		P50Ms        float64          `json:"p50_ms"`
		P99Ms        float64          `json:"p99_ms"`
		MaxMs        float64          `json:"max_ms"`
		BaselinePerS float64          `json:"baseline_per_s"`
		Ratio        float64          `json:"ratio"`
	}
	lastJSON(t, out, &res)
	if res.Requests != 2000 || res.Connections != 8 {
		t.Errorf("settings: want 2000 requests on 8 connections, got %+v", res)
	}
	if res.Accepted != 2000 || res.Statuses["202"] != 2000 || len(res.Statuses) != 1 {
		t.Errorf("want 2000 answers, all 202, got %d accepted, statuses %v", res.Accepted, res.Statuses)
	}
	if res.Stored != 2000 || res.Duplicates != 0 {
		t.Errorf("want 2000 webhooks stored once each, got %d stored, %d duplicate rows", res.Stored, res.Duplicates)
	}
	if res.AcceptedPerS <= 0 || res.BaselinePerS <= 0 || res.Ratio <= 0 {
		t.Errorf("want positive rates and ratio, got %+v", res)
	}
	if res.P50Ms <= 0 || res.P50Ms > res.P99Ms || res.P99Ms > res.MaxMs {
		t.Errorf("want 0 < p50 <= p99 <= max, got %v, %v, %v", res.P50Ms, res.P99Ms, res.MaxMs)
	}
}

// TestBenchWebhooksHelp: the mode has its own --help and bench's still
// describes the device mode.
func TestBenchWebhooksHelp(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "webhooks", "--help"}, "Usage: postbox bench webhooks"},
		{[]string{"bench", "--help"}, "-devices"},
	} {
		out, err := exec.Command(binary, tc.args...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), tc.want) || !strings.Contains(string(out), "Usage: postbox bench") {
			t.Errorf("postbox %s: %v, want %q in:\n%s", strings.Join(tc.args, " "), err, tc.want, out)
		}
	}
}

// lastJSON decodes the last line of a command's output, where --json
// prints the result, into v.
func lastJSON(t *testing.T, out []byte, v any) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), v); err != nil {
		t.Fatalf("last line is not the JSON result: %q: %v", lines[len(lines)-1], err)
	}
}
