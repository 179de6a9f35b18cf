// Package buildinfo says which postbox this is: its version, the commit it
// was built from and when, read from the build information Go embeds in
// every binary (debug.ReadBuildInfo), so that `go install` and a plain
// `go build` in a checkout both report it without flags.
//
// A release build may stamp the version with
//
//	go build -ldflags "-X github.com/postbox-events/postbox/internal/buildinfo.version=v1.2.3" ./cmd/postbox
//
// which wins over what the module says, and the commit and its time
// (buildinfo.commit, buildinfo.buildTime) where the build has no VCS
// information: the Dockerfile stamps all three, its build context having
// no .git.
package buildinfo

import (
	"runtime"
	"runtime/debug"
	"sync"
)

// version, commit and buildTime are set by -ldflags -X at release
// builds.
var version, commit, buildTime string

// Info is what a binary knows of its build.
type Info struct {
	Version   string `json:"version"`              // v1.2.3, a pseudo-version, or "devel" for a build from a checkout
	Commit    string `json:"commit,omitempty"`     // the VCS revision, with "-dirty" when the tree had changes
	BuildTime string `json:"build_time,omitempty"` // the commit's time (RFC 3339), as the VCS stamp says
	GoVersion string `json:"go_version"`
}

var (
	once sync.Once
	info Info
)

// Get returns the build information of the running binary.
func Get() Info {
	once.Do(func() { info = read(version, commit, buildTime) })
	return info
}

// read reads the build information, with the version, commit and time
// stamped at build, when set, over what it says.
func read(stamped, stampedCommit, stampedTime string) Info {
	i := Info{Version: "devel", GoVersion: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if ok {
		if v := bi.Main.Version; v != "" && v != "(devel)" {
			i.Version = v
		}
		dirty := false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				i.Commit = s.Value
			case "vcs.time":
				i.BuildTime = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if dirty && i.Commit != "" {
			i.Commit += "-dirty"
		}
	}
	if stamped != "" {
		i.Version = stamped
	}
	if stampedCommit != "" {
		i.Commit, i.BuildTime = stampedCommit, stampedTime
	}
	return i
}

// String is the one line `postbox version` prints.
func (i Info) String() string {
	s := "postbox " + i.Version
	if i.Commit != "" {
		s += " (commit " + i.Commit
		if i.BuildTime != "" {
			s += ", " + i.BuildTime
		}
		s += ")"
	}
	return s + " " + i.GoVersion + " " + runtime.GOOS + "/" + runtime.GOARCH
}
