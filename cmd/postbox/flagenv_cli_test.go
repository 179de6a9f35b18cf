package main_test

import (
	"regexp"
	"strings"
	"testing"
)

// commandPaths returns every command of the binary that has flags: the
// top-level ones, and the subcommands their --help lists.
func commandPaths(t *testing.T) []string {
	t.Helper()
	top, code := run(t, "--help")
	if code != 0 {
		t.Fatalf("postbox --help: exit %d: %s", code, top)
	}
	var paths []string
	cmdLine := regexp.MustCompile(`^  ([a-z][a-z-]*) `)
	for line := range strings.Lines(strings.SplitN(top, "Commands:", 2)[1]) {
		m := cmdLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		out, _ := run(t, m[1], "--help")
		if !strings.Contains(out, "COMMAND --help shows") {
			paths = append(paths, m[1])
			continue
		}
		for sub := range strings.Lines(out) {
			if s := cmdLine.FindStringSubmatch(sub); s != nil {
				paths = append(paths, m[1]+" "+s[1])
			}
		}
	}
	if len(paths) < 30 {
		t.Fatalf("found %d commands with flags (%q); the --help formats changed?", len(paths), paths)
	}
	return paths
}

// flagVars parses a command's --help into each flag's environment
// variables, the bracket that ends its usage.
func flagVars(t *testing.T, path, help string) map[string][]string {
	t.Helper()
	flags := map[string][]string{}
	var name, usage string
	flush := func() {
		if name == "" {
			return
		}
		usage = strings.TrimSpace(regexp.MustCompile(`\s*\(default .*\)$`).ReplaceAllString(strings.TrimSpace(usage), ""))
		i := strings.LastIndex(usage, " [")
		if i < 0 || !strings.HasSuffix(usage, "]") {
			t.Errorf("postbox %s --help: -%s names no environment variable: %q", path, name, usage)
			flags[name] = nil
		} else {
			flags[name] = strings.Split(usage[i+2:len(usage)-1], ", ")
		}
		name, usage = "", ""
	}
	flagLine := regexp.MustCompile(`^  -([a-z0-9-]+)`)
	for line := range strings.Lines(strings.SplitN(help, "\nFlags", 2)[1]) {
		if m := flagLine.FindStringSubmatch(line); m != nil {
			flush()
			name = m[1]
			continue
		}
		if name != "" {
			usage += " " + strings.TrimSpace(line)
		}
	}
	flush()
	return flags
}

// TestEveryFlagHasAVariable: each flag of each command names its
// environment variables in --help, first the one derived from its name
// (POSTBOX_FLAG for serve, POSTBOX_COMMAND_FLAG for the others); and no
// variable stands for two different flags.
func TestEveryFlagHasAVariable(t *testing.T) {
	usedBy := map[string]map[string]bool{} // variable → the flag names reading it
	for _, path := range commandPaths(t) {
		help, code := run(t, append(strings.Fields(path), "--help")...)
		if code != 0 || !strings.Contains(help, "\nFlags") {
			t.Errorf("postbox %s --help: exit %d:\n%s", path, code, help)
			continue
		}
		cmd, _, _ := strings.Cut(path, " ")
		for name, vars := range flagVars(t, path, help) {
			if len(vars) == 0 {
				continue
			}
			flag := strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
			want := "POSTBOX_" + strings.ToUpper(cmd) + "_" + flag
			if cmd == "serve" {
				want = "POSTBOX_" + flag
			}
			if vars[0] != want {
				t.Errorf("postbox %s -%s: variables %q, want %s first", path, name, vars, want)
			}
			for _, v := range vars {
				if usedBy[v] == nil {
					usedBy[v] = map[string]bool{}
				}
				usedBy[v][name] = true
			}
		}
	}
	for v, names := range usedBy {
		// serve --api-token and the operator commands' --token are one secret.
		if len(names) > 1 && v != "POSTBOX_API_TOKEN" {
			t.Errorf("%s stands for several flags: %v", v, names)
		}
	}
	for _, v := range []string{"POSTBOX_API_URL", "DATABASE_URL", "LOG_LEVEL", "WORKER_COUNT", "POSTBOX_AGENT_SERVER", "POSTBOX_RELAY_TO"} {
		if usedBy[v] == nil {
			t.Errorf("no flag reads %s", v)
		}
	}
}

