package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/postbox-events/postbox/api"
)

var subscriptionCommands = []subcommand{
	{"create", "create a subscription (again with the same definition: a no-op)", runSubscriptionsCreate},
	{"list", "list the subscriptions with their offset and lag", runSubscriptionsList},
	{"get", "show one subscription", runSubscriptionsGet},
	{"set-target", "change the URL the workers POST a subscription's items to, or its endpoint settings", runSubscriptionsSetTarget},
	{"enable", "deliver again to an endpoint its circuit breaker paused or disabled", runSubscriptionsEnable},
	{"pause", "pause a subscription's delivery (its inbox keeps filling)", runSubscriptionsPause},
	{"resume", "resume a paused subscription's delivery", runSubscriptionsResume},
	{"test", "send a postbox.test event to a subscription's endpoint and print its answer", runSubscriptionsTest},
	{"delete", "delete a subscription and its consumer (its inbox items stay)", runSubscriptionsDelete},
}

func runSubscriptions(ctx context.Context, env *cmdEnv, args []string) error {
	return runGroup(ctx, env, "subscriptions", subscriptionCommands, args)
}

// deref is *p, or "" for nil.
func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// breakerText is the state of a breaker in one line: "open since T, 12
// consecutive failures, next probe at T: last error".
func breakerText(b *api.Breaker) string {
	if b == nil {
		return "-"
	}
	out := b.State
	if b.Since != nil {
		out += " since " + whenPtr(b.Since)
	}
	if b.Failures > 0 {
		out += fmt.Sprintf(", %d consecutive failures", b.Failures)
	}
	if b.NextProbe != nil {
		out += ", next probe at " + whenPtr(b.NextProbe)
	}
	if b.LastError != nil && *b.LastError != "" {
		out += ": " + *b.LastError
	}
	return out
}

// stringPairs is pairs of a map of strings.
func stringPairs(m map[string]string) string {
	a := make(map[string]any, len(m))
	for k, v := range m {
		a[k] = v
	}
	return pairs(a)
}

// subscriptionStart is the start policy of s with its offset or time.
func subscriptionStart(s api.Subscription) string {
	switch s.Start {
	case "at_offset":
		return fmt.Sprintf("at_offset %d", s.StartOffset)
	case "at_time":
		return "at_time " + whenPtr(s.StartTime)
	}
	return orDash(s.Start)
}

// endpointFields are the lines of a subscription's endpoint settings, a
// server default as "default".
func endpointFields(s api.Subscription) [][2]string {
	or := func(v string) string {
		if v == "" {
			return "default"
		}
		return v
	}
	secrets := make([]string, len(s.Secrets))
	for i, sec := range s.Secrets {
		secrets[i] = sec.Fingerprint
		if sec.ExpiresAt != nil {
			secrets[i] += " (signs until " + whenPtr(sec.ExpiresAt) + ")"
		}
	}
	headers := make([]string, 0, len(s.Headers))
	for k, v := range s.Headers {
		headers = append(headers, k+": "+v)
	}
	slices.Sort(headers)
	retry := "default"
	switch {
	case s.RetrySchedule != nil:
		retry = "schedule " + *s.RetrySchedule
	case s.RetryBaseDelay != nil || s.RetryMaxDelay != nil:
		retry = "backoff from " + or(deref(s.RetryBaseDelay)) + " up to " + or(deref(s.RetryMaxDelay))
	}
	attempts := "default"
	if s.MaxAttempts != nil {
		attempts = strconv.Itoa(*s.MaxAttempts)
	}
	num := func(n *int, none string) string {
		if n == nil {
			return none
		}
		return strconv.Itoa(*n)
	}
	breaker := "after " + num(s.BreakerFailures, "10") + " consecutive failures, probe every " + orText(deref(s.BreakerProbe), "30s") +
		", disable after " + orText(deref(s.DisableAfter), "24h")
	if s.BreakerFailures != nil && *s.BreakerFailures == 0 {
		breaker = "off"
	}
	return [][2]string{
		{"secrets", orDash(strings.Join(secrets, ", "))}, {"headers", orDash(strings.Join(headers, "; "))},
		{"timeout", or(deref(s.Timeout))}, {"retry", retry}, {"max_attempts", attempts},
		{"rate", orText(deref(s.Rate), "none")}, {"concurrency", num(s.Concurrency, "none")}, {"breaker", breaker},
		{"breaker_state", breakerText(s.Breaker)}, {"delivery", pausedText(s)}, {"format", orText(s.Format, "postbox")},
	}
}

