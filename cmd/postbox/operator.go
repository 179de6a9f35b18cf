package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/client"
	"github.com/postbox-events/postbox/internal/tlsca"
)

// The operator commands (subscriptions, streams, consumers, inbox) are
// clients of the HTTP API of postbox serve, specified in docs/API.md.

// defaultServer is where the operator commands find postbox serve.
const defaultServer = "http://127.0.0.1:8000"

// apiTimeout bounds one API call; a lease adds its wait to it.
const apiTimeout = 30 * time.Second

// apiFlags are the flags every operator command takes.
type apiFlags struct {
	server string
	token  string
	caCert string
	json   bool
}

// addAPIFlags adds --server and --json to fs; jsonHelp says what --json prints.
func addAPIFlags(fs *flag.FlagSet, jsonHelp string) *apiFlags {
	f := &apiFlags{}
	fs.StringVar(&f.server, "server", defaultServer, "the `URL` of postbox serve's HTTP API, http://HOST:PORT (a ws:// URL of the same server works too) [POSTBOX_API_URL, POSTBOX_SERVER]")
	fs.StringVar(&f.token, "token", "", "the server's API `token`, if it requires one (serve --api-token) [POSTBOX_API_TOKEN]")
	fs.StringVar(&f.caCert, "ca-cert", "", "PEM `file` of the CA (or self-signed certificate) an https:// server must present; default: the system's roots [POSTBOX_CA_CERT]")
	fs.BoolVar(&f.json, "json", false, jsonHelp)
	return f
}

// parseAPI parses args into fs, fills --server from the environment and
// returns a client of that server.
func parseAPI(env *cmdEnv, fs *flag.FlagSet, af *apiFlags, args []string) (*apiClient, error) {
	if err := parse(env, fs, args); err != nil {
		return nil, err
	}
	u, err := url.Parse(af.server)
	if err != nil {
		u = &url.URL{}
	} else if scheme, ok := map[string]string{"ws": "http", "wss": "https"}[u.Scheme]; ok {
		// The agent's URL of the same server: its API is on the same port.
		u.Scheme, u.Path = scheme, strings.TrimSuffix(u.Path, "/v1/ws")
		af.server = u.String()
	}
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		hint := ""
		if err == nil && (u.Scheme == "grpc" || u.Scheme == "grpcs") {
			hint = " (grpc:// is the agent's ingress; set POSTBOX_API_URL to the server's HTTP API)"
		}
		return nil, usagef("%s: %s %q: want http://HOST:PORT or https://HOST:PORT%s", fs.Name(), cmp.Or(flagSource(fs, "server"), "--server"), af.server, hint)
	}
	if u.User != nil { // the client refuses it, naming its option: name the flag
		return nil, usagef("%s: server URL %s: credentials in the URL are not sent: use the API token instead (--token)", fs.Name(), u.Redacted())
	}
	hc := http.DefaultClient
	if af.caCert != "" {
		tc, err := tlsca.Config(af.caCert)
		if err != nil {
			return nil, usagef("%s: %s: %v", fs.Name(), cmp.Or(flagSource(fs, "ca-cert"), "--ca-cert"), err)
		}
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = tc
		hc = &http.Client{Transport: tr}
	}
	api, err := client.NewAPI(af.server, client.APIOptions{Token: af.token, HTTPClient: hc, Timeout: apiTimeout})
	if err != nil {
		return nil, usagef("%s: %v", fs.Name(), err)
	}
	return &apiClient{API: api, base: api.BaseURL(), timeout: apiTimeout, token: af.token != "", tokenFrom: cmp.Or(flagSource(fs, "token"), "--token")}, nil
}

// apiClient is the Go client of the HTTP API (package client), with the
// command line's words for its failures.
type apiClient struct {
	*client.API
	base    string
	timeout time.Duration
	// token: a token was given, from tokenFrom (--token or a variable).
	token     bool
	tokenFrom string
}

