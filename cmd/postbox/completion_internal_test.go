package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// completionScript writes postbox completion SHELL to a file and returns
// its path.
func completionScript(t *testing.T, shell string) string {
	t.Helper()
	r := cli(t, "completion", shell)
	if r.code != 0 || r.stdout == "" {
		t.Fatalf("completion %s: %v", shell, r)
	}
	path := filepath.Join(t.TempDir(), "postbox."+shell)
	if err := os.WriteFile(path, []byte(r.stdout), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestCompletionBash: the bash script is valid bash and completes
// commands, subcommands and flags, every command of the table among them.
func TestCompletionBash(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	script := completionScript(t, "bash")
	if out, err := exec.Command(bash, "-n", script).CombinedOutput(); err != nil {
		t.Fatalf("bash -n: %v\n%s", err, out)
	}
	complete := func(words ...string) []string {
		t.Helper()
		quoted := make([]string, len(words))
		for i, w := range words {
			quoted[i] = "'" + w + "'"
		}
		prog := "source " + script + "\nCOMP_WORDS=(" + strings.Join(quoted, " ") + ")\nCOMP_CWORD=" + string(rune('0'+len(words)-1)) +
			"\n_postbox\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n"
		out, err := exec.Command(bash, "--norc", "--noprofile", "-c", prog).CombinedOutput()
		if err != nil {
			t.Fatalf("completing %q: %v\n%s", words, err, out)
		}
		return strings.Fields(string(out))
	}
	top := complete("postbox", "")
	for name := range commands {
		if !slices.Contains(top, name) {
			t.Errorf("postbox <TAB> lacks the command %s: %q", name, top)
		}
	}
	for _, tc := range []struct {
		words []string
		want  []string
	}{
		{[]string{"postbox", "dl"}, []string{"dlq"}},
		{[]string{"postbox", "dlq", ""}, []string{"list", "show", "replay", "discard"}},
		{[]string{"postbox", "outbox", "d"}, []string{"drop"}},
		{[]string{"postbox", "dlq", "list", "--si"}, []string{"--since"}},
		{[]string{"postbox", "dlq", "list", "--fr"}, nil}, // an old spelling is not offered
		{[]string{"postbox", "inbox", "list", "--all"}, []string{"--all-pages"}},
		{[]string{"postbox", "relay", "--to"}, []string{"--to", "--token"}},
		{[]string{"postbox", "relay", "--so"}, []string{"--source"}},
		{[]string{"postbox", "consumers", "--j"}, []string{"--json"}},
		{[]string{"postbox", "bench", "w"}, []string{"webhooks"}},
		{[]string{"postbox", "completion", ""}, []string{"bash", "fish", "zsh"}},
		{[]string{"postbox", "subscriptions", "create", "x", "--sou"}, []string{"--source"}},
	} {
		if got := complete(tc.words...); !slices.Equal(got, tc.want) {
			t.Errorf("completing %q: %q, want %q", tc.words, got, tc.want)
		}
	}
}

// TestCompletionScripts: zsh and fish get a script naming every command,
// valid for the shell when it is installed; an unknown shell is a usage
// error.
func TestCompletionScripts(t *testing.T) {
	for _, shell := range []string{"zsh", "fish"} {
		script := completionScript(t, shell)
		b, _ := os.ReadFile(script)
		for name := range commands {
			if !strings.Contains(string(b), name) {
				t.Errorf("completion %s: no %s", shell, name)
			}
		}
		if !strings.Contains(string(b), "since") || strings.Contains(string(b), "all-pages") == false {
			t.Errorf("completion %s: no flags", shell)
		}
		if sh, err := exec.LookPath(shell); err == nil {
			if out, err := exec.Command(sh, "-n", script).CombinedOutput(); err != nil {
				t.Errorf("%s -n: %v\n%s", shell, err, out)
			}
		} else {
			t.Logf("no %s here: its script's syntax is not checked", shell)
		}
	}
	// Where the shells are installed, the scripts complete as bash's does.
	if zsh, err := exec.LookPath("zsh"); err == nil {
		// compadd and _describe work only inside the completion system:
		// stand-ins print what they are given.
		harness := `compdef() { :; }
compadd() { local i=${@[(i)--]}; print -l -- "${@[i+1,-1]}" }
_describe() { print -l -- "${(@P)2}" }
_files() { print FILES }
source ` + completionScript(t, "zsh") + `
words=("$@"); CURRENT=$#; PREFIX=${words[-1]}; _postbox`
		for _, tc := range []struct {
			words []string
			want  string
		}{
			{[]string{"postbox", ""}, "dlq:list, show and replay dead letters"},
			{[]string{"postbox", "dlq", ""}, "list:list dead letters"},
			{[]string{"postbox", "dlq", "list", "--si"}, "--since"},
			{[]string{"postbox", "relay", "--so"}, "--source"},
		} {
			out, err := exec.Command(zsh, append([]string{"-f", "-c", harness, "zsh"}, tc.words...)...).CombinedOutput()
			if err != nil || !strings.Contains(string(out), tc.want) {
				t.Errorf("zsh completing %q: %v, %s; want %q", tc.words, err, out, tc.want)
			}
		}
	}
	if fish, err := exec.LookPath("fish"); err == nil {
		script := completionScript(t, "fish")
		for _, tc := range []struct{ line, want string }{
			{"postbox dl", "dlq"},
			{"postbox dlq ", "replay"},
			{"postbox dlq list --si", "--since"},
			{"postbox outbox drop --", "--all"},
		} {
			out, err := exec.Command(fish, "--no-config", "-c", "source "+script+"; complete -C'"+tc.line+"'").CombinedOutput()
			if err != nil || !strings.Contains(string(out), tc.want) {
				t.Errorf("fish completing %q: %v, %s; want %q", tc.line, err, out, tc.want)
			}
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"completion"}, "completion: shell (bash, zsh or fish) is required"},
		{[]string{"completion", "bsh"}, `no completion for "bsh" (did you mean bash?)`},
	} {
		if r := cli(t, tc.args...); r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("postbox %s: %v, want exit 2 and %q", strings.Join(tc.args, " "), r, tc.want)
		}
	}
}