// orText is v, or when empty def.
func orText(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// endpointFlags are the flags of a target's endpoint settings; set-target
// adds those that remove one.
type endpointFlags struct {
	secret, secretFile, secretOverlap      string
	timeout, schedule, baseDelay, maxDelay string
	maxAttempts                            string
	rate, concurrency, breakerFailures     string
	breakerProbe, disableAfter             string
	format                                 string
	headers                                headerFlag
	noSecret, noHeaders                    bool
}

// headerFlag is a repeatable "Name: value" flag.
type headerFlag map[string]string

func (h headerFlag) String() string { return "" }
func (h headerFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, ":")
	k = strings.TrimSpace(k)
	if !ok || k == "" || strings.ContainsAny(k, " \t") {
		return fmt.Errorf("want 'Name: value', e.g. 'X-Team: billing'")
	}
	h[k] = strings.TrimSpace(v)
	return nil
}

// addEndpointFlags adds the endpoint flags to fs; update adds those that
// reset or remove a setting.
func addEndpointFlags(fs *flag.FlagSet, update bool) *endpointFlags {
	f := &endpointFlags{headers: headerFlag{}}
	def := func(what string) string { return "(default: " + what + ")" }
	if update {
		def = func(string) string { return `("default": the server's again)` }
	}
	fs.StringVar(&f.secret, "secret", "", "the signing `secret`, whsec_ and base64 (16 to 128 bytes): each request then carries Standard Webhooks "+
		"webhook-id, webhook-timestamp and webhook-signature headers. Shown later only as a fingerprint")
	fs.StringVar(&f.secretFile, "secret-file", "", "read the signing secret from this `file` (keeps it out of the command line)")
	fs.Var(f.headers, "header", "send this header with every request, `'Name: value'` (repeatable; hop-by-hop and webhook-* headers are refused)")
	fs.StringVar(&f.timeout, "timeout", "", "bound each attempt by this `duration` "+def("the server's --handler-timeout"))
	fs.StringVar(&f.schedule, "retry-schedule", "", "wait these comma-separated `durations` after each failed attempt, e.g. 5s,5m,30m,2h; the last repeats "+
		def("exponential backoff"))
	fs.StringVar(&f.baseDelay, "retry-base-delay", "", "exponential backoff's first wait, a `duration` "+def("the server's"))
	fs.StringVar(&f.maxDelay, "retry-max-delay", "", "exponential backoff's longest wait, and the longest a Retry-After waits, a `duration` "+def("the server's"))
	fs.StringVar(&f.maxAttempts, "max-attempts", "", "`attempts` before an item is a dead letter; may exceed the schedule "+def("the server's"))
	fs.StringVar(&f.rate, "rate", "", "start at most this many attempts per period over every server node, a `rate` such as 50/s, 600/m or 5/h "+
		"(bursts of one second's worth) "+def("none"))
	fs.StringVar(&f.concurrency, "concurrency", "", "keep at most this many `attempts` in flight at once over every server node "+def("none but the workers"))
	fs.StringVar(&f.breakerFailures, "breaker-failures", "", "open the endpoint's circuit breaker after this many consecutive failed `attempts` "+
		"(transport errors, timeouts, 5xx, 408, 429): its items wait, probed one at a time; 0 turns the breaker off "+def("10"))
	fs.StringVar(&f.breakerProbe, "breaker-probe", "", "probe an open breaker every `duration` "+def("30s"))
	fs.StringVar(&f.disableAfter, "disable-after", "", "disable the endpoint once its breaker has been open this `duration`, until "+
		"'postbox subscriptions enable' "+def("24h"))
	fs.StringVar(&f.format, "format", "", "deliver each event as `format`: postbox (the payload with X-Postbox-* headers) or cloudevents "+
		"(besides them, a CloudEvent in binary mode: ce-id, ce-source, ce-type, ce-specversion, ce-time) "+def("postbox"))
	if update {
		fs.StringVar(&f.secretOverlap, "secret-overlap", "", "with --secret: how long the replaced secret keeps signing beside the new one, a `duration` (default 24h)")
		fs.BoolVar(&f.noSecret, "no-secret", false, "remove every signing secret: requests are no longer signed")
		fs.BoolVar(&f.noHeaders, "no-headers", false, "send no headers of the endpoint's own")
	}
	return f
}

