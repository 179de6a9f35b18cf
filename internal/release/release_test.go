package release_test

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"debug/buildinfo"
	"debug/elf"
	"debug/macho"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	pbinfo "github.com/postbox-events/postbox/internal/buildinfo"
)

const script = "../../scripts/release.sh"

// target is one platform release.sh builds, and what its binary must be.
type target struct {
	goos, goarch, goarm string
	file                string // the binary's name in the release
	machine             any    // elf.Machine or macho.Cpu
}

var targets = []target{
	{"linux", "amd64", "", "postbox-%s-linux-amd64", elf.EM_X86_64},
	{"linux", "arm64", "", "postbox-%s-linux-arm64", elf.EM_AARCH64},
	{"linux", "arm", "7", "postbox-%s-linux-armv7", elf.EM_ARM},
	{"darwin", "arm64", "", "postbox-%s-darwin-arm64", macho.CpuArm64},
}

// release runs release.sh with args and returns its combined output.
func release(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command("bash", append([]string{script}, args...)...).CombinedOutput()
	return string(out), err
}

// head is the commit release.sh stamps, or a skip without git.
func head(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("SKIP: release.sh needs a git checkout and git (%v)", err)
	}
	return strings.TrimSpace(string(out))
}

// sums reads a SHA256SUMS file: file name → hex sum.
func sums(t *testing.T, dir string) map[string]string {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok || len(sum) != 64 {
			t.Fatalf("SHA256SUMS line %q: want \"SUM  NAME\"", sc.Text())
		}
		m[name] = sum
	}
	return m
}

// TestRelease builds every target with release.sh (the test that each
// cross-compiles) and checks each binary: its sum, its platform, static
// (no interpreter, no shared library), stripped, built with -trimpath
// and without cgo, stamped with the version and commit; then builds one
// target again and gets the same bytes.
func TestRelease(t *testing.T) {
	commit := head(t)
	dir := t.TempDir()
	start := time.Now()
	if out, err := release(t, "--allow-dirty", "--out", dir, pbinfo.Version); err != nil {
		t.Fatalf("release.sh %s: %v\n%s", pbinfo.Version, err, out)
	}
	t.Logf("release.sh built %d targets in %s", len(targets), time.Since(start).Round(time.Second))
	got := sums(t, dir)
	if len(got) != len(targets) {
		t.Errorf("SHA256SUMS lists %d files, want %d: %v", len(got), len(targets), got)
	}
	for _, tg := range targets {
		name := strings.Replace(tg.file, "%s", pbinfo.Version, 1)
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, name)
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != got[name] {
				t.Errorf("sha256 %x, SHA256SUMS says %s", sum, got[name])
			}
			checkPlatform(t, path, tg)
			bi, err := buildinfo.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			settings := map[string]string{}
			for _, s := range bi.Settings {
				settings[s.Key] = s.Value
			}
			want := map[string]string{"CGO_ENABLED": "0", "GOOS": tg.goos, "GOARCH": tg.goarch, "-trimpath": "true"}
			if tg.goarm != "" {
				want["GOARM"] = tg.goarm
			}
			for k, v := range want {
				if settings[k] != v {
					t.Errorf("build setting %s = %q, want %q", k, settings[k], v)
				}
			}
			// -trimpath keeps -ldflags out of the build settings: the
			// commit must be in the binary's data.
			if !bytes.Contains(b, []byte(commit)) {
				t.Errorf("the binary does not hold the commit %s", commit)
			}
			if _, ok := settings["vcs.revision"]; ok {
				t.Errorf("a VCS stamp (%v): release.sh builds with -buildvcs=false and stamps the commit itself", settings)
			}
			if tg.goos == runtime.GOOS && tg.goarch == runtime.GOARCH {
				out, err := exec.Command(path, "version").CombinedOutput()
				if want := "postbox " + pbinfo.Version + " (commit " + commit; err != nil || !strings.HasPrefix(string(out), want) {
					t.Errorf("%s version: %v: %q, want it to start with %q", name, err, out, want)
				}
			}
		})
	}

	// The same commit built again (a cache hit for the compiler, a new
	// link) gives the same bytes.
	native := "linux/amd64"
	again := t.TempDir()
	if out, err := release(t, "--allow-dirty", "--out", again, "--targets", native, pbinfo.Version); err != nil {
		t.Fatalf("release.sh --targets %s: %v\n%s", native, err, out)
	}
	name := "postbox-" + pbinfo.Version + "-linux-amd64"
	if second := sums(t, again); len(second) != 1 || second[name] != got[name] {
		t.Errorf("a second build of %s: %v, the first: %s", native, second, got[name])
	}
}

// checkPlatform checks the binary is for tg's platform and stripped, and
// a Linux one static.
func checkPlatform(t *testing.T, path string, tg target) {
	t.Helper()
	if tg.goos == "darwin" {
		f, err := macho.Open(path)
		if err != nil {
			t.Fatalf("not a Mach-O binary: %v", err)
		}
		defer f.Close()
		if f.Cpu != tg.machine {
			t.Errorf("Mach-O cpu %v, want %v", f.Cpu, tg.machine)
		}
		if f.Segment("__DWARF") != nil {
			t.Errorf("a __DWARF segment: not stripped (-w)")
		}
		return
	}
	f, err := elf.Open(path)
	if err != nil {
		t.Fatalf("not an ELF binary: %v", err)
	}
	defer f.Close()
	if f.Machine != tg.machine {
		t.Errorf("ELF machine %v, want %v", f.Machine, tg.machine)
	}
	if f.Section(".symtab") != nil || f.Section(".debug_info") != nil {
		t.Errorf("a .symtab or .debug_info section: not stripped (-s -w)")
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("a %v program header: not a static binary", p.Type)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("links %v: not a static binary", libs)
	}
}

// TestReleaseDebug: --debug keeps the debug data that -s -w strip.
func TestReleaseDebug(t *testing.T) {
	head(t)
	dir := t.TempDir()
	if out, err := release(t, "--debug", "--allow-dirty", "--out", dir, "--targets", "linux/amd64", pbinfo.Version); err != nil {
		t.Fatalf("release.sh --debug: %v\n%s", err, out)
	}
	f, err := elf.Open(filepath.Join(dir, "postbox-"+pbinfo.Version+"-linux-amd64"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Section(".debug_info") == nil || f.Section(".symtab") == nil {
		t.Errorf("release.sh --debug: no .debug_info or .symtab section")
	}
}

// TestReleaseRefuses: release.sh names what is wrong with its arguments
// and exits non-zero, before it builds anything.
func TestReleaseRefuses(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "no VERSION given"},
		{[]string{"9.9.9"}, "VERSION 9.9.9 is not the version the source declares (" + pbinfo.Version},
		{[]string{"v" + pbinfo.Version}, "is not the version the source declares"},
		{[]string{"--targets", "windows/amd64", "--allow-dirty", "--out", dir, pbinfo.Version}, "unknown target windows/amd64"},
		{[]string{"--strip", pbinfo.Version}, "unknown flag --strip"},
		{[]string{pbinfo.Version, "0.2.0"}, "one VERSION only"},
	} {
		out, err := release(t, tc.args...)
		if err == nil || !strings.Contains(out, tc.want) {
			t.Errorf("release.sh %s: %v: %q, want an error saying %q", strings.Join(tc.args, " "), err, out, tc.want)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("a refused release.sh wrote %d files", len(entries))
	}
}