// TestFlagsFromTheEnvironment: a command's flags are read from their
// variables, the derived one before an older alias, the command line
// before both; a bad value names its variable, and so does an error that
// names the flag.
func TestFlagsFromTheEnvironment(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		args []string
		want string
	}{
		{[]string{"POSTBOX_OUTBOX_STATE=odd"}, []string{"outbox", "list", "--outbox", "x"}, `--state (POSTBOX_OUTBOX_STATE) must be rejected, pending, delivered or all, not "odd"`},
		// An error naming a flag names the variable that set it.
		{[]string{"POSTBOX_RELAY_TO=http://x"}, []string{"relay", "--db", "x.db"}, `--to (POSTBOX_RELAY_TO) "http://x": use redis://`},
		{[]string{"LOG_LEVEL=loud"}, []string{"relay", "--db", "x.db", "--to", "redis://127.0.0.1:1?stream=s"}, `--log-level (LOG_LEVEL) "loud"`},
		{[]string{"POSTBOX_INBOX_MAX=lots"}, []string{"inbox", "lease", "orders"}, `environment variable POSTBOX_INBOX_MAX="lots"`},
		{[]string{"POSTBOX_SERVE_MAX_BATCH=0", "POSTBOX_MAX_BATCH=0"}, []string{"serve"}, `environment variable POSTBOX_MAX_BATCH="0"`},
		// The operator commands: POSTBOX_API_URL, then the older POSTBOX_SERVER,
		// whose ws:// URL (the agent's) means the same server's HTTP API.
		{[]string{"POSTBOX_API_URL=http://127.0.0.1:1", "POSTBOX_SERVER=http://127.0.0.1:2"}, []string{"dlq", "list"}, "no server answers at http://127.0.0.1:1"},
		{[]string{"POSTBOX_SERVER=ws://127.0.0.1:2/v1/ws"}, []string{"streams"}, "no server answers at http://127.0.0.1:2:"},
		{[]string{"POSTBOX_STREAMS_SERVER=http://127.0.0.1:3", "POSTBOX_API_URL=http://127.0.0.1:1"}, []string{"streams"}, "no server answers at http://127.0.0.1:3"},
		{[]string{"POSTBOX_API_URL=http://127.0.0.1:1"}, []string{"streams", "--server", "http://127.0.0.1:4"}, "no server answers at http://127.0.0.1:4"},
		{[]string{"POSTBOX_SERVER=grpc://127.0.0.1:5"}, []string{"inbox", "list"}, `POSTBOX_SERVER "grpc://127.0.0.1:5": want http://HOST:PORT or https://HOST:PORT (grpc:// is the agent's ingress; set POSTBOX_API_URL`},
		// The agent: POSTBOX_AGENT_SERVER before POSTBOX_SERVER.
		{[]string{"POSTBOX_AGENT_SERVER=ftp://x", "POSTBOX_SERVER=ws://127.0.0.1:1", "POSTBOX_AGENT_DEVICE_ID=d", "POSTBOX_AGENT_OUTBOX=" + t.TempDir() + "/o.db"}, []string{"agent"}, `server url "ftp://x"`},
	} {
		out, code := runWithEnv(t, tc.env, tc.args...)
		if code == 0 || !strings.Contains(out, tc.want) {
			t.Errorf("%v postbox %s: exit %d, output %q; want it to contain %q", tc.env, strings.Join(tc.args, " "), code, out, tc.want)
		}
	}
}

// TestBadFlagIsOneErrorAndAPointer: a bad flag or value prints the error
// and where the flags are described, not the whole usage.
func TestBadFlagIsOneErrorAndAPointer(t *testing.T) {
	for _, tc := range []struct {
		args []string
		cmd  string
	}{
		{[]string{"serve", "--max-batch", "0"}, "serve"},
		{[]string{"serve", "--bogus"}, "serve"},
		{[]string{"inbox", "lease", "--max", "nope"}, "inbox lease"},
		{[]string{"relay", "--claim", "soon"}, "relay"},
	} {
		out, code := run(t, tc.args...)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if code != 2 || len(lines) != 2 || !strings.HasPrefix(lines[0], "postbox: "+tc.cmd+": ") ||
			lines[1] != "Run 'postbox "+tc.cmd+" --help' for its flags and their environment variables." {
			t.Errorf("postbox %s: exit %d, output:\n%s\nwant the error and a pointer to postbox %s --help", strings.Join(tc.args, " "), code, out, tc.cmd)
		}
	}
}