// endpointChange is what the endpoint flags set and reset.
type endpointChange struct {
	set   api.EndpointSettings
	reset []string // the settings (their JSON names) set back to the server's default
	n     int      // how many settings the flags set or reset
}

// fields returns the settings of the flags given, checking them; with
// update, "default" resets a setting.
func (f *endpointFlags) fields(cmd string, given map[string]bool, update bool) (endpointChange, error) {
	var out endpointChange
	set := func(p **string, v string) { *p = &v; out.n++ }
	setInt := func(p **int, v int) { *p = &v; out.n++ }
	reset := func(name string) { out.reset = append(out.reset, name); out.n++ }
	if given["secret"] && given["secret-file"] {
		return out, usagef("%s: --secret and --secret-file exclude each other", cmd)
	}
	if given["secret-file"] {
		b, err := os.ReadFile(f.secretFile)
		if err != nil {
			return out, usagef("%s: --secret-file: %v", cmd, err)
		}
		f.secret, given["secret"] = strings.TrimSpace(string(b)), true
	}
	if given["secret"] {
		if !strings.HasPrefix(f.secret, "whsec_") {
			return out, usagef("%s: --secret must be whsec_ and base64", cmd)
		}
		if given["no-secret"] {
			return out, usagef("%s: --secret and --no-secret exclude each other", cmd)
		}
		set(&out.set.Secret, f.secret)
	}
	if given["no-secret"] {
		reset("secret")
	}
	if given["secret-overlap"] {
		if !given["secret"] {
			return out, usagef("%s: --secret-overlap goes with --secret", cmd)
		}
		if d, err := time.ParseDuration(f.secretOverlap); err != nil || d <= 0 {
			return out, usagef("%s: --secret-overlap %q is not a positive duration (e.g. 24h)", cmd, f.secretOverlap)
		}
		set(&out.set.SecretOverlap, f.secretOverlap)
	}
	if given["header"] {
		if given["no-headers"] {
			return out, usagef("%s: --header and --no-headers exclude each other", cmd)
		}
		out.set.Headers, out.n = f.headers, out.n+1
	}
	if given["no-headers"] {
		reset("headers")
	}
	if given["format"] {
		switch v := strings.ToLower(strings.TrimSpace(f.format)); v {
		case "postbox", "cloudevents":
			set(&out.set.Format, v)
		case "default":
			if !update {
				return out, usagef("%s: --format %q: want postbox or cloudevents", cmd, f.format)
			}
			reset("format")
		default:
			return out, usagef("%s: --format %q: want postbox or cloudevents", cmd, f.format)
		}
	}
	for _, d := range []struct {
		flag, field, v string
		to             **string
	}{
		{"timeout", "timeout", f.timeout, &out.set.Timeout}, {"retry-base-delay", "retry_base_delay", f.baseDelay, &out.set.RetryBaseDelay},
		{"retry-max-delay", "retry_max_delay", f.maxDelay, &out.set.RetryMaxDelay},
		{"breaker-probe", "breaker_probe", f.breakerProbe, &out.set.BreakerProbe}, {"disable-after", "disable_after", f.disableAfter, &out.set.DisableAfter},
	} {
		switch {
		case !given[d.flag]:
		case update && d.v == "default":
			reset(d.field)
		default:
			if w, err := time.ParseDuration(d.v); err != nil || w <= 0 {
				return out, usagef("%s: --%s %q is not a positive duration (e.g. 10s)", cmd, d.flag, d.v)
			}
			set(d.to, d.v)
		}
	}
	switch {
	case !given["retry-schedule"]:
	case update && f.schedule == "default":
		reset("retry_schedule")
	default:
		for part := range strings.SplitSeq(f.schedule, ",") {
			if w, err := time.ParseDuration(strings.TrimSpace(part)); err != nil || w <= 0 {
				return out, usagef("%s: --retry-schedule %q: %q is not a positive duration (want e.g. 5s,1m,10m)", cmd, f.schedule, part)
			}
		}
		set(&out.set.RetrySchedule, f.schedule)
	}
	switch {
	case !given["max-attempts"]:
	case update && f.maxAttempts == "default":
		reset("max_attempts")
	default:
		n, err := strconv.Atoi(f.maxAttempts)
		if err != nil || n <= 0 {
			return out, usagef("%s: --max-attempts %q is not a positive whole number", cmd, f.maxAttempts)
		}
		setInt(&out.set.MaxAttempts, n)
	}
	for _, c := range []struct {
		flag, field, v string
		least          int
		to             **int
	}{{"concurrency", "concurrency", f.concurrency, 1, &out.set.Concurrency}, {"breaker-failures", "breaker_failures", f.breakerFailures, 0, &out.set.BreakerFailures}} {
		switch {
		case !given[c.flag]:
		case update && c.v == "default":
			reset(c.field)
		default:
			n, err := strconv.Atoi(c.v)
			if err != nil || n < c.least {
				return out, usagef("%s: --%s %q is not a whole number of %d or more", cmd, c.flag, c.v, c.least)
			}
			setInt(c.to, n)
		}
	}
	switch {
	case !given["rate"]:
	case update && f.rate == "default":
		reset("rate")
	case !strings.Contains(f.rate, "/"):
		return out, usagef("%s: --rate %q: want attempts per period, such as 50/s, 600/m or 10/500ms", cmd, f.rate)
	default:
		set(&out.set.Rate, f.rate) // the server checks the rest, naming the field
	}
	return out, nil
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
The target's endpoint settings (--secret, --header, --timeout, --retry-schedule or
--retry-base-delay/--retry-max-delay, --max-attempts) default to the server's; every
attempt is logged (postbox inbox attempts).