// TestEveryCommandProbes: every command of the table tells the completion
// its flags or subcommands, and stops at parse: run as a probe, none does
// anything.
func TestEveryCommandProbes(t *testing.T) {
	for _, n := range commandTree() {
		if len(n.flags) == 0 && len(n.subs) == 0 && n.name != "completion" {
			t.Errorf("%s: no flags and no subcommands found", n.name)
		}
		for _, s := range n.subs {
			if len(s.flags) == 0 && n.name != "completion" {
				t.Errorf("%s %s: no flags found", n.name, s.name)
			}
		}
	}
}

// TestOldSpellings: an old flag spelling still works, says what it is now
// and is not listed by --help.
func TestOldSpellings(t *testing.T) {
	r := cli(t, "dlq", "list", "--from", "1h", "--server", "http://127.0.0.1:1")
	if !strings.Contains(r.stderr, "dlq list: --from is now --since; the old spelling still works") || !strings.Contains(r.stderr, "no server answers") {
		t.Fatalf("dlq list --from: %v", r)
	}
	r = cli(t, "inbox", "list", "--all")
	if !strings.Contains(r.stderr, "inbox list: --all is now --all-pages") || !strings.Contains(r.stderr, "--all-pages goes with an INBOX") {
		t.Fatalf("inbox list --all: %v", r)
	}
	for _, args := range [][]string{{"dlq", "list", "--help"}, {"dlq", "replay", "--help"}, {"inbox", "list", "--help"}} {
		r := cli(t, args...)
		if r.code != 0 || strings.Contains(r.stdout, "-from") || strings.Contains(r.stdout, "  -to ") || args[0] == "inbox" && strings.Contains(r.stdout, "  -all\n") {
			t.Errorf("%s lists an old spelling:\n%s", strings.Join(args, " "), r.stdout)
		}
	}
	if r := cliEnv(t, map[string]string{"POSTBOX_DLQ_FROM": "soon"}, "dlq", "list"); r.code != 2 || !strings.Contains(r.stderr, `--since "soon"`) {
		t.Errorf("POSTBOX_DLQ_FROM, the old spelling's variable, is not read: %v", r)
	}
}