// isAPIError reports whether err is an API error with this code.
func isAPIError(err error, code api.Code) bool {
	var ae *client.APIError
	return errors.As(err, &ae) && ae.Code == code
}

// explain says in the command line's words what a failed call means: no
// server, no answer in time, or a server without this endpoint.
func (c *apiClient) explain(err error) error {
	var method, path string
	ae, isAPI := errors.AsType[*client.APIError](err)
	if ce, ok := errors.AsType[*client.CallError](err); ok {
		method, path = ce.Method, ce.Path
	} else if isAPI {
		method, path = ae.Method, ae.Path
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("no server answers at %s: is it running? (start one with `postbox serve`, or point --server or POSTBOX_API_URL at it)", c.base)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("server %s did not answer %s %s within %v", c.base, method, path, c.timeout)
	case isAPI && (ae.Status == http.StatusUnauthorized || ae.Status == http.StatusForbidden && ae.Code != api.CodeCrossOrigin):
		status := fmt.Sprintf("%d %s", ae.Status, cmp.Or(string(ae.Code), http.StatusText(ae.Status)))
		if c.token {
			return fmt.Errorf("server %s refused the token given with %s (%s): it is not the server's API token (serve --api-token)", c.base, c.tokenFrom, status)
		}
		return fmt.Errorf("server %s needs an API token (%s): give it with --token or POSTBOX_API_TOKEN", c.base, status)
	case isAPI && ae.Code == "" && (ae.Status == http.StatusNotFound || ae.Status == http.StatusMethodNotAllowed):
		return fmt.Errorf("server %s has no %s %s (%d %s): is it a postbox server of this version?", c.base, method, path, ae.Status, http.StatusText(ae.Status))
	case isAPI:
		return err
	case errors.As(err, new(x509.UnknownAuthorityError)):
		return fmt.Errorf("server %s: %w (give the CA that signed its certificate, or the certificate itself, with --ca-cert or POSTBOX_CA_CERT)", c.base, err)
	}
	return fmt.Errorf("server %s: %w", c.base, err)
}

// printJSON prints one JSON value, indented.
func printJSON(env *cmdEnv, raw json.RawMessage) error {
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		return fmt.Errorf("server answered invalid JSON: %w", err)
	}
	buf.WriteByte('\n')
	_, err := env.stdout.Write(buf.Bytes())
	return err
}

// jsonArray encodes v (a slice) as a JSON array; nil is [].
func jsonArray[T any](v []T) json.RawMessage {
	if v == nil {
		v = []T{}
	}
	b, _ := json.Marshal(v)
	return b
}

