package buildinfo

import (
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