With --order-by, the items of one key are handed out one at a time, in offset order
(ordered delivery): the key is device_id, session_id, metadata.NAME, header.NAME (a
header the webhook arrived with) or a JSON pointer into the payload (/order/id). A
failing item holds back only its key. --on-dead-letter says what a dead letter of a
key does to the key's next items: block (the default: they wait until it is replayed
or discarded) or skip.

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
	orderBy := fs.String("order-by", "", "deliver the items of one `key` at a time, in order: device_id, session_id, metadata.NAME, header.NAME or a JSON pointer (/order/id)")
	onDead := fs.String("on-dead-letter", "", "with --order-by, what a key's dead letter does to its next items: `block` (the default) or skip")
	ef := addEndpointFlags(fs, false)
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
	if *onDead != "" && *orderBy == "" {
		return usagef("subscriptions create: --on-dead-letter needs --order-by")
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
	settings, err := ef.fields("subscriptions create", given, false)
	if err != nil {
		return err
	}
	if settings.n > 0 && target == "" {
		return usagef("subscriptions create: endpoint settings (--secret, --header, --timeout, --retry-*, --max-attempts) need --target")
	}
	body := api.CreateSubscription{Name: name, Source: *source, Types: types, Inbox: *inbox, Start: *start, Target: string(target),
		OrderBy: *orderBy, OnDeadLetter: *onDead, EndpointSettings: settings.set}
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

	s, created, err := c.CreateSubscription(ctx, body)
	if err != nil {
		err = c.explain(err)
		if isAPIError(err, api.CodeConflict) {
			return fmt.Errorf("subscriptions create %s: %w (delete it first, or pick another name)", name, err)
		}
		return fmt.Errorf("subscriptions create %s: %w", name, err)
	}
	if af.json {
		return printValue(env, s)
	}
	verb := "created"
	if !created {
		verb = "exists:"
	}
	fmt.Fprintf(env.stdout, "%s subscription %s on %s (start %s) → inbox %s", verb, s.Name, s.Source, subscriptionStart(s), s.Inbox)
	if s.Target != nil {
		fmt.Fprintf(env.stdout, " → POST %s", *s.Target)
	}
	fmt.Fprintln(env.stdout)
	return nil
}

