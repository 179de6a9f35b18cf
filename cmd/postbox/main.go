// Command postbox is the one binary of postbox: the control plane (serve),
// the edge agent (agent), the operator and scripting commands, and the load
// generator (bench). Flag and environment parsing live here and nowhere
// else.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/signal"
	"reflect"
	"regexp"
	"runtime/debug"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/postbox-events/postbox/internal/buildinfo"
)

// command is one subcommand.
type command struct {
	summary string
	run     func(ctx context.Context, env *cmdEnv, args []string) error
}

// cmdEnv is what a command may touch of the process.
type cmdEnv struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	// command is the command whose flags parse parsed last ("inbox
	// lease"), for the hint after a usage error, and fs its flags.
	command string
	fs      *flag.FlagSet
	// probe, when set, runs a command only to learn its subcommands and
	// flags (shell completion): parse records the flags and stops it.
	probe *cmdProbe
}

var commands map[string]command

func init() {
	commands = map[string]command{
		"serve":   {"run the control plane: WebSocket ingress, store, health and metrics", runServe},
		"version": {"print the version, commit and build time (also postbox --version)", runVersion},
		"agent":   {"run the edge agent: durable outbox, local intake, sender", runAgent},
		"send":    {"hand events to a running agent", runSend},
		"outbox":  {"inspect an outbox, re-queue or drop rejected events, emit test events (list, requeue, drop, emit, migrate)", runOutbox},
		"migrate": {"show or apply the schema migrations of serve's store or of an outbox (status, up [--dry-run])", runMigrate},
		"relay":   {"relay a transactional outbox (PostgreSQL or SQLite) to Redis Streams, JetStream, Kafka or postbox", runRelay},
		"bench":   {"measure ingest end to end: N devices pipelining events (bench webhooks: POST /webhooks)", runBench},
		"backup":  {"take a consistent snapshot of a postbox SQLite file while it is in use (or of serve's, through its API)", runBackup},
		"restore": {"put a backup in place as a SQLite database, checked, never over one in use", runRestore},

		"sources":       {"create, list, get and delete sources: devices, webhook endpoints (GitHub, Stripe, ...)", runSources},
		"subscriptions": {"create, list, get, set-target, enable, delete and replay subscriptions", runSubscriptions},
		"streams":       {"show the streams: events, offsets, first and last stored", runStreams},
		"consumers":     {"show, reset and audit the subscriptions' consumers (list|get|reset|history)", runConsumersGroup},
		"inbox":         {"list, search, show, lease, ack and nack inbox items", runInbox},
		"dlq":           {"list, show and replay dead letters: items whose delivery failed", runDLQ},
		"events":        {"show a stored event and its deliveries per subscription; search a stream's events", runEvents},
		"completion":    {"print a shell completion script: postbox completion bash|zsh|fish", runCompletion},
	}
}

// defaultGCPercent is the GOGC postbox runs with unless GOGC is set: the
// heap is small (the queues are bounded), so trading some memory for less
// collector work is cheap.
const defaultGCPercent = 200

func main() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGCPercent)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	env := &cmdEnv{stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv}
	if err := run(ctx, env, os.Args[1:]); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "postbox:", env.sourced(err.Error()))
			var ue usageError
			if errors.As(err, &ue) && env.command != "" {
				fmt.Fprintf(os.Stderr, "Run 'postbox %s --help' for its flags and their environment variables.\n", env.command)
			}
		}
		os.Exit(exitCode(err))
	}
}

func exitCode(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	var ue usageError
	if errors.As(err, &ue) {
		return 2
	}
	return 1
}

// usageError is a mistake in how a command was called (exit status 2).
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

