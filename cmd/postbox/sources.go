package main

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/poll"
)

var sourceCommands = []subcommand{
	{"create", "create a source and its stream (again with the same settings: a no-op)", runSourcesCreate},
	{"list", "list the sources with their kind, stream and where webhooks go", runSourcesList},
	{"get", "show one source: its settings (secrets as fingerprints) and checkpoint", runSourcesGet},
	{"delete", "delete a source (its stream and events stay); refused while subscriptions read it", runSourcesDelete},
}

func runSources(ctx context.Context, env *cmdEnv, args []string) error {
	return runGroup(ctx, env, "sources", sourceCommands, args)
}

// sourceView is a source with its kind's settings decoded, for printing.
type sourceView struct {
	api.Source
	hook api.WebhookSourceSettings // a webhook source's
	poll api.PollSourceSettings    // a poll source's
	feed api.FeedSourceSettings    // a feed source's
}

// viewSource is s with the settings of its kind decoded.
func viewSource(s api.Source) (sourceView, error) {
	out := sourceView{Source: s}
	var err error
	switch s.Kind {
	case api.SourceWebhook:
		out.hook, err = s.WebhookSettings()
	case api.SourcePoll:
		out.poll, err = s.PollSettings()
	case api.SourceFeed:
		out.feed, err = s.FeedSettings()
	}
	return out, err
}

// upstream is the URL a poll or feed source reads, "" for another kind.
func (s sourceView) upstream() string {
	return s.poll.URL + s.feed.URL // at most one is set
}

// identity says where a webhook source takes a webhook's key and type.
func (s sourceView) identity() (key, typ string) {
	from := func(header, field, def string) string {
		switch {
		case header != "":
			return "header " + header
		case field != "":
			return "field " + field
		}
		return def
	}
	st := s.hook
	if st.Signature == "standard-webhooks" && st.Preset == "" {
		return from("", st.KeyField, "webhook-id"), from("", st.TypeField, "field type")
	}
	if st.Preset != "" {
		return from(st.KeyHeader, st.KeyField, "-"), from(st.TypeHeader, st.TypeField, "webhook")
	}
	return "Idempotency-Key, webhook-id or " + from(st.KeyHeader, st.KeyField, "-"), "X-Event-Type or " + from(st.TypeHeader, st.TypeField, "webhook")
}

// secretList is a repeatable --secret flag.
type secretList []string

func (s *secretList) String() string { return "" }
func (s *secretList) Set(v string) error {
	v = strings.TrimSpace(v)
	if v == "" {
		return fmt.Errorf("empty secret")
	}
	*s = append(*s, v)
	return nil
}