func runSubscriptionsList(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "subscriptions list", "[flags]", "Lists the subscriptions by name, with their inbox, filters, start, target, next offset and lag, and their items pending, processing and dead (failed).")
	af := addAPIFlags(fs, "print the subscriptions as a JSON array")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	subs, err := c.Subscriptions(ctx)
	if err != nil {
		return fmt.Errorf("subscriptions list: %w", c.explain(err))
	}
	if af.json {
		return printJSON(env, jsonArray(subs))
	}
	tw := tabwriter.NewWriter(env.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSOURCE\tINBOX\tTYPES\tMATCH\tSTART\tTARGET\tNEXT_OFFSET\tLAG\tPENDING\tPROCESSING\tDEAD\tCREATED")
	for _, s := range subs {
		var n api.SubscriptionCounts
		if s.Counts != nil {
			n = *s.Counts
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\n", s.Name, s.Source, s.Inbox, typesText(s.Types),
			stringPairs(s.Metadata), subscriptionStart(s), orDash(deref(s.Target)), s.NextOffset, s.Lag,
			n.Pending, n.Processing, n.Failed, when(s.CreatedAt))
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
	fs := newFlags(env, "subscriptions get", "NAME [flags]", "Shows the subscription NAME: its definition and target, next offset, high watermark and lag, and its items by state.")
	af := addAPIFlags(fs, "print the subscription's JSON")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	name, err := nameArg(fs)
	if err != nil {
		return err
	}
	s, err := c.Subscription(ctx, name)
	if err != nil {
		return fmt.Errorf("subscriptions get %s: %w", name, c.explain(err))
	}
	if af.json {
		return printValue(env, s)
	}
	fields := [][2]string{
		{"name", s.Name}, {"source", s.Source}, {"stream", s.Stream}, {"inbox", s.Inbox},
		{"types", typesText(s.Types)}, {"match", stringPairs(s.Metadata)}, {"start", subscriptionStart(s)},
		{"target", orDash(deref(s.Target))},
	}
	if s.Target != nil {
		fields = append(fields, endpointFields(s)...)
	}
	if s.OrderBy != nil {
		fields = append(fields, [2]string{"order_by", *s.OrderBy}, [2]string{"on_dead_letter", deref(s.OnDeadLetter)})
	}
	if s.Held != nil {
		oldest := "-"
		if s.Held.OldestAt != nil {
			oldest = when(*s.Held.OldestAt)
		}
		fields = append(fields, [2]string{"held_keys", strconv.FormatInt(s.Held.Keys, 10)}, [2]string{"oldest_held_at", oldest})
	}
	return printFields(env, append(append(fields, [][2]string{
		{"created_at", when(s.CreatedAt)},
		{"next_offset", strconv.FormatInt(s.NextOffset, 10)},
		{"high_watermark", strconv.FormatInt(s.HighWatermark, 10)},
		{"lag", strconv.FormatInt(s.Lag, 10)},
	}...), countFields(s.Counts)...))
}

// countFields are a subscription's item counts as fields, none when the
// server sent none.
func countFields(n *api.SubscriptionCounts) [][2]string {
	if n == nil {
		return nil
	}
	return [][2]string{
		{"pending", strconv.FormatInt(n.Pending, 10)},
		{"processing", strconv.FormatInt(n.Processing, 10)},
		{"completed", strconv.FormatInt(n.Completed, 10)},
		{"dead", strconv.FormatInt(n.Failed, 10)},
	}
}

func runSubscriptionsSetTarget(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "subscriptions set-target", "NAME (--target URL | --none | endpoint flags) [flags]", `Changes the URL the server's workers POST the items of subscription NAME to (for
instance after fixing a target, before replaying its dead letters), or removes it with
--none: the items then wait in the inbox for a runtime that leases them. What the
subscription reads does not change.

The endpoint flags change one setting each and leave the others; "default" gives one
back to the server (--timeout default). --secret rotates the signing secret: the one
it replaces keeps signing beside it for --secret-overlap (default 24h), so that
receivers verifying with either accept; --no-secret stops signing. An inbox has one
endpoint: its settings apply to every subscription filling the inbox with the target.`)
	var target httpURL
	fs.Var(&target, "target", "the new target `URL` (http:// or https://)")
	none := fs.Bool("none", false, "remove the target")
	ef := addEndpointFlags(fs, true)
	af := addAPIFlags(fs, "print the subscription's JSON")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	name, err := nameArg(fs)
	if err != nil {
		return err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	change, err := ef.fields("subscriptions set-target", given, true)
	if err != nil {
		return err
	}
	body := api.UpdateSubscription{EndpointSettings: change.set, Reset: change.reset}
	switch {
	case target != "" && *none:
		return usagef("subscriptions set-target: --target and --none exclude each other")
	case target != "":
		body.Target = (*string)(&target)
	case *none:
		body.Target = new(string) // "": no target
	case change.n == 0:
		return usagef("subscriptions set-target: give --target URL, --none or an endpoint flag (--secret, --header, --timeout, --retry-schedule, --max-attempts, --rate, --concurrency, --breaker-failures, ...)")
	}
	s, err := c.UpdateSubscription(ctx, name, body)
	if err != nil {
		return fmt.Errorf("subscriptions set-target %s: %w", name, c.explain(err))
	}
	if af.json {
		return printValue(env, s)
	}
	fmt.Fprintf(env.stdout, "subscription %s: target %s\n", name, orDash(deref(s.Target)))
	if s.Target != nil && change.n > 0 {
		for _, kv := range endpointFields(s) {
			fmt.Fprintf(env.stdout, "  %s: %s\n", kv[0], kv[1])
		}
	}
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
	if err := c.DeleteSubscription(ctx, name); err != nil {
		return fmt.Errorf("subscriptions delete %s: %w", name, c.explain(err))
	}
	if af.json {
		b, _ := json.Marshal(map[string]any{"name": name, "deleted": true})
		return printJSON(env, b)
	}
	fmt.Fprintf(env.stdout, "deleted subscription %s (its inbox items stay)\n", name)
	return nil
}

func runSubscriptionsEnable(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "subscriptions enable", "NAME [flags]", `Closes the circuit breaker of the endpoint of subscription NAME, open or disabled, so
that the server delivers its waiting items again. An endpoint is disabled after its
breaker has been open, failing every probe, for its --disable-after; it stays disabled
until this command. Enabling a closed endpoint changes nothing.`)
	return subscriptionAct(env, fs, args, "enable", func(c *apiClient, name string) (api.Subscription, error) {
		return c.EnableSubscription(ctx, name)
	}, func(s api.Subscription) string {
		return "endpoint " + orDash(deref(s.Target)) + ", breaker " + breakerText(s.Breaker)
	})
}