func run(ctx context.Context, env *cmdEnv, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(env.stdout)
		if len(args) == 0 {
			return usagef("no command given")
		}
		return nil
	}
	if args[0] == "--version" || args[0] == "-version" {
		return runVersion(ctx, env, nil)
	}
	cmd, ok := commands[args[0]]
	if !ok {
		hint := ""
		if near := nearest(args[0], slices.Sorted(maps.Keys(commands))); near != "" {
			hint = fmt.Sprintf(" (did you mean %s?)", near)
		}
		return usagef("unknown command %q%s: 'postbox --help' lists the commands", args[0], hint)
	}
	return cmd.run(ctx, env, args[1:])
}

// nearest returns the name of names closest to s: one that begins with s
// or that s begins with (s of three bytes or more), else the nearest
// within two edits; "" when none is.
func nearest(s string, names []string) string {
	best, bestD := "", 3
	for _, n := range names {
		d := editDistance(s, n)
		if len(s) >= 3 && (strings.HasPrefix(n, s) || strings.HasPrefix(s, n)) {
			d = 0
		}
		if d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "postbox moves events from where they happen to the code that handles them,")
	fmt.Fprintln(w, "without losing one and without handling one twice.")
	fmt.Fprintln(w, "\nUsage: postbox COMMAND [flags]   (postbox COMMAND --help for its flags)\n\nCommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-13s %s\n", n, commands[n].summary)
	}
}

// newFlags returns a flag set whose --help prints the command's usage line,
// description and flags, each with its environment variables, to stdout.
func newFlags(env *cmdEnv, name, args, desc string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(env.stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: postbox %s %s\n\n%s\n\nFlags (each also read from the environment variables in brackets, the first\nset one; a flag on the command line wins):\n", name, args, desc)
		printFlags(fs)
	}
	return fs
}

// parse parses args, then sets each flag not on the command line from the
// first of its environment variables (envVars) that is set; a value the
// flag refuses is an error naming the variable. --help prints usage to
// stdout and returns flag.ErrHelp. A bad flag is an error without the
// usage (main points to --help).
func parse(env *cmdEnv, fs *flag.FlagSet, args []string) error {
	if env.probe != nil {
		env.probe.fs = fs
		return errProbed
	}
	env.command, env.fs = fs.Name(), fs
	for _, a := range args {
		if a == "-h" || a == "--help" || a == "-help" {
			fs.SetOutput(env.stdout)
			fs.Usage()
			return flag.ErrHelp
		}
	}
	fs.SetOutput(io.Discard) // the error is returned; the usage is --help's
	err := fs.Parse(flagsFirst(fs, args))
	fs.SetOutput(env.stderr)
	if err != nil {
		msg := err.Error()
		if strings.HasPrefix(msg, "invalid boolean value") { // the flag package says "parse error"
			msg = strings.TrimSuffix(msg, "parse error") + boolWant
		}
		msg += unknownFlagHint(fs, msg)
		return usagef("%s: %s", fs.Name(), msg)
	}
	src := map[string]string{}
	fs.Visit(func(f *flag.Flag) { src[f.Name] = "--" + f.Name })
	sources.Store(fs, src)
	if err := checkOldNames(env.stderr, fs, src); err != nil {
		return err
	}
	var bad error
	fs.VisitAll(func(f *flag.Flag) {
		if src[f.Name] != "" || bad != nil || isOldName(fs, f.Name) {
			return
		}
		for _, v := range envVars(fs, f) {
			if val := env.getenv(v); val != "" {
				if err := fs.Set(f.Name, val); err != nil {
					if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
						err = errors.New(boolWant)
					}
					bad = usagef("environment variable %s=%q: %v", v, val, err)
				}
				src[f.Name] = v
				return
			}
		}
	})
	return bad
}

// boolWant says what a boolean flag or variable takes.
const boolWant = "want true or false (or 1, 0)"

// sources holds, for each parsed flag set, where each flag that is set
// came from: "--NAME" (the command line) or an environment variable.
var sources sync.Map // *flag.FlagSet → map[string]string

// flagSource returns where flag name of fs was set from, after parse: "--NAME"
// on the command line, the name of an environment variable, or "" when
// it has its default.
func flagSource(fs *flag.FlagSet, name string) string {
	m, _ := sources.Load(fs)
	src, _ := m.(map[string]string)
	return src[name]
}

