package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

var subscriptionCommands = []subcommand{
	{"create", "create a subscription (again with the same definition: a no-op)", runSubscriptionsCreate},
	{"list", "list the subscriptions with their offset and lag", runSubscriptionsList},
	{"get", "show one subscription", runSubscriptionsGet},
	{"set-target", "change the URL the workers POST a subscription's items to, or remove it", runSubscriptionsSetTarget},
	{"delete", "delete a subscription and its consumer (its inbox items stay)", runSubscriptionsDelete},
}

func runSubscriptions(ctx context.Context, env *cmdEnv, args []string) error {
	return runGroup(ctx, env, "subscriptions", subscriptionCommands, args)
}

// subscription is a subscription as the API answers it.
type subscription struct {
	Name          string         `json:"name"`
	Source        string         `json:"source"`
	Stream        string         `json:"stream"`
	Inbox         string         `json:"inbox"`
	Types         []string       `json:"types"`
	Metadata      map[string]any `json:"metadata"`
	Start         string         `json:"start"`
	StartOffset   int64          `json:"start_offset"`
	StartTime     apiTime        `json:"start_time"`
	Target        string         `json:"target"`
	CreatedAt     apiTime        `json:"created_at"`
	NextOffset    int64          `json:"next_offset"`
	HighWatermark int64          `json:"high_watermark"`
	Lag           int64          `json:"lag"`
}

// startText is the start policy with its offset or time.
func (s subscription) startText() string {
	switch s.Start {
	case "at_offset":
		return fmt.Sprintf("at_offset %d", s.StartOffset)
	case "at_time":
		return "at_time " + s.StartTime.String()
	}
	return orDash(s.Start)
}

// createSubscription is the body of POST /v1/subscriptions.
type createSubscription struct {
	Name        string            `json:"name"`
	Source      string            `json:"source"`
	Types       []string          `json:"types,omitempty"`
	Metadata    map[string]string `json:"metadata,omitempty"`
	Inbox       string            `json:"inbox,omitempty"`
	Start       string            `json:"start"`
	StartOffset int64             `json:"start_offset,omitempty"`
	StartTime   string            `json:"start_time,omitempty"`
	Target      string            `json:"target,omitempty"`
}

// patternList is a repeatable flag of comma-separated patterns.
type patternList []string

func (p *patternList) String() string { return strings.Join(*p, ",") }
func (p *patternList) Set(s string) error {
	for _, pat := range strings.Split(s, ",") {
		pat = strings.TrimSpace(pat)
		if pat == "" {
			return fmt.Errorf("empty type pattern in %q", s)
		}
		*p = append(*p, pat)
	}
	return nil
}

// matchFlag is a repeatable KEY=VALUE flag.
type matchFlag map[string]string

func (m matchFlag) String() string {
	keys := make(map[string]any, len(m))
	for k, v := range m {
		keys[k] = v
	}
	if len(keys) == 0 {
		return ""
	}
	return pairs(keys)
}

func (m matchFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	k = strings.TrimSpace(k)
	if !ok || k == "" {
		return fmt.Errorf("want KEY=VALUE, e.g. device_id=pi-7")
	}
	if old, dup := m[k]; dup && old != v {
		return fmt.Errorf("%s is matched twice (%q and %q)", k, old, v)
	}
	m[k] = v
	return nil
}

// checkName refuses what is not a subscription name (docs/API.md).
// nameArg returns the one NAME argument of fs, checked.
func nameArg(fs *flag.FlagSet) (string, error) {
	name, err := args1(fs, "NAME")
	if err != nil {
		return "", err
	}
	return name, checkName(fs.Name(), "NAME", name)
}

func checkName(cmd, what, name string) error {
	if len(name) == 0 || len(name) > 128 {
		return usagef("%s: %s %q must be 1 to 128 characters", cmd, what, name)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return usagef("%s: %s %q may hold only A-Z a-z 0-9 . _ -", cmd, what, name)
		}
	}
	return nil
}

