package testenv

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A passing package's output is hidden by go test, skip messages
// included, so a newcomer's `go test ./...` would not say that the tests
// needing PostgreSQL, Redis or NATS did not run. Each skip is therefore
// also counted in a file shared by the test binaries of one go test run
// (they are children of one go command), and the first skip starts a
// reporter: a copy of the test binary (see init) that waits for the go
// command to exit, then writes one line with the counts to where go
// wrote its own output. Under go test -json, or when the parent is not
// the go command (a test binary run by hand, whose skips show with -v),
// nothing is counted.

// reportVar tells a copy of a test binary to be the reporter:
// "STATEFILE:GO_PID".
const reportVar = "POSTBOX_TESTENV_REPORT"

func init() {
	if v := os.Getenv(reportVar); v != "" {
		report(v)
		os.Exit(0)
	}
}

// countSkip counts a skip for want of variable name in this go test run.
func countSkip(name string) {
	goPID := os.Getppid()
	run, ok := goTestRun(goPID)
	if !ok {
		return
	}
	state := filepath.Join(os.TempDir(), "postbox-test-skips-"+run)
	f, err := os.OpenFile(state, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return
	}
	f.WriteString(name + "\n") // one short append: atomic between processes
	f.Close()
	lock, err := os.OpenFile(state+".reporter", os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return // another test binary of this run started it
	}
	lock.Close()
	out, err := os.OpenFile(fmt.Sprintf("/proc/%d/fd/1", goPID), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return
	}
	defer out.Close()
	exe, err := os.Executable()
	if err != nil {
		return
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), reportVar+"="+state+":"+strconv.Itoa(goPID))
	cmd.Stdout = out // the go command's output, not this binary's (go waits for that pipe)
	if cmd.Start() == nil {
		cmd.Process.Release()
	}
}

// goTestRun returns a name for the go test run whose go command is pid
// (its pid and start time), and false when pid is not a go test without
// -json.
func goTestRun(pid int) (string, bool) {
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil || strings.TrimSpace(string(comm)) != "go" {
		return "", false
	}
	args, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	argv := strings.Split(string(args), "\x00")
	if err != nil || !slices.Contains(argv, "test") ||
		slices.ContainsFunc(argv, func(a string) bool { return strings.HasPrefix(a, "-json") || strings.HasPrefix(a, "--json") }) {
		return "", false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", false
	}
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	if len(fields) < 20 {
		return "", false
	}
	return strconv.Itoa(pid) + "-" + fields[19], true // field 22, starttime
}

// report waits for the go command to exit, then prints the skips counted
// in the state file and removes it.
func report(v string) {
	i := strings.LastIndexByte(v, ':')
	if i < 0 {
		return
	}
	state := v[:i]
	pid, err := strconv.Atoi(v[i+1:])
	if err != nil {
		return
	}
	signal.Ignore(syscall.SIGINT, syscall.SIGHUP) // go test interrupted: still report what skipped
	defer os.Remove(state + ".reporter")
	defer os.Remove(state)
	for deadline := time.Now().Add(24 * time.Hour); syscall.Kill(pid, 0) == nil && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	b, err := os.ReadFile(state)
	if err != nil {
		return
	}
	if line := summary(string(b)); line != "" {
		fmt.Println(line)
	}
}

// summary is the line that reports the skips counted in state, one
// variable name a line; "" when there are none.
func summary(state string) string {
	counts := map[string]int{}
	total := 0
	for name := range strings.FieldsSeq(state) {
		counts[name]++
		total++
	}
	if total == 0 {
		return ""
	}
	names := make([]string, 0, len(counts))
	for name := range counts {
		names = append(names, name)
	}
	slices.Sort(names)
	parts := make([]string, len(names))
	for i, name := range names {
		parts[i] = fmt.Sprintf("%s (%d)", name, counts[name])
	}
	tests := "tests"
	if total == 1 {
		tests = "test"
	}
	return fmt.Sprintf("postbox: %d %s skipped for want of a service; set %s to run them (README, Development)", total, tests, strings.Join(parts, ", "))
}
