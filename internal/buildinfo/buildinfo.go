// Package buildinfo says which postbox this is: its version (the constant
// Version, the same in every build: go build, go run, go install, a test
// binary, the image), and the commit it was built from and when, read
// from the build information Go embeds in every binary built in a git
// checkout (debug.ReadBuildInfo), so that a plain `go build` reports it
// without flags.
//
// Where the build has no VCS information (the Dockerfile's build context
// has no .git) the commit and its time may be stamped with
//
//	-ldflags "-X github.com/postbox-events/postbox/internal/buildinfo.commit=… -X github.com/postbox-events/postbox/internal/buildinfo.buildTime=…"
//
// A packager may stamp another version (buildinfo.version, e.g.
// 0.1.0+deb1); scripts/release.sh does not: it refuses a VERSION other
// than Version.
package buildinfo

import (
	"runtime"
	"runtime/debug"
	"sync"
)

// Version is this source's version, in semantic versioning (without the
// "v" of its git tag, v0.1.0). A release bumps it in the commit it tags,
// and CHANGELOG.md has a section of the same name.
const Version = "0.1.0"

// version, commit and buildTime may be set by -ldflags -X; version, when
// set, replaces Version.
var version, commit, buildTime string

// Info is what a binary knows of its build.
type Info struct {
	Version   string `json:"version"`              // Version, unless the build stamped another
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
// stamped at build, when set, over what it says. The module version Go
// records (v0.1.0 for go install …@v0.1.0, a pseudo-version, or (devel))
// is not read: Version is the version in every build.
func read(stamped, stampedCommit, stampedTime string) Info {
	i := Info{Version: Version, GoVersion: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if ok {
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