// when is t for a person: RFC 3339 in UTC to the second, "-" for none.
func when(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// whenPtr is when for a time that may be null.
func whenPtr(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return when(*t)
}

// printValue prints v as indented JSON.
func printValue(env *cmdEnv, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return printJSON(env, b)
}

// printMetadata prints an item's metadata object as a person reads it,
// under "metadata:": one "key: value" line a key, sorted; an object (a
// webhook's headers) as its own indented lines, header names as HTTP
// writes them (Content-Type). No metadata prints "metadata: -".
func printMetadata(env *cmdEnv, raw json.RawMessage) error {
	var m map[string]any
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	if d.Decode(&m) != nil || len(m) == 0 {
		_, err := fmt.Fprintln(env.stdout, "metadata: -")
		return err
	}
	var b strings.Builder
	b.WriteString("metadata:\n")
	writeObject(&b, m, "  ", false)
	_, err := io.WriteString(env.stdout, b.String())
	return err
}

// writeObject writes m as "key: value" lines sorted by key, each after
// indent; nested objects go one level deeper. headers: the keys are
// HTTP header names.
func writeObject(b *strings.Builder, m map[string]any, indent string, headers bool) {
	keys := slices.Sorted(maps.Keys(m))
	if headers {
		slices.SortFunc(keys, func(x, y string) int {
			return strings.Compare(http.CanonicalHeaderKey(x), http.CanonicalHeaderKey(y))
		})
	}
	for _, k := range keys {
		name := k
		if headers {
			name = http.CanonicalHeaderKey(k)
		}
		if obj, ok := m[k].(map[string]any); ok && len(obj) > 0 {
			fmt.Fprintf(b, "%s%s:\n", indent, name)
			writeObject(b, obj, indent+"  ", k == "headers")
			continue
		}
		fmt.Fprintf(b, "%s%s: %s\n", indent, name, valueText(m[k]))
	}
}

// valueText is a decoded JSON value for a person: a string as it is, a
// number or boolean as JSON writes it, a list of them joined by ", ",
// anything else as compact JSON; never Go's map[...] or [...] notation.
func valueText(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case string:
		return v
	case json.Number:
		return v.String()
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case bool:
		return strconv.FormatBool(v)
	case []any:
		parts := make([]string, len(v))
		for i, e := range v {
			switch e.(type) {
			case map[string]any, []any:
				b, _ := json.Marshal(v)
				return string(b)
			}
			parts[i] = valueText(e)
		}
		return strings.Join(parts, ", ")
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// orDash is s, or "-" when empty.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// metadataPairs formats a metadata object as pairs does, or "-".
func metadataPairs(raw json.RawMessage) string {
	var m map[string]any
	json.Unmarshal(raw, &m)
	return pairs(m)
}

// pairs formats a metadata map as k=v,k=v in key order, or "-".
func pairs(m map[string]any) string {
	if len(m) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for i, k := range keys {
		keys[i] = k + "=" + valueText(m[k])
	}
	return strings.Join(keys, ",")
}

// subcommand is one command of a group such as "postbox inbox".
type subcommand struct {
	name, summary string
	run           func(ctx context.Context, env *cmdEnv, args []string) error
}

// runGroup runs the subcommand of group named by args[0]; with none or
// --help it prints the group's commands.
func runGroup(ctx context.Context, env *cmdEnv, group string, subs []subcommand, args []string) error {
	if len(args) == 0 && env.probe != nil {
		env.offerTable(subs)
		return errProbed
	}
	sub := ""
	if len(args) > 0 {
		sub, args = args[0], args[1:]
	}
	names := make([]string, len(subs))
	width := 8
	for i, s := range subs {
		if s.name == sub {
			return s.run(ctx, env, args)
		}
		names[i], width = s.name, max(width, len(s.name))
	}
	if sub == "" || sub == "-h" || sub == "--help" || sub == "-help" || sub == "help" {
		fmt.Fprintf(env.stdout, "Usage: postbox %s %s [flags]\n\n", group, strings.Join(names, "|"))
		for _, s := range subs {
			fmt.Fprintf(env.stdout, "  %-*s %s\n", width, s.name, s.summary)
		}
		if note := groupNotes[group]; note != "" {
			fmt.Fprintf(env.stdout, "\n%s\n", note)
		}
		fmt.Fprintf(env.stdout, "\npostbox %s COMMAND --help shows a command's flags.\n", group)
		if sub == "" {
			return usagef("%s: no command given", group)
		}
		return nil
	}
	hint := ""
	if near := nearest(sub, names); near != "" {
		hint = fmt.Sprintf(" (did you mean %s?)", near)
	}
	return usagef("%s: unknown command %q%s: use %s", group, sub, hint, strings.Join(names, ", "))
}

// groupNotes are what a group's help says after its commands.
var groupNotes = map[string]string{}

// args1 returns the command's one positional argument, what.
func args1(fs *flag.FlagSet, what string) (string, error) {
	switch fs.NArg() {
	case 0:
		return "", usagef("%s: %s is required", fs.Name(), what)
	case 1:
		return fs.Arg(0), nil
	}
	return "", usagef("%s: takes one %s, got %d arguments: %s", fs.Name(), what, fs.NArg(), strings.Join(fs.Args(), " "))
}