func runSourcesCreate(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "sources create", "NAME [--kind webhook | --poll URL --items PTR --id PTR --type PTR | --feed URL] [flags]", `Creates the source NAME and its stream (of the same name). A source of kind webhook takes
webhooks at POST /webhooks/NAME; subscriptions read it as any source (--source NAME).
A source of kind device takes the events of the ingress connections that name it
(postbox relay --source NAME, GET /v1/ws?source=NAME); devices is the default one.

--poll URL makes a source of kind poll: serve polls the JSON HTTP API at URL with GET and
stores each item once, under its id. JSON pointers (RFC 6901) pick the array of items in
an answer (--items /events; --items '' when the answer is the array), each item's id
(--id /id, a string or a number), type (--type /type) and time (--time /created_at, RFC
3339 or seconds since 1970; without it, when it was polled). With --cursor-param after
--next /next_cursor the cursor read at --next goes back as ?after=CURSOR, and the next
page is asked for at once; otherwise, and at the end, it polls every --interval. --header
'Authorization: env:GH_TOKEN' sends a header whose value serve reads from its
environment at each poll (never stored, never shown); other values are shown as
fingerprints. 429 and 503 wait as Retry-After says (up to 10 minutes), failures back off
with jitter, and a page is asked for again until it is stored, never skipped.

--feed http://other:8000/v1/streams/devices makes a source of kind feed: serve follows that
postbox's replay feed and stores each event once, resuming after the last offset it
stored (--feed-token: the other's API token, or env:NAME; --token is this server's).

The checkpoint of a poll or feed source (cursor, last event time, last poll and error)
commits with the events it read (on the SQLite default, in the same transaction) and is
shown by sources get NAME (--json: under checkpoint). On a shared PostgreSQL store the
leader node runs them.

--preset github verifies X-Hub-Signature-256 (sha256= and the hex HMAC-SHA256 of the body)
with the secret set at GitHub and takes the key from X-GitHub-Delivery and the type from
X-GitHub-Event. --preset stripe verifies Stripe-Signature (t=…,v1=…, within 5 minutes) with
the endpoint's signing secret and takes the key and type from the body's id and type.
Without a preset, --secret takes Standard Webhooks secrets (whsec_…); without secrets,
webhooks are not verified. --key-header/--key-field and --type-header/--type-field say
where the key and type are (a header, or a top-level field of the body), replacing a
preset's. A wrong or missing signature is answered 401 naming the header.

GitHub signs the body alone, so a captured delivery verifies again under any
X-GitHub-Delivery and X-GitHub-Event: within --replay-window (default 24h, 0 for none) the
same body under another delivery id is answered as the duplicate of the first and not
stored again; after it, it would be.

Each webhook's delivery handle (where a reply goes; docs/API.md, Delivery handles): a
preset's points into the provider's API at --api-url (default https://api.github.com or
https://api.stripe.com; GitHub Enterprise: https://HOST/api/v3); without a preset,
--handle-header X-Reply-To or --handle-pointer /reply/url says where each webhook carries
it (an http(s) URL is its url, any other string its target).

--rate-limit 100 --rate-burst 100 bounds the webhooks the source stores (verified ones;
over every node of a shared store): one over it is answered 429 rate_limited with
Retry-After, and counted in postbox_ingress_rate_limited_total{limit="source"}.

Secrets are shown later only as fingerprints. Creating it again with the same settings
succeeds and prints "exists"; other settings under the same name are a conflict.`)
	af := addAPIFlags(fs, "print the source's JSON")
	kind := fs.String("kind", "webhook", "the source's `kind`: webhook, poll (with --poll), feed (with --feed) (device: only to create devices again after it was deleted)")
	pollURL := fs.String("poll", "", "poll this JSON HTTP API `URL` (kind poll)")
	items := fs.String("items", "", "JSON `pointer` to the array of items in an answer, e.g. /events ('' for the answer itself) (poll)")
	idPtr := fs.String("id", "", "JSON `pointer` to an item's id, e.g. /id (poll)")
	typePtr := fs.String("type", "", "JSON `pointer` to an item's type, e.g. /type (poll)")
	timePtr := fs.String("time", "", "JSON `pointer` to an item's time, e.g. /created_at (poll; optional)")
	cursorParam := fs.String("cursor-param", "", "query `parameter` the cursor goes back in, e.g. after (poll; with --next)")
	next := fs.String("next", "", "JSON `pointer` to the next cursor in an answer, e.g. /next_cursor (poll; with --cursor-param)")
	interval := fs.String("interval", "", "wait between polls when there is nothing new (`duration`, default 5s) (poll)")
	var headers headerList
	fs.Var(&headers, "header", "a `'Name: value'` header sent with each poll; 'Name: env:VAR' reads VAR at each poll (repeatable) (poll)")
	feedURL := fs.String("feed", "", "follow this postbox stream `URL`'s replay feed, e.g. http://other:8000/v1/streams/devices (kind feed)")
	redirects := fs.String("redirects", "", "which redirects a poll or feed `policy` follows: same-origin (the default: only to the URL's scheme, host and port; headers and token never go elsewhere) or none (poll, feed)")
	token := fs.String("feed-token", "", "the other postbox's API `token`, or env:NAME to read it from serve's environment (feed; --token is this server's)")
	preset := fs.String("preset", "", "a provider's `name`: github or stripe (needs --secret or --secret-file)")
	var secrets secretList
	fs.Var(&secrets, "secret", "a `secret` verifying each webhook: the provider's with --preset, else whsec_ and base64 (repeatable while rotating)")
	secretFile := fs.String("secret-file", "", "read a secret from this `file` (keeps it out of the command line)")
	keyHeader := fs.String("key-header", "", "the `header` holding the idempotency key, e.g. X-Shop-Delivery")
	keyField := fs.String("key-field", "", "the top-level body `field` holding the idempotency key, e.g. id")
	typeHeader := fs.String("type-header", "", "the `header` holding the type, e.g. X-Shop-Topic")
	typeField := fs.String("type-field", "", "the top-level body `field` holding the type, e.g. type")
	replayWindow := fs.String("replay-window", "", "with --preset github: how long the same signed body under another delivery id is a duplicate (`duration`, default 24h; 0: never)")
	rateLimit := eventRate(0)
	fs.Var(&rateLimit, "rate-limit", "webhooks per second the source stores, over every node of a shared store; over it a webhook is answered 429 rate_limited with Retry-After (`events` per second, e.g. 100)")
	rateBurst := wholeNumber(0)
	fs.Var(&rateBurst, "rate-burst", "webhooks the source takes at once after a quiet spell, with --rate-limit (`events`; default one second's worth)")
	apiURL := fs.String("api-url", "", "with --preset: the base `URL` of the provider's API delivery handles point into (default https://api.github.com or https://api.stripe.com)")
	handleHeader := fs.String("handle-header", "", "without --preset: the `header` holding each webhook's delivery handle, e.g. X-Reply-To")
	handlePointer := fs.String("handle-pointer", "", "without --preset: JSON `pointer` into the body at each webhook's delivery handle, e.g. /reply/url")
	serveFlags := fs.Bool("serve-flags", false, "take every setting from serve's --webhook-* flags, as the default source webhooks does")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	name, err := nameArg(fs)
	if err != nil {
		return err
	}
	if *secretFile != "" {
		b, err := os.ReadFile(*secretFile)
		if err != nil {
			return usagef("sources create: --secret-file: %v", err)
		}
		sec := strings.TrimSpace(string(b))
		if sec == "" {
			return usagef("sources create: --secret-file %s is empty", *secretFile)
		}
		secrets = append(secrets, sec)
	}
	switch *preset {
	case "", "github", "stripe":
	default:
		return usagef("sources create: --preset must be github or stripe, not %q", *preset)
	}
	if *preset != "" && len(secrets) == 0 {
		return usagef("sources create: --preset %s verifies signatures: give --secret or --secret-file", *preset)
	}
	hook := api.CreateWebhookSettings{Preset: *preset, Secrets: secrets, KeyHeader: *keyHeader, KeyField: *keyField,
		TypeHeader: *typeHeader, TypeField: *typeField, ServeFlags: *serveFlags, ReplayWindow: *replayWindow,
		APIURL: *apiURL, HandleHeader: *handleHeader, HandlePointer: *handlePointer}
	if rateLimit == 0 && isSet(fs, "rate-burst") {
		return usagef("sources create: --rate-burst goes with --rate-limit: set the rate too")
	}
	if isSet(fs, "rate-limit") && rateLimit == 0 {
		return usagef("sources create: --rate-limit 0: give events per second above 0, or leave it out for no limit")
	}
	if rateLimit > 0 {
		hook.RateLimit = &api.RateLimit{PerSecond: float64(rateLimit), Burst: int(rateBurst)}
	}
	hookGiven := len(secrets) > 0 || *serveFlags || hook.RateLimit != nil || *preset+*keyHeader+*keyField+*typeHeader+*typeField+*replayWindow+*apiURL+*handleHeader+*handlePointer != ""
	upstream, err := upstreamFlags(fs, *kind, *pollURL, *feedURL, upstreamOptions{items: *items, id: *idPtr, typ: *typePtr,
		time: *timePtr, cursorParam: *cursorParam, next: *next, interval: *interval, token: *token, redirects: *redirects}, headers)
	if err != nil {
		return err
	}
	if upstream != nil {
		*kind = upstream.kind
		if hookGiven {
			return usagef("sources create: --preset, --secret, --key-*, --type-*, --replay-window, --rate-*, --api-url and --handle-* are a webhook source's; a %s source has none", *kind)
		}
	}
	req := api.CreateSource{Name: name, Kind: *kind}
	switch *kind {
	case api.SourceWebhook:
		req.Settings, err = json.Marshal(hook)
	case api.SourcePoll, api.SourceFeed:
		req.Settings, err = json.Marshal(upstream.settings)
	case api.SourceDevice:
		if hookGiven {
			return usagef("sources create: a device source has no settings")
		}
	default:
		return usagef("sources create: --kind must be webhook, poll, feed or device, not %q", *kind)
	}
	if err != nil {
		return fmt.Errorf("sources create %s: %w", name, err)
	}
	created, isNew, err := c.CreateSource(ctx, req)
	if err != nil {
		err = c.explain(err)
		if isAPIError(err, api.CodeConflict) {
			return fmt.Errorf("sources create %s: %w (delete it first, or pick another name)", name, err)
		}
		return fmt.Errorf("sources create %s: %w", name, err)
	}
	if af.json {
		return printValue(env, created)
	}
	s, err := viewSource(created)
	if err != nil {
		return fmt.Errorf("sources create %s: the server's answer: %w", name, err)
	}
	verb := "created"
	if !isNew {
		verb = "exists:"
	}
	fmt.Fprintf(env.stdout, "%s source %s (%s) → stream %s", verb, s.Name, s.Kind, s.Stream)
	if s.Path != "" {
		fmt.Fprintf(env.stdout, "; webhooks: POST %s (signature: %s)", s.Path, s.hook.Signature)
	}
	switch s.Kind {
	case api.SourcePoll:
		fmt.Fprintf(env.stdout, "; polling %s every %s", s.poll.URL, cmp.Or(s.poll.Interval, "5s"))
	case api.SourceFeed:
		fmt.Fprintf(env.stdout, "; following %s", s.feed.URL)
	}
	fmt.Fprintln(env.stdout)
	return nil
}

