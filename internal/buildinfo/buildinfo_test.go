package buildinfo

import (
	"os"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

func TestRead(t *testing.T) {
	i := read("", "", "")
	if i.Version == "" || i.GoVersion != runtime.Version() {
		t.Errorf("read() = %+v: want a version and %s", i, runtime.Version())
	}
	if s := i.String(); !strings.HasPrefix(s, "postbox "+i.Version) || !strings.Contains(s, runtime.GOOS+"/"+runtime.GOARCH) {
		t.Errorf("String() = %q", s)
	}
	if got := read("v9.9.9", "", "").Version; got != "v9.9.9" {
		t.Errorf("a stamped version: %q, want v9.9.9", got)
	}
	if got := read("v9.9.9", "0123abc", "2026-11-25T04:00:00Z"); got.Commit != "0123abc" || got.BuildTime != "2026-11-25T04:00:00Z" ||
		!strings.Contains(got.String(), "(commit 0123abc, 2026-11-25T04:00:00Z)") {
		t.Errorf("a stamped commit and time: %+v %q", got, got.String())
	}
}

// TestVersion: every build says the source's version, a semantic version
// without its tag's "v", and CHANGELOG.md has a section for it.
func TestVersion(t *testing.T) {
	semver := regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?$`)
	if !semver.MatchString(Version) {
		t.Errorf("Version = %q: want a semantic version such as 1.2.3", Version)
	}
	if got := read("", "", "").Version; got != Version {
		t.Errorf("read() without a stamp says version %q, want %q", got, Version)
	}
	if got := Get().Version; got != Version {
		t.Errorf("Get() in a test binary says version %q, want %q", got, Version)
	}
	changelog, err := os.ReadFile("../../CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^## ` + regexp.QuoteMeta(Version) + ` - \d{4}-\d{2}-\d{2}$`).Match(changelog) {
		t.Errorf("CHANGELOG.md has no section \"## %s - YYYY-MM-DD\"", Version)
	}
}