// subscriptionAct runs the act of "postbox subscriptions VERB NAME" on the
// subscription named by the argument, and prints its answer: the JSON
// with --json, else "subscription NAME: " and what say makes of it.
func subscriptionAct(env *cmdEnv, fs *flag.FlagSet, args []string, verb string,
	act func(c *apiClient, name string) (api.Subscription, error), say func(api.Subscription) string) error {
	af := addAPIFlags(fs, "print the subscription's JSON")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	name, err := nameArg(fs)
	if err != nil {
		return err
	}
	s, err := act(c, name)
	if err != nil {
		return fmt.Errorf("subscriptions %s %s: %w", verb, name, c.explain(err))
	}
	if af.json {
		return printValue(env, s)
	}
	fmt.Fprintf(env.stdout, "subscription %s: %s\n", name, say(s))
	return nil
}

// pausedText says whether s delivers: "delivering", or "paused since T:
// reason".
func pausedText(s api.Subscription) string {
	if !s.Paused {
		return "delivering"
	}
	out := "paused since " + whenPtr(s.PausedAt)
	if s.PausedReason != nil {
		out += ": " + *s.PausedReason
	}
	return out
}

func runSubscriptionsPause(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "subscriptions pause", "NAME [flags]", `Pauses the delivery of subscription NAME: none of its items is leased, by the
server's workers or by a runtime (a lease answers the items of other subscriptions of
the inbox, or none), until "postbox subscriptions resume NAME". Its loop keeps reading
its source and filling its inbox; items already leased finish their attempt. The pause
is kept in the store: it holds on every node and across restarts.`)
	reason := fs.String("reason", "", "why, shown with the subscription (at most 500 bytes)")
	return subscriptionAct(env, fs, args, "pause", func(c *apiClient, name string) (api.Subscription, error) {
		return c.PauseSubscription(ctx, name, *reason)
	}, pausedText)
}