func runSourcesList(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "sources list", "[flags]", "Lists the sources by name, with their kind, stream, where webhooks go (or, for poll and feed sources, the URL they read)\nand the signature webhooks must carry.")
	af := addAPIFlags(fs, "print the sources as a JSON array")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	srcs, err := c.Sources(ctx)
	if err != nil {
		return fmt.Errorf("sources list: %w", c.explain(err))
	}
	if af.json {
		return printJSON(env, jsonArray(srcs))
	}
	tw := tabwriter.NewWriter(env.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tKIND\tSTREAM\tPATH/UPSTREAM\tSIGNATURE\tCREATED")
	for _, src := range srcs {
		s, err := viewSource(src)
		if err != nil {
			return fmt.Errorf("sources list: the server's answer: %w", err)
		}
		where := s.Path
		if s.Kind == api.SourcePoll || s.Kind == api.SourceFeed {
			where = s.upstream() // where it reads from
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.Name, s.Kind, s.Stream, orDash(where), orDash(s.hook.Signature), when(s.CreatedAt))
	}
	return tw.Flush()
}

func runSourcesGet(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "sources get", "NAME [flags]", `Shows the source NAME: its kind and stream; for a webhook source where webhooks go, the
signature they must carry (secrets as fingerprints) and where their key and type come from;
and its checkpoint (how far a source that reads upstream has read; none for devices and
webhooks).`)
	af := addAPIFlags(fs, "print the source's JSON")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	name, err := nameArg(fs)
	if err != nil {
		return err
	}
	got, err := c.Source(ctx, name)
	if err != nil {
		return fmt.Errorf("sources get %s: %w", name, c.explain(err))
	}
	if af.json {
		return printValue(env, got)
	}
	s, err := viewSource(got)
	if err != nil {
		return fmt.Errorf("sources get %s: the server's answer: %w", name, err)
	}
	fields := [][2]string{{"name", s.Name}, {"kind", s.Kind}, {"stream", s.Stream}}
	if s.Kind == api.SourceWebhook {
		st := s.hook
		fps := make([]string, len(st.Secrets))
		for i, sec := range st.Secrets {
			fps[i] = sec.Fingerprint
		}
		key, typ := s.identity()
		settings := orDash(st.Preset)
		if st.ServeFlags {
			settings = "serve's --webhook-* flags"
		}
		fields = append(fields, [][2]string{{"path", s.Path}, {"preset", settings}, {"signature", st.Signature},
			{"secrets", orDash(strings.Join(fps, ", "))}, {"key", key}, {"type", typ}}...)
		if st.ReplayWindow != "" {
			fields = append(fields, [2]string{"replay window", st.ReplayWindow})
		}
		switch {
		case st.APIURL != "":
			fields = append(fields, [2]string{"handles", "into " + st.APIURL})
		case st.HandleHeader != "":
			fields = append(fields, [2]string{"handles", "header " + st.HandleHeader})
		case st.HandlePointer != "":
			fields = append(fields, [2]string{"handles", "body " + st.HandlePointer})
		}
		if rl := st.RateLimit; rl != nil {
			fields = append(fields, [2]string{"rate limit", fmt.Sprintf("%s/s, burst %d", strconv.FormatFloat(rl.PerSecond, 'f', -1, 64), rl.Burst)})
		}
	}
	switch s.Kind {
	case api.SourcePoll:
		st := s.poll
		items := "-"
		if st.Items != nil {
			items = strconv.Quote(*st.Items)
		}
		names := slices.Sorted(maps.Keys(st.Headers))
		hs := make([]string, len(names))
		for i, n := range names {
			hs[i] = n + ": " + st.Headers[n]
		}
		fields = append(fields, [][2]string{{"url", st.URL}, {"items", items}, {"id", st.ID}, {"type", st.Type}, {"time", orDash(st.Time)},
			{"cursor", orDash(strings.TrimSuffix(st.CursorParam+" from "+st.Next, " from "))},
			{"interval", cmp.Or(st.Interval, "5s")}, {"headers", orDash(strings.Join(hs, ", "))},
			{"redirects", cmp.Or(st.Redirects, "same-origin")}}...)
	case api.SourceFeed:
		st := s.feed
		fields = append(fields, [][2]string{{"url", st.URL}, {"token", orDash(st.Token)}, {"redirects", cmp.Or(st.Redirects, "same-origin")}}...)
	}
	cp := s.Checkpoint
	checkpoint := "-"
	if cp.UpdatedAt != nil {
		checkpoint = fmt.Sprintf("cursor %s, last event %s, last poll %s, last error %s (updated %s)", orDash(cp.Cursor),
			whenPtr(cp.LastEventAt), whenPtr(cp.LastPollAt), orDash(cp.LastError), whenPtr(cp.UpdatedAt))
	}
	fields = append(fields, [][2]string{{"checkpoint", checkpoint}, {"created_at", when(s.CreatedAt)}}...)
	return printFields(env, fields)
}