// sourced adds to msg, after the first "--NAME" of each flag that an
// environment variable set, that variable's name ("--to (POSTBOX_RELAY_TO)
// \"http://x\": ..."), unless msg names it already: a user who never typed
// the flag learns where its value came from.
func (env *cmdEnv) sourced(msg string) string {
	if env.fs == nil {
		return msg
	}
	m, _ := sources.Load(env.fs)
	src, _ := m.(map[string]string)
	for name, from := range src {
		if strings.HasPrefix(from, "--") || strings.Contains(msg, from) {
			continue
		}
		flag := "--" + name
		for i := 0; i < len(msg); {
			j := strings.Index(msg[i:], flag)
			if j < 0 {
				break
			}
			end := i + j + len(flag)
			if end == len(msg) || !isFlagByte(msg[end]) {
				msg = msg[:end] + " (" + from + ")" + msg[end:]
				break
			}
			i = end
		}
	}
	return msg
}

// isFlagByte reports whether c may go on a flag's name.
func isFlagByte(c byte) bool {
	return c == '-' || c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// onCommandLine reports whether the flag name was given on the command
// line, not taken from the environment.
func onCommandLine(fs *flag.FlagSet, name string) bool {
	return strings.HasPrefix(flagSource(fs, name), "--")
}

// envVars returns the environment variables of flag f of fs, in the order
// they are tried: the one derived from its name, then those its usage
// names in a trailing bracket ("... [DATABASE_URL]"), older names kept as
// aliases. The derived name is POSTBOX_<FLAG> for serve (--max-batch:
// POSTBOX_MAX_BATCH) and POSTBOX_<COMMAND>_<FLAG> for every other command
// (relay --to: POSTBOX_RELAY_TO; inbox lease --max: POSTBOX_INBOX_MAX),
// so that a flag of one command never reads another's variable.
func envVars(fs *flag.FlagSet, f *flag.Flag) []string {
	cmd, _, _ := strings.Cut(fs.Name(), " ")
	name := strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
	derived := "POSTBOX_" + name
	if cmd != "serve" {
		derived = "POSTBOX_" + strings.ToUpper(strings.ReplaceAll(cmd, "-", "_")) + "_" + name
	}
	vars := []string{derived}
	_, declared := splitVars(f.Usage)
	for _, v := range declared {
		if !slices.Contains(vars, v) {
			vars = append(vars, v)
		}
	}
	for _, v := range oldVars(fs, f) {
		if !slices.Contains(vars, v) {
			vars = append(vars, v) // the old spelling's, read last
		}
	}
	return vars
}

// splitVars splits a flag's usage into its text and the environment
// variables a trailing "[VAR, VAR]" names, if it ends with one.
func splitVars(usage string) (string, []string) {
	i := strings.LastIndex(usage, " [")
	if i < 0 || !strings.HasSuffix(usage, "]") {
		return usage, nil
	}
	var vars []string
	for v := range strings.SplitSeq(usage[i+2:len(usage)-1], ",") {
		v = strings.TrimSpace(v)
		if !envVarName.MatchString(v) {
			return usage, nil
		}
		vars = append(vars, v)
	}
	return usage[:i], vars
}

var envVarName = regexp.MustCompile(`^[A-Z][A-Z0-9_]*$`)

// usageWithVars is f's usage ending with every variable of the flag.
func usageWithVars(fs *flag.FlagSet, f *flag.Flag) string {
	text, _ := splitVars(f.Usage)
	vars := slices.DeleteFunc(envVars(fs, f), func(v string) bool { return slices.Contains(oldVars(fs, f), v) })
	return text + " [" + strings.Join(vars, ", ") + "]"
}

// noArgs refuses positional arguments, for a command that takes none.
func noArgs(fs *flag.FlagSet) error {
	if fs.NArg() > 0 {
		return usagef("%s: takes no arguments, got %q", fs.Name(), fs.Args())
	}
	return nil
}

// flagsFirst moves flags ahead of positional arguments, so that
// "postbox outbox requeue ID --outbox F" works like "--outbox F ID".
// Everything after "--" stays positional.
func flagsFirst(fs *flag.FlagSet, args []string) []string {
	var flags, pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i+1:]...)
			break
		}
		if len(a) < 2 || a[0] != '-' {
			pos = append(pos, a)
			continue
		}
		flags = append(flags, a)
		name := strings.TrimLeft(a, "-")
		if strings.Contains(name, "=") {
			continue
		}
		f := fs.Lookup(name)
		if f == nil {
			continue // Parse names it
		}
		if bf, ok := f.Value.(interface{ IsBoolFlag() bool }); (!ok || !bf.IsBoolFlag()) && i+1 < len(args) {
			flags = append(flags, args[i+1])
			i++
		}
	}
	return append(flags, pos...)
}