func runSubscriptionsCreate(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "subscriptions create", "NAME --source SOURCE [flags]", `Creates the subscription NAME: a filtered reader of SOURCE's stream. Every event at or
after its start whose type matches one of --types (none: every type) and whose metadata
has every --match becomes one item in its inbox (default: NAME).

--start is where it begins: latest (only events stored from now on), earliest (every
event the stream holds), at_offset (from --start-offset) or at_time (from the first
event stored at or after --start-time). --start-offset alone implies at_offset, and
--start-time alone at_time.

With --target, the server's workers POST each item's payload to that URL: 2xx
completes it, other answers are retried with backoff, and 410 Gone or the last failed
attempt makes it a dead letter (postbox dlq). Without one, runtimes lease the inbox.

Creating it again with the same definition succeeds and prints "exists"; another
definition under the same name is a conflict (exit status 1).`)
	af := addAPIFlags(fs, "print the subscription's JSON")
	source := fs.String("source", "", "the source to read: devices, webhooks, … (required)")
	var types patternList
	fs.Var(&types, "types", "event type `patterns`, comma-separated or repeated; * matches any run of characters (proposal.*)")
	match := matchFlag{}
	fs.Var(match, "match", "the event's metadata must hold `KEY=VALUE` (repeatable), e.g. device_id=pi-7")
	start := fs.String("start", "latest", "where to `begin`: latest, earliest, at_offset or at_time")
	var startOffset positiveInt
	fs.Var(&startOffset, "start-offset", "the first `offset` to read (with --start at_offset)")
	startTime := fs.String("start-time", "", "begin at the first event stored at or after this RFC 3339 `time` (with --start at_time)")
	inbox := fs.String("inbox", "", "the `inbox` its items go to (default: NAME)")
	var target httpURL
	fs.Var(&target, "target", "the http:// or https:// `URL` the server's workers POST each item to (default: none, runtimes lease the inbox)")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	name, err := nameArg(fs)
	if err != nil {
		return err
	}
	if *source == "" {
		return usagef("subscriptions create: --source is required (e.g. --source devices)")
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if !given["start"] {
		switch {
		case given["start-offset"] && given["start-time"]:
			return usagef("subscriptions create: --start-offset and --start-time exclude each other")
		case given["start-offset"]:
			*start = "at_offset"
		case given["start-time"]:
			*start = "at_time"
		}
	}
	body := createSubscription{Name: name, Source: *source, Types: types, Inbox: *inbox, Start: *start, Target: string(target)}
	if len(match) > 0 {
		body.Metadata = match
	}
	switch *start {
	case "latest", "earliest":
	case "at_offset":
		if !given["start-offset"] {
			return usagef("subscriptions create: --start at_offset needs --start-offset")
		}
		body.StartOffset = int64(startOffset)
	case "at_time":
		if !given["start-time"] {
			return usagef("subscriptions create: --start at_time needs --start-time")
		}
		t, err := time.Parse(time.RFC3339Nano, *startTime)
		if err != nil {
			return usagef("subscriptions create: --start-time %q is not an RFC 3339 time (e.g. 2026-11-21T10:00:00Z)", *startTime)
		}
		body.StartTime = t.UTC().Format(time.RFC3339Nano)
	default:
		return usagef("subscriptions create: --start must be latest, earliest, at_offset or at_time, not %q", *start)
	}
	if given["start-offset"] && *start != "at_offset" {
		return usagef("subscriptions create: --start-offset goes with --start at_offset, not %s", *start)
	}
	if given["start-time"] && *start != "at_time" {
		return usagef("subscriptions create: --start-time goes with --start at_time, not %s", *start)
	}
	if *inbox != "" {
		if err := checkName("subscriptions create", "--inbox", *inbox); err != nil {
			return err
		}
	}

	var raw json.RawMessage
	status, err := c.do(ctx, http.MethodPost, "/v1/subscriptions", body, &raw)
	if err != nil {
		if isAPIError(err, "conflict") {
			return fmt.Errorf("subscriptions create %s: %w (delete it first, or pick another name)", name, err)
		}
		return fmt.Errorf("subscriptions create %s: %w", name, err)
	}
	if af.json {
		return printJSON(env, raw)
	}
	var s subscription
	if err := json.Unmarshal(raw, &s); err != nil {
		return fmt.Errorf("subscriptions create %s: the server's answer: %w", name, err)
	}
	verb := "created"
	if status == http.StatusOK {
		verb = "exists:"
	}
	fmt.Fprintf(env.stdout, "%s subscription %s on %s (start %s) → inbox %s", verb, s.Name, s.Source, s.startText(), s.Inbox)
	if s.Target != "" {
		fmt.Fprintf(env.stdout, " → POST %s", s.Target)
	}
	fmt.Fprintln(env.stdout)
	return nil
}