func runSourcesDelete(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "sources delete", "NAME [flags]", `Deletes the source NAME and its checkpoint: webhooks to it are refused with 404 from then on.
Its stream and the events it holds stay (retention deletes them). A default source (devices,
webhooks) that was deleted is not created again when serve restarts. A source that
subscriptions read is not deleted: the error names them. --json prints
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
	if err := c.DeleteSource(ctx, name); err != nil {
		return fmt.Errorf("sources delete %s: %w", name, c.explain(err))
	}
	if af.json {
		b, _ := json.Marshal(map[string]any{"name": name, "deleted": true})
		return printJSON(env, b)
	}
	fmt.Fprintf(env.stdout, "deleted source %s (its stream and events stay)\n", name)
	return nil
}

// headerList is a repeatable --header flag.
type headerList []string

func (h *headerList) String() string { return "" }
func (h *headerList) Set(v string) error {
	if _, _, err := poll.ParseHeader(v); err != nil {
		return err
	}
	*h = append(*h, v)
	return nil
}

// upstreamSource is what sources create's --poll or --feed flags make.
type upstreamSource struct {
	kind     string // api.SourcePoll or api.SourceFeed
	settings any    // api.PollSourceSettings or api.FeedSourceSettings
}

// upstreamOptions are the values of the flags of a poll or feed source.
type upstreamOptions struct {
	items, id, typ, time, cursorParam, next, interval, token, redirects string
}

// upstreamFlags reads the --poll and --feed flags: nil when neither is
// given (and none of their flags either), else the kind and settings,
// or a usage error naming the flag.
func upstreamFlags(fs *flag.FlagSet, kind, pollURL, feedURL string, opts upstreamOptions, headers []string) (*upstreamSource, error) {
	pollOnly := []string{"items", "id", "type", "time", "cursor-param", "next", "interval", "header"}
	switch {
	case pollURL != "" && feedURL != "":
		return nil, usagef("sources create: --poll and --feed: give one")
	case pollURL == "" && feedURL == "":
		for _, f := range append(slices.Clone(pollOnly), "feed-token", "redirects") {
			if isSet(fs, f) {
				return nil, usagef("sources create: --%s is a poll or feed source's: give --poll URL or --feed URL", f)
			}
		}
		if kind == api.SourcePoll || kind == api.SourceFeed {
			return nil, usagef("sources create: --kind %s: give --%s URL", kind, kind)
		}
		return nil, nil
	case isSet(fs, "kind") && kind != api.SourcePoll && pollURL != "", isSet(fs, "kind") && kind != api.SourceFeed && feedURL != "":
		return nil, usagef("sources create: --kind %s does not go with --poll or --feed", kind)
	}
	if feedURL != "" {
		for _, f := range pollOnly {
			if isSet(fs, f) {
				return nil, usagef("sources create: --%s is a poll source's, not a feed's", f)
			}
		}
		return &upstreamSource{kind: api.SourceFeed, settings: api.FeedSourceSettings{URL: feedURL, Token: opts.token, Redirects: opts.redirects}}, nil
	}
	if isSet(fs, "feed-token") {
		return nil, usagef("sources create: --feed-token is a feed source's; a poll source sends --header 'Authorization: env:VAR'")
	}
	if !isSet(fs, "items") {
		return nil, usagef("sources create: --poll needs --items: a JSON pointer to the array of items in an answer, e.g. --items /events ('' for the answer itself)")
	}
	for _, f := range []struct{ name, v string }{{"id", opts.id}, {"type", opts.typ}} {
		if f.v == "" {
			return nil, usagef("sources create: --poll needs --%s: a JSON pointer to each item's %s, e.g. --%s /%s", f.name, f.name, f.name, f.name)
		}
	}
	if (opts.cursorParam == "") != (opts.next == "") {
		return nil, usagef("sources create: --cursor-param and --next go together: the cursor read at --next goes back as ?PARAM=CURSOR")
	}
	settings := api.PollSourceSettings{URL: pollURL, Items: &opts.items, ID: opts.id, Type: opts.typ, Time: opts.time,
		CursorParam: opts.cursorParam, Next: opts.next, Interval: opts.interval, Redirects: opts.redirects}
	if len(headers) > 0 {
		settings.Headers = map[string]string{}
		for _, h := range headers {
			name, v, err := poll.ParseHeader(h)
			if err != nil {
				return nil, usagef("sources create: --header: %v", err)
			}
			settings.Headers[name] = v
		}
	}
	return &upstreamSource{kind: api.SourcePoll, settings: settings}, nil
}
