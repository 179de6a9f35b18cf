package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
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

// source is a source as the API answers it.
type source struct {
	Name     string `json:"name"`
	Kind     string `json:"kind"`
	Stream   string `json:"stream"`
	Path     string `json:"path"`
	Settings struct {
		Preset  string `json:"preset"`
		Secrets []struct {
			Fingerprint string `json:"fingerprint"`
		} `json:"secrets"`
		KeyHeader  string `json:"key_header"`
		KeyField   string `json:"key_field"`
		TypeHeader string `json:"type_header"`
		TypeField  string `json:"type_field"`
		ServeFlags bool   `json:"serve_flags"`
		Signature  string `json:"signature"`
	} `json:"settings"`
	Checkpoint struct {
		Cursor      string  `json:"cursor"`
		LastEventAt apiTime `json:"last_event_at"`
		LastError   string  `json:"last_error"`
		LastPollAt  apiTime `json:"last_poll_at"`
		UpdatedAt   apiTime `json:"updated_at"`
	} `json:"checkpoint"`
	CreatedAt apiTime `json:"created_at"`
}

// identity says where a webhook source takes a webhook's key and type.
func (s source) identity() (key, typ string) {
	from := func(header, field, def string) string {
		switch {
		case header != "":
			return "header " + header
		case field != "":
			return "field " + field
		}
		return def
	}
	st := s.Settings
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
	fs := newFlags(env, "sources create", "NAME --kind webhook [flags]", `Creates the source NAME and its stream (of the same name). A source of kind webhook takes
webhooks at POST /webhooks/NAME; subscriptions read it as any source (--source NAME).

--preset github verifies X-Hub-Signature-256 (sha256= and the hex HMAC-SHA256 of the body)
with the secret set at GitHub and takes the key from X-GitHub-Delivery and the type from
X-GitHub-Event. --preset stripe verifies Stripe-Signature (t=…,v1=…, within 5 minutes) with
the endpoint's signing secret and takes the key and type from the body's id and type.
Without a preset, --secret takes Standard Webhooks secrets (whsec_…); without secrets,
webhooks are not verified. --key-header/--key-field and --type-header/--type-field say
where the key and type are (a header, or a top-level field of the body), replacing a
preset's. A wrong or missing signature is answered 401 naming the header.

Secrets are shown later only as fingerprints. Creating it again with the same settings
succeeds and prints "exists"; other settings under the same name are a conflict.`)
	af := addAPIFlags(fs, "print the source's JSON")
	kind := fs.String("kind", "webhook", "the source's `kind`: webhook (device: only to create devices again after it was deleted)")
	preset := fs.String("preset", "", "a provider's `name`: github or stripe (needs --secret or --secret-file)")
	var secrets secretList
	fs.Var(&secrets, "secret", "a `secret` verifying each webhook: the provider's with --preset, else whsec_ and base64 (repeatable while rotating)")
	secretFile := fs.String("secret-file", "", "read a secret from this `file` (keeps it out of the command line)")
	keyHeader := fs.String("key-header", "", "the `header` holding the idempotency key, e.g. X-Shop-Delivery")
	keyField := fs.String("key-field", "", "the top-level body `field` holding the idempotency key, e.g. id")
	typeHeader := fs.String("type-header", "", "the `header` holding the type, e.g. X-Shop-Topic")
	typeField := fs.String("type-field", "", "the top-level body `field` holding the type, e.g. type")
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
	body := map[string]any{"name": name, "kind": *kind}
	settings := map[string]any{}
	for k, v := range map[string]string{"preset": *preset, "key_header": *keyHeader, "key_field": *keyField, "type_header": *typeHeader, "type_field": *typeField} {
		if v != "" {
			settings[k] = v
		}
	}
	if len(secrets) > 0 {
		settings["secrets"] = []string(secrets)
	}
	if *serveFlags {
		settings["serve_flags"] = true
	}
	switch *kind {
	case "webhook":
		body["settings"] = settings
	case "device":
		if len(settings) > 0 {
			return usagef("sources create: a device source has no settings")
		}
	default:
		return usagef("sources create: --kind must be webhook or device, not %q", *kind)
	}
	var raw json.RawMessage
	status, err := c.do(ctx, http.MethodPost, "/v1/sources", body, &raw)
	if err != nil {
		if isAPIError(err, "conflict") {
			return fmt.Errorf("sources create %s: %w (delete it first, or pick another name)", name, err)
		}
		return fmt.Errorf("sources create %s: %w", name, err)
	}
	if af.json {
		return printJSON(env, raw)
	}
	var s source
	if err := json.Unmarshal(raw, &s); err != nil {
		return fmt.Errorf("sources create %s: the server's answer: %w", name, err)
	}
	verb := "created"
	if status == http.StatusOK {
		verb = "exists:"
	}
	fmt.Fprintf(env.stdout, "%s source %s (%s) → stream %s", verb, s.Name, s.Kind, s.Stream)
	if s.Path != "" {
		fmt.Fprintf(env.stdout, "; webhooks: POST %s (signature: %s)", s.Path, s.Settings.Signature)
	}
	fmt.Fprintln(env.stdout)
	return nil
}

func runSourcesList(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "sources list", "[flags]", "Lists the sources by name, with their kind, stream, where webhooks go and the signature they must carry.")
	af := addAPIFlags(fs, "print the sources as a JSON array")
	c, err := parseAPI(env, fs, af, args)
	if err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	srcs, printed, err := getList[source](ctx, env, c, af, "/v1/sources", "sources")
	if err != nil || printed {
		return wrapErr("sources list", err)
	}
	tw := tabwriter.NewWriter(env.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tKIND\tSTREAM\tPATH\tSIGNATURE\tCREATED")
	for _, s := range srcs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.Name, s.Kind, s.Stream, orDash(s.Path), orDash(s.Settings.Signature), s.CreatedAt)
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
	var s source
	raw, err := c.get(ctx, "/v1/sources/"+url.PathEscape(name), &s)
	if err != nil {
		return fmt.Errorf("sources get %s: %w", name, err)
	}
	if af.json {
		return printJSON(env, raw)
	}
	fields := [][2]string{{"name", s.Name}, {"kind", s.Kind}, {"stream", s.Stream}}
	if s.Kind == "webhook" {
		st := s.Settings
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
	}
	cp := s.Checkpoint
	checkpoint := "-"
	if cp.UpdatedAt.String() != "-" {
		checkpoint = fmt.Sprintf("cursor %s, last event %s, last poll %s, last error %s (updated %s)", orDash(cp.Cursor),
			cp.LastEventAt, cp.LastPollAt, orDash(cp.LastError), cp.UpdatedAt)
	}
	fields = append(fields, [][2]string{{"checkpoint", checkpoint}, {"created_at", s.CreatedAt.String()}}...)
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
	if _, err := c.do(ctx, http.MethodDelete, "/v1/sources/"+url.PathEscape(name), nil, nil); err != nil {
		return fmt.Errorf("sources delete %s: %w", name, err)
	}
	if af.json {
		b, _ := json.Marshal(map[string]any{"name": name, "deleted": true})
		return printJSON(env, b)
	}
	fmt.Fprintf(env.stdout, "deleted source %s (its stream and events stay)\n", name)
	return nil
}