func runSubscriptionsList(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "subscriptions list", "[flags]", "Lists the subscriptions by name, with their inbox, filters, start, target, next offset and lag.")
	af := addAPIFlags(fs, "print the subscriptions as a JSON array")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	var out struct {
		Subscriptions []json.RawMessage `json:"subscriptions"`
	}
	if _, err := c.get(ctx, "/v1/subscriptions", &out); err != nil {
		return fmt.Errorf("subscriptions list: %w", err)
	}
	raw := jsonArray(out.Subscriptions)
	if af.json {
		return printJSON(env, raw)
	}
	var subs []subscription
	if err := json.Unmarshal(raw, &subs); err != nil {
		return fmt.Errorf("subscriptions list: the server's answer: %w", err)
	}
	tw := tabwriter.NewWriter(env.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSOURCE\tINBOX\tTYPES\tMATCH\tSTART\tTARGET\tNEXT_OFFSET\tLAG\tCREATED")
	for _, s := range subs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n", s.Name, s.Source, s.Inbox, typesText(s.Types),
			pairs(s.Metadata), s.startText(), orDash(s.Target), s.NextOffset, s.Lag, s.CreatedAt)
	}
	return tw.Flush()
}

func typesText(types []string) string {
	if len(types) == 0 {
		return "*"
	}
	return strings.Join(types, ",")
}

func runSubscriptionsGet(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "subscriptions get", "NAME [flags]", "Shows the subscription NAME: its definition and target, next offset, high watermark and lag.")
	af := addAPIFlags(fs, "print the subscription's JSON")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	name, err := nameArg(fs)
	if err != nil {
		return err
	}
	var s subscription
	raw, err := c.get(ctx, "/v1/subscriptions/"+url.PathEscape(name), &s)
	if err != nil {
		return fmt.Errorf("subscriptions get %s: %w", name, err)
	}
	if af.json {
		return printJSON(env, raw)
	}
	return printFields(env, [][2]string{
		{"name", s.Name}, {"source", s.Source}, {"stream", s.Stream}, {"inbox", s.Inbox},
		{"types", typesText(s.Types)}, {"match", pairs(s.Metadata)}, {"start", s.startText()},
		{"target", orDash(s.Target)},
		{"created_at", s.CreatedAt.String()},
		{"next_offset", strconv.FormatInt(s.NextOffset, 10)},
		{"high_watermark", strconv.FormatInt(s.HighWatermark, 10)},
		{"lag", strconv.FormatInt(s.Lag, 10)},
	})
}

func runSubscriptionsSetTarget(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "subscriptions set-target", "NAME (--target URL | --none) [flags]", `Changes the URL the server's workers POST the items of subscription NAME to (for
instance after fixing a target, before replaying its dead letters), or removes it with
--none: the items then wait in the inbox for a runtime that leases them. What the
subscription reads does not change.`)
	var target httpURL
	fs.Var(&target, "target", "the new target `URL` (http:// or https://)")
	none := fs.Bool("none", false, "remove the target")
	af := addAPIFlags(fs, "print the subscription's JSON")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	name, err := nameArg(fs)
	if err != nil {
		return err
	}
	if (target == "") == !*none {
		return usagef("subscriptions set-target: give --target URL or --none")
	}
	var body struct {
		Target *string `json:"target"`
	}
	if target != "" {
		body.Target = (*string)(&target)
	}
	var raw json.RawMessage
	if _, err := c.do(ctx, http.MethodPatch, "/v1/subscriptions/"+url.PathEscape(name), body, &raw); err != nil {
		return fmt.Errorf("subscriptions set-target %s: %w", name, err)
	}
	if af.json {
		return printJSON(env, raw)
	}
	var s subscription
	if err := json.Unmarshal(raw, &s); err != nil {
		return fmt.Errorf("subscriptions set-target %s: %w", name, err)
	}
	fmt.Fprintf(env.stdout, "subscription %s: target %s\n", name, orDash(s.Target))
	return nil
}

func runSubscriptionsDelete(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "subscriptions delete", "NAME [flags]", `Deletes the subscription NAME and its consumer: it stops reading its stream. Its inbox
items stay in their inbox. The server answers with no body; --json prints
{"name": NAME, "deleted": true}.`)
	af := addAPIFlags(fs, `print {"name": NAME, "deleted": true}`)
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	name, err := nameArg(fs)
	if err != nil {
		return err
	}
	if _, err := c.do(ctx, http.MethodDelete, "/v1/subscriptions/"+url.PathEscape(name), nil, nil); err != nil {
		return fmt.Errorf("subscriptions delete %s: %w", name, err)
	}
	if af.json {
		b, _ := json.Marshal(map[string]any{"name": name, "deleted": true})
		return printJSON(env, b)
	}
	fmt.Fprintf(env.stdout, "deleted subscription %s (its inbox items stay)\n", name)
	return nil
}