func runSubscriptionsResume(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "subscriptions resume", "NAME [flags]", `Resumes the delivery of subscription NAME, paused by "postbox subscriptions pause":
its waiting items are leased again at once. Resuming a subscription that delivers
changes nothing.`)
	return subscriptionAct(env, fs, args, "resume", func(c *apiClient, name string) (api.Subscription, error) {
		return c.ResumeSubscription(ctx, name)
	}, pausedText)
}

func runSubscriptionsTest(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "subscriptions test", "NAME [flags]", `Sends a synthetic event of type postbox.test to the endpoint of subscription NAME,
as the workers send items (its headers, signature, format and timeout), and prints what
the endpoint answered. The event is stored nowhere and counts no attempt. It exits 1
when the endpoint did not answer 2xx.`)
	af := addAPIFlags(fs, "print the answer's JSON")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	name, err := nameArg(fs)
	if err != nil {
		return err
	}
	res, err := c.TestSubscription(ctx, name)
	if err != nil {
		return fmt.Errorf("subscriptions test %s: %w", name, c.explain(err))
	}
	if af.json {
		if err := printValue(env, res); err != nil {
			return err
		}
	} else {
		status := "no answer"
		if res.StatusCode != 0 {
			status = strconv.Itoa(res.StatusCode)
		}
		fmt.Fprintf(env.stdout, "test event %s to %s: %s in %.1f ms\n", res.EventID, res.EndpointURL, status, res.LatencyMS)
		if res.Error != nil {
			fmt.Fprintf(env.stdout, "error: %s\n", *res.Error)
		}
		if res.ResponseExcerpt != nil {
			fmt.Fprintf(env.stdout, "answer: %s\n", *res.ResponseExcerpt)
		}
	}
	if !res.OK {
		return fmt.Errorf("subscriptions test %s: the endpoint did not answer 2xx", name)
	}
	return nil
}