// isSet reports whether the flag name was set (on the command line, or
// from one of its environment variables by parse).
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// newLogger returns a slog logger writing to w at level in format
// "json" or "pretty"/"text".
func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, usagef("--log-level %q: use debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv, ReplaceAttr: dropEmpty}
	switch strings.ToLower(format) {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "pretty", "text", "":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, usagef("--log-format %q: use json or pretty", format)
}

// dropEmpty leaves out of log lines the attributes that say nothing: a
// nil error or value, an empty string, a zero time, an empty list or map
// (err=<nil>, target="", from=0001-01-01...). Numbers and booleans stay,
// zero or not: pending=0 says something.
func dropEmpty(groups []string, a slog.Attr) slog.Attr {
	if len(groups) == 0 && (a.Key == slog.MessageKey || a.Key == slog.LevelKey || a.Key == slog.TimeKey || a.Key == slog.SourceKey) {
		return a
	}
	v := a.Value.Resolve()
	empty := false
	switch v.Kind() {
	case slog.KindString:
		empty = v.String() == ""
	case slog.KindTime:
		empty = v.Time().IsZero()
	case slog.KindGroup:
		empty = len(v.Group()) == 0
	case slog.KindAny:
		switch rv := reflect.ValueOf(v.Any()); rv.Kind() {
		case reflect.Invalid:
			empty = true
		case reflect.Slice, reflect.Map:
			empty = rv.Len() == 0
		case reflect.Pointer, reflect.Interface:
			empty = rv.IsNil()
		}
	}
	if empty {
		return slog.Attr{}
	}
	return a
}

// positiveInt is a flag.Value for an int that must be > 0.
type positiveInt int

func (p *positiveInt) String() string { return strconv.Itoa(int(*p)) }
func (p *positiveInt) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return fmt.Errorf("%q is not a positive whole number", s)
	}
	*p = positiveInt(n)
	return nil
}

// payloadSize is a bench's --payload-bytes: 1 byte to maxBenchPayload.
type payloadSize int

// maxBenchPayload bounds a bench payload: the default limit of a webhook
// body, over that of an envelope (a bench of larger ones measures refusals).
const maxBenchPayload = 1 << 20

func (p *payloadSize) String() string { return strconv.Itoa(int(*p)) }
func (p *payloadSize) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 || n > maxBenchPayload {
		return fmt.Errorf("%q: want a size in bytes from 1 to %d", s, maxBenchPayload)
	}
	*p = payloadSize(n)
	return nil
}

func since(t time.Time) float64 { return time.Since(t).Seconds() }

func runVersion(_ context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "version", "[--json]", "Prints which postbox this is: its version, the commit it was built from and when, and the Go it was built with.")
	asJSON := fs.Bool("json", false, "print it as one JSON object")
	if err := parse(env, fs, args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(env.stdout).Encode(buildinfo.Get())
	}
	fmt.Fprintln(env.stdout, buildinfo.Get())
	return nil
}
