package main_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/postbox-events/postbox/internal/testenv"
)

// benchDelivery runs postbox bench delivery with args and --json, and
// returns its result.
func benchDelivery(t *testing.T, args ...string) (res struct {
	Store       string  `json:"store"`
	Nodes       int     `json:"nodes"`
	Items       int     `json:"items"`
	ItemsPerSec float64 `json:"items_per_sec"`
	Posts       int64   `json:"posts"`
	Signed      bool    `json:"signed"`
	Baseline    float64 `json:"baseline_items_per_sec"`
	Ratio       float64 `json:"ratio"`
	OrderBy     string  `json:"order_by"`
	Keys        int     `json:"keys"`
}) {
	t.Helper()
	out, err := exec.Command(binary, append([]string{"bench", "delivery", "--json"}, args...)...).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("bench delivery %v: %v\n%s%s", args, err, out, stderr)
	}
	lastJSON(t, out, &res)
	return res
}

// TestBenchDelivery runs bench delivery small, on SQLite and on two nodes
// sharing PostgreSQL: every item is delivered (each at least once) and
// the rate is reported; several nodes on SQLite are refused.
func TestBenchDelivery(t *testing.T) {
	res := benchDelivery(t, "--items", "300")
	if res.Store != "sqlite" || res.Nodes != 1 || res.Items != 300 || res.Posts < 300 || res.ItemsPerSec <= 0 {
		t.Errorf("sqlite: want 300 items delivered by 1 node at a positive rate, got %+v", res)
	}
	if res.Baseline <= 0 || res.Ratio <= 0 {
		t.Errorf("sqlite: want the River-style loop's rate and the ratio to it (--baseline is on by default), got %+v", res)
	}
	if res.Signed {
		t.Errorf("without --sign: the result says signed: %+v", res)
	}
	if res := benchDelivery(t, "--items", "300", "--sign", "--baseline=false"); !res.Signed || res.Posts < 300 || res.Ratio != 0 {
		t.Errorf("--sign --baseline=false: want 300 signed items delivered and no baseline, got %+v", res)
	}
	if res := benchDelivery(t, "--items", "300", "--keys", "30", "--order-by", "/order", "--baseline=false"); res.OrderBy != "/order" ||
		res.Keys != 30 || res.Posts < 300 || res.ItemsPerSec <= 0 {
		t.Errorf("--keys 30 --order-by /order: want 300 items of 30 orders delivered in order, got %+v", res)
	}
	out, err := exec.Command(binary, "bench", "delivery", "--nodes", "2").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--store postgres") {
		t.Errorf("bench delivery --nodes 2 on SQLite: want a usage error naming --store postgres, got %v: %s", err, out)
	}
	t.Run("postgres", func(t *testing.T) {
		pg := testenv.URL(t, testenv.Postgres)
		res := benchDelivery(t, "--items", "300", "--nodes", "2", "--store", pg, "--streams", pg)
		if res.Store != "postgres" || res.Nodes != 2 || res.Items != 300 || res.Posts < 300 || res.ItemsPerSec <= 0 {
			t.Errorf("want 300 items delivered by 2 nodes at a positive rate, got %+v", res)
		}
	})
}
