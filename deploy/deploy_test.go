// Package deploy_test checks the monitoring files under deploy/ against
// the code: every metric an alert rule or a dashboard panel queries must
// be one postbox exports, so that a renamed metric cannot leave an alert
// that never fires.
package deploy_test

import (
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// exported returns the metric names the code registers: the Name of
// every collector's options and every NewDesc, in the module's non-test
// Go files.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	decl := regexp.MustCompile(`(?:Name:\s*|NewDesc\(\s*)"(postbox_[a-z_]+)"`)
	names := map[string]bool{}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || d.Name() == "bench") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range decl.FindAllStringSubmatch(string(src), -1) {
			names[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(names) < 20 {
		t.Fatalf("found only %d metric declarations: the scan is broken", len(names))
	}
	return names
}

var metricRef = regexp.MustCompile(`\bpostbox_[a-z_]+\b`)

// checkQuery fails the test for every metric expr names that no code
// exports. A histogram's series are its name and _bucket, _sum, _count.
func checkQuery(t *testing.T, known map[string]bool, where, expr string) {
	t.Helper()
	refs := metricRef.FindAllString(expr, -1)
	if len(refs) == 0 {
		t.Errorf("%s: %q queries no postbox metric", where, expr)
	}
	for _, name := range refs {
		base := name
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if s, ok := strings.CutSuffix(name, suffix); ok && known[s] {
				base = s
			}
		}
		if !known[base] {
			t.Errorf("%s: %s is not a metric postbox exports (expr %q)", where, name, expr)
		}
	}
}

// TestAlertRules reads deploy/prometheus/alerts.yml: every rule has an
// alert name, an expr on exported metrics, a severity and a summary; and
// promtool, when installed, accepts the file.
func TestAlertRules(t *testing.T) {
	known := exported(t)
	src, err := os.ReadFile("prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	type rule struct{ alert, expr, severity, summary string }
	var rules []*rule
	for _, line := range strings.Split(string(src), "\n") {
		key, value, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		value = strings.TrimSpace(value)
		switch key {
		case "- alert":
			rules = append(rules, &rule{alert: value})
		case "expr", "severity", "summary":
			if len(rules) == 0 {
				t.Fatalf("%q before the first alert", line)
			}
			r := rules[len(rules)-1]
			switch key {
			case "expr":
				r.expr = value
			case "severity":
				r.severity = value
			case "summary":
				r.summary = value
			}
		}
	}
	if len(rules) < 5 {
		t.Fatalf("found %d alert rules, want the lag, dead letter, oldest pending, writer queue and endpoint alerts at least", len(rules))
	}
	for _, r := range rules {
		if r.expr == "" || r.summary == "" || (r.severity != "warning" && r.severity != "critical") {
			t.Errorf("alert %s: expr %q, severity %q, summary %q: each needs all three (severity warning or critical)", r.alert, r.expr, r.severity, r.summary)
		}
		checkQuery(t, known, "alert "+r.alert, r.expr)
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Log("promtool is not installed: the rules' PromQL is not parsed (apt-get install prometheus to check it)")
		return
	}
	if out, err := exec.Command(promtool, "check", "rules", "prometheus/alerts.yml").CombinedOutput(); err != nil {
		t.Errorf("promtool check rules: %v\n%s", err, out)
	}
}

// TestGrafanaDashboard reads deploy/grafana/postbox.json: valid JSON, and
// every panel's queries name exported metrics.
func TestGrafanaDashboard(t *testing.T) {
	known := exported(t)
	src, err := os.ReadFile("grafana/postbox.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(src, &dash); err != nil {
		t.Fatalf("grafana/postbox.json: %v", err)
	}
	if dash.Title == "" || len(dash.Panels) < 8 {
		t.Fatalf("dashboard %q has %d panels", dash.Title, len(dash.Panels))
	}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			checkQuery(t, known, "panel "+p.Title, q.Expr)
		}
	}
}
