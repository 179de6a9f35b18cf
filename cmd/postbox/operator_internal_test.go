package main

// The operator commands are tested in-process through run with an
// in-memory cmdEnv, against a real server from servertest: white-box
// because cmdEnv and run are the command's own.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/client"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/servertest"
	"github.com/postbox-events/postbox/internal/testenv"
)

// cliResult is what one run of a command printed and its exit status.
type cliResult struct {
	stdout, stderr string
	code           int
}

func (r cliResult) String() string {
	return fmt.Sprintf("exit %d, stdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// cli runs postbox args in-process with an empty environment.
func cli(t *testing.T, args ...string) cliResult {
	t.Helper()
	return cliEnv(t, nil, args...)
}

// cliEnv runs postbox args in-process with the environment vars.
func cliEnv(t *testing.T, vars map[string]string, args ...string) cliResult {
	t.Helper()
	var out, errb bytes.Buffer
	env := &cmdEnv{stdout: &out, stderr: &errb, getenv: func(k string) string { return vars[k] }}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := run(ctx, env, args)
	code := 0
	if err != nil {
		code = exitCode(err)
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(&errb, "postbox:", err)
		}
	}
	return cliResult{out.String(), errb.String(), code}
}

// cliJSON runs postbox args, wants exit 0 and decodes stdout into v.
func cliJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	r := cli(t, args...)
	if r.code != 0 {
		t.Fatalf("postbox %s: %v", strings.Join(args, " "), r)
	}
	if err := json.Unmarshal([]byte(r.stdout), v); err != nil {
		t.Fatalf("postbox %s: stdout is not one JSON value of %T: %v\n%s", strings.Join(args, " "), v, err, r.stdout)
	}
}

func TestOperatorHelp(t *testing.T) {
	for _, args := range [][]string{
		{"subscriptions", "--help"}, {"subscriptions", "create", "--help"}, {"subscriptions", "list", "--help"},
		{"subscriptions", "get", "-h"}, {"subscriptions", "delete", "--help"},
		{"streams", "--help"}, {"consumers", "--help"},
		{"inbox", "--help"}, {"inbox", "list", "--help"}, {"inbox", "show", "--help"}, {"inbox", "lease", "--help"},
		{"inbox", "ack", "--help"}, {"inbox", "nack", "--help"},
	} {
		r := cli(t, args...)
		if r.code != 0 || !strings.Contains(r.stdout, "Usage: postbox "+args[0]) {
			t.Errorf("postbox %s: %v", strings.Join(args, " "), r)
		}
		if len(args) == 3 && !strings.Contains(r.stdout, "-server URL") {
			t.Errorf("postbox %s: no --server in the flags:\n%s", strings.Join(args, " "), r.stdout)
		}
	}
	r := cli(t, "--help")
	for _, name := range []string{"subscriptions", "streams", "consumers", "inbox"} {
		if !strings.Contains(r.stdout, "  "+name+" ") {
			t.Errorf("postbox --help does not list %s:\n%s", name, r.stdout)
		}
	}
}

func TestOperatorUsageErrors(t *testing.T) {
	create := func(more ...string) []string {
		return append([]string{"subscriptions", "create", "planner", "--source", "devices"}, more...)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"subscriptions"}, "no command given"},
		{[]string{"subscriptions", "frob"}, `unknown command "frob"`},
		{[]string{"inbox", "frob"}, `unknown command "frob"`},
		{[]string{"subscriptions", "create", "--source", "devices"}, "NAME is required"},
		{[]string{"subscriptions", "create", "planner"}, "--source is required"},
		{[]string{"subscriptions", "create", "a/b", "--source", "devices"}, `NAME "a/b"`},
		{[]string{"subscriptions", "get"}, "NAME is required"},
		{[]string{"subscriptions", "delete", "a", "b"}, "takes one NAME"},
		{create("--start", "sometime"), "--start must be latest, earliest, at_offset or at_time"},
		{create("--on-dead-letter", "skip"), "--on-dead-letter needs --order-by"},
		{create("--start", "at_offset"), "needs --start-offset"},
		{create("--start", "at_time"), "needs --start-time"},
		{create("--start-time", "yesterday"), "not an RFC 3339 time"},
		{create("--start", "earliest", "--start-offset", "5"), "--start-offset goes with --start at_offset"},
		{create("--start-offset", "0"), "start-offset"},
		{create("--match", "device_id"), "want KEY=VALUE"},
		{create("--match", "=pi-7"), "want KEY=VALUE"},
		{create("--types", "a.*,"), "empty type pattern"},
		{[]string{"streams", "a", "b"}, "at most one STREAM"},
		{[]string{"consumers", "x"}, "takes no arguments"},
		{[]string{"inbox", "list", "--state", "done", "planner"}, "--state must be"},
		{[]string{"inbox", "list", "planner", "--limit", "5000"}, "--limit is at most 1000"},
		{[]string{"inbox", "list", "--limit", "5"}, "--limit goes with an INBOX"},
		{[]string{"inbox", "show", "planner", "x1"}, `item ID "x1" is not a positive whole number`},
		{[]string{"inbox", "show", "planner"}, "takes INBOX and one item ID"},
		{[]string{"inbox", "lease"}, "INBOX is required"},
		{[]string{"inbox", "lease", "planner", "--wait", "2m"}, "--wait must be"},
		{[]string{"inbox", "lease", "planner", "--visibility", "0s"}, `"0s" is not a positive duration`},
		{[]string{"inbox", "lease", "planner", "--visibility", "forever"}, `"forever" is not a duration`},
		{[]string{"inbox", "ack", "planner"}, "at least one item ID"},
		{[]string{"inbox", "ack", "planner", "17", "abc"}, `item ID "abc" is not a positive whole number`},
		{[]string{"inbox", "nack", "planner", "-3"}, "flag provided but not defined: -3"},
		{[]string{"inbox", "nack", "planner", "0"}, `item ID "0"`},
		{[]string{"inbox", "nack", "planner", "1", "--delay", "soon"}, "-delay"},
		{[]string{"consumers", "--server", "127.0.0.1:8000"}, "--server \"127.0.0.1:8000\": want http://HOST:PORT"},
	} {
		r := cli(t, tc.args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("postbox %s: want exit 2 and %q on stderr; %v", strings.Join(tc.args, " "), tc.want, r)
		}
	}
	r := cliEnv(t, map[string]string{"POSTBOX_SERVER": "nohost"}, "streams")
	if r.code != 2 || !strings.Contains(r.stderr, `POSTBOX_SERVER "nohost"`) {
		t.Errorf("a bad POSTBOX_SERVER: %v", r)
	}
}

// TestOperatorNoServer: with nothing listening, every command says so and
// points at postbox serve.
func TestOperatorNoServer(t *testing.T) {
	for _, args := range [][]string{
		{"subscriptions", "list", "--server", "http://127.0.0.1:1"},
		{"consumers", "--server", "http://127.0.0.1:1/"},
		{"inbox", "ack", "planner", "1", "--server", "http://127.0.0.1:1"},
	} {
		r := cli(t, args...)
		if r.code != 1 || !strings.Contains(r.stderr, "no server answers at http://127.0.0.1:1") || !strings.Contains(r.stderr, "postbox serve") {
			t.Errorf("postbox %s: %v", strings.Join(args, " "), r)
		}
	}
	r := cliEnv(t, map[string]string{"POSTBOX_SERVER": "http://127.0.0.1:1"}, "streams")
	if r.code != 1 || !strings.Contains(r.stderr, "no server answers at http://127.0.0.1:1") {
		t.Errorf("streams with POSTBOX_SERVER: %v", r)
	}
}

// sendEvents sends one envelope per type to the server's ingress from
// device and waits for every ACK.
func sendEvents(t *testing.T, s *servertest.Server, device string, types ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, s.WS, client.Options{})
	if err != nil {
		t.Fatalf("dial %s: %v", s.WS, err)
	}
	defer c.Close()
	msgs := make([]client.Message, len(types))
	for i, typ := range types {
		m, err := client.Encode(postbox.Envelope{
			SchemaVersion: postbox.SchemaVersion,
			EventID:       fmt.Sprintf("evt_%s_%s_%d_%d", t.Name(), device, i, time.Now().UnixNano()),
			Type:          typ,
			TS:            time.Now().UTC().Format(time.RFC3339Nano),
			SessionID:     "sess-1",
			DeviceID:      device,
			Payload:       json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)),
		})
		if err != nil {
			t.Fatal(err)
		}
		msgs[i] = m
	}
	replies, err := c.Send(ctx, msgs)
	if err != nil {
		t.Fatalf("send: %v", err)
	}
	for _, r := range replies {
		if r.Status != postbox.StatusStored {
			t.Fatalf("event %s not stored: %+v", r.EventID, r)
		}
	}
}

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// TestSubscriptionsAgainstServer walks a subscription's life: create (and
// again), list, get, its consumer, the streams, delete.
func TestSubscriptionsAgainstServer(t *testing.T) {
	s := servertest.Start(t, server.Config{}, nil)
	srv := []string{"--server", s.Base}
	sendEvents(t, s, "pi-7", repeat("proposal.task", 3)...)

	createArgs := append([]string{"subscriptions", "create", "planner", "--source", "devices",
		"--types", "proposal.*", "--match", "device_id=pi-7", "--start", "earliest"}, srv...)
	r := cli(t, createArgs...)
	if r.code != 0 || strings.TrimSpace(r.stdout) != "created subscription planner on devices (start earliest) → inbox planner" {
		t.Fatalf("create: %v", r)
	}
	if r := cli(t, createArgs...); r.code != 0 || !strings.HasPrefix(r.stdout, "exists") {
		t.Fatalf("create again with the same definition: %v", r)
	}
	r = cli(t, append([]string{"subscriptions", "create", "planner", "--source", "devices", "--types", "task.*", "--start", "earliest"}, srv...)...)
	if r.code != 1 || !strings.Contains(r.stderr, "server: 409 conflict: ") {
		t.Fatalf("create with another definition: %v", r)
	}
	r = cli(t, append([]string{"subscriptions", "create", "elsewhere", "--source", "nosuchsource"}, srv...)...)
	if r.code != 1 || !strings.Contains(r.stderr, "server: 404 not_found: ") {
		t.Fatalf("create on an unknown source: %v", r)
	}
	// Ordered per key: the CLI sends order_by and on_dead_letter, get
	// shows them and the keys held back; a bad form is the server's 400.
	if r := cli(t, append([]string{"subscriptions", "create", "by-order", "--source", "devices", "--order-by", "/order/id",
		"--on-dead-letter", "skip"}, srv...)...); r.code != 0 {
		t.Fatalf("create --order-by: %v", r)
	}
	r = cli(t, append([]string{"subscriptions", "get", "by-order"}, srv...)...)
	if r.code != 0 || !regexp.MustCompile(`order_by:\s+/order/id`).MatchString(r.stdout) ||
		!regexp.MustCompile(`on_dead_letter:\s+skip`).MatchString(r.stdout) || !regexp.MustCompile(`held_keys:\s+0`).MatchString(r.stdout) {
		t.Fatalf("get of an ordered subscription: %v", r)
	}
	r = cli(t, append([]string{"subscriptions", "create", "bad-order", "--source", "devices", "--order-by", "order.id"}, srv...)...)
	if r.code != 1 || !strings.Contains(r.stderr, "400 invalid_field: order_by \"order.id\"") {
		t.Fatalf("create with a bad --order-by: %v", r)
	}
	if r := cli(t, append([]string{"subscriptions", "delete", "by-order"}, srv...)...); r.code != 0 {
		t.Fatalf("delete by-order: %v", r)
	}

	var subs []map[string]any
	cliJSON(t, &subs, append([]string{"subscriptions", "list", "--json"}, srv...)...)
	// planner, and the server's default subscription of webhooks.
	if len(subs) != 2 || subs[0]["name"] != "planner" || subs[0]["source"] != "devices" || subs[0]["inbox"] != "planner" || subs[0]["start"] != "earliest" || subs[1]["name"] != "webhooks" {
		t.Fatalf("subscriptions list --json: %v", subs)
	}
	r = cli(t, append([]string{"subscriptions", "list"}, srv...)...)
	if r.code != 0 || !strings.Contains(r.stdout, "NAME") || !strings.Contains(r.stdout, "planner") ||
		!strings.Contains(r.stdout, "proposal.*") || !strings.Contains(r.stdout, "device_id=pi-7") {
		t.Fatalf("subscriptions list: %v", r)
	}
	// Its three events become three pending items, which the list counts.
	testenv.Eventually(t, 30*time.Second, "planner's 3 items in the list's counts", func() bool {
		cliJSON(t, &subs, append([]string{"subscriptions", "list", "--json"}, srv...)...)
		counts, _ := subs[0]["counts"].(map[string]any)
		return counts["pending"] == float64(3)
	})
	r = cli(t, append([]string{"subscriptions", "list"}, srv...)...)
	if lines := strings.Split(r.stdout, "\n"); r.code != 0 || len(lines) < 2 ||
		!strings.Contains(lines[0], "LAG  PENDING  PROCESSING  DEAD  CREATED") || !regexp.MustCompile(`\s0\s+3\s+0\s+0\s`).MatchString(lines[1]) {
		t.Fatalf("subscriptions list with counts: %v", r)
	}
	var sub map[string]any
	cliJSON(t, &sub, append([]string{"subscriptions", "get", "planner", "--json"}, srv...)...)
	if sub["name"] != "planner" || sub["stream"] != "devices" {
		t.Fatalf("subscriptions get --json: %v", sub)
	}
	r = cli(t, append([]string{"subscriptions", "get", "planner"}, srv...)...)
	if r.code != 0 || !strings.Contains(r.stdout, "source:") || !strings.Contains(r.stdout, "start:") || !strings.Contains(r.stdout, "earliest") {
		t.Fatalf("subscriptions get: %v", r)
	}

	// The consumer reads the 3 events the stream holds.
	testenv.Eventually(t, 10*time.Second, "consumer planner to reach the high watermark", func() bool {
		var consumers []map[string]any
		cliJSON(t, &consumers, append([]string{"consumers", "--json"}, srv...)...)
		for _, c := range consumers {
			for _, k := range []string{"subscription", "next_offset", "lag"} {
				if _, ok := c[k]; !ok {
					t.Fatalf("consumers --json: %v lacks %q", c, k)
				}
			}
			if c["subscription"] == "planner" {
				return c["next_offset"] == 4.0 && c["lag"] == 0.0
			}
		}
		t.Fatalf("consumers --json: no consumer of planner in %v", consumers)
		return false
	})
	r = cli(t, append([]string{"consumers"}, srv...)...)
	if r.code != 0 || !strings.Contains(r.stdout, "SUBSCRIPTION") || !strings.Contains(r.stdout, "planner") {
		t.Fatalf("consumers: %v", r)
	}

	var streams []map[string]any
	cliJSON(t, &streams, append([]string{"streams", "--json"}, srv...)...)
	found := false
	for _, st := range streams {
		if st["stream"] == "devices" {
			found = true
			if st["events"] != 3.0 || st["last_offset"] != 3.0 {
				t.Errorf("streams --json: devices %v, want 3 events up to offset 3", st)
			}
		}
	}
	if !found {
		t.Fatalf("streams --json: no devices in %v", streams)
	}
	var one map[string]any
	cliJSON(t, &one, append([]string{"streams", "devices", "--json"}, srv...)...)
	if one["stream"] != "devices" {
		t.Fatalf("streams devices --json: %v", one)
	}
	r = cli(t, append([]string{"streams"}, srv...)...)
	if r.code != 0 || !strings.Contains(r.stdout, "FIRST_STORED") || !regexp.MustCompile(`(?m)^devices +sqlite `).MatchString(r.stdout) {
		t.Fatalf("streams: want devices on sqlite: %v", r)
	}

	if r := cli(t, append([]string{"subscriptions", "delete", "planner"}, srv...)...); r.code != 0 || !strings.Contains(r.stdout, "deleted subscription planner") {
		t.Fatalf("delete: %v", r)
	}
	for _, sub := range []string{"get", "delete"} {
		if r := cli(t, append([]string{"subscriptions", sub, "planner"}, srv...)...); r.code != 1 || !strings.Contains(r.stderr, "server: 404 not_found: ") {
			t.Fatalf("%s after delete: %v", sub, r)
		}
	}
	cliJSON(t, &subs, append([]string{"subscriptions", "list", "--json"}, srv...)...)
	if len(subs) != 1 || subs[0]["name"] != "webhooks" {
		t.Fatalf("subscriptions list --json after delete: %v", subs)
	}
}

// TestInboxLeaseAckNack: items reach an inbox, a lease takes two, one is
// acked and one nacked with it; an unknown id and a lost lease fail with
// exit status 1.
func TestInboxLeaseAckNack(t *testing.T) {
	s := servertest.Start(t, server.Config{}, nil)
	srv := []string{"--server", s.Base}
	sendEvents(t, s, "pi-7", append(repeat("proposal.task", 5), "sensor.reading")...)
	sendEvents(t, s, "pi-8", "proposal.task")
	if r := cli(t, append([]string{"subscriptions", "create", "worker", "--source", "devices", "--types", "proposal.*",
		"--match", "device_id=pi-7", "--start", "earliest"}, srv...)...); r.code != 0 {
		t.Fatalf("create: %v", r)
	}

	var items []map[string]any
	testenv.Eventually(t, 10*time.Second, "5 pending items in inbox worker", func() bool {
		cliJSON(t, &items, append([]string{"inbox", "list", "worker", "--state", "pending", "--json"}, srv...)...)
		return len(items) >= 5
	})
	if len(items) != 5 {
		t.Fatalf("inbox list: %d items, want 5: %v", len(items), items)
	}
	var all []map[string]any
	cliJSON(t, &all, append([]string{"inbox", "list", "worker", "--limit", "2", "--all-pages", "--json"}, srv...)...)
	if len(all) != 5 {
		t.Fatalf("inbox list --limit 2 --all: %d items, want 5", len(all))
	}
	for i := 1; i < len(all); i++ {
		if all[i]["id"].(float64) <= all[i-1]["id"].(float64) {
			t.Fatalf("inbox list --all: ids not in order: %v", all)
		}
	}
	r := cli(t, append([]string{"inbox", "list", "worker", "--limit", "2"}, srv...)...)
	if r.code != 0 || strings.Count(r.stdout, "proposal.task") != 2 || !strings.Contains(r.stderr, "more items: --after") {
		t.Fatalf("inbox list --limit 2: %v", r)
	}
	var inboxes []map[string]any
	cliJSON(t, &inboxes, append([]string{"inbox", "list", "--json"}, srv...)...)
	if len(inboxes) != 2 || inboxes[0]["inbox"] != "webhooks" || inboxes[1]["inbox"] != "worker" || inboxes[1]["pending"] != 5.0 {
		t.Fatalf("inbox list (the inboxes) --json: %v", inboxes)
	}

	var lease struct {
		Lease     string           `json:"lease"`
		ExpiresAt string           `json:"expires_at"`
		Items     []map[string]any `json:"items"`
	}
	cliJSON(t, &lease, append([]string{"inbox", "lease", "worker", "--max", "2", "--visibility", "1m", "--json"}, srv...)...)
	if lease.Lease == "" || len(lease.Items) != 2 {
		t.Fatalf("inbox lease --max 2: %+v", lease)
	}
	for _, it := range lease.Items {
		if it["state"] != "processing" || it["attempts"] != 1.0 || it["type"] != "proposal.task" {
			t.Fatalf("leased item: %v", it)
		}
	}
	id1 := strconv.FormatFloat(lease.Items[0]["id"].(float64), 'f', -1, 64)
	id2 := strconv.FormatFloat(lease.Items[1]["id"].(float64), 'f', -1, 64)

	r = cli(t, append([]string{"inbox", "extend", "worker", id1, id2, "--lease", lease.Lease, "--visibility", "2m"}, srv...)...)
	if r.code != 0 || !strings.Contains(r.stdout, "now expires") || strings.Count(r.stdout, "processing") != 2 {
		t.Fatalf("inbox extend: %v", r)
	}
	if r := cli(t, append([]string{"inbox", "extend", "worker", id1, "--lease", "lease_other"}, srv...)...); r.code != 1 || !strings.Contains(r.stdout, "lease_lost") || strings.Contains(r.stdout, "now expires") {
		t.Fatalf("inbox extend with another lease: %v, want lease_lost, exit status 1 and no new expiry", r)
	}
	if r := cli(t, append([]string{"inbox", "extend", "worker", id1}, srv...)...); r.code != 2 || !strings.Contains(r.stderr, "--lease is required") {
		t.Fatalf("inbox extend without --lease: %v", r)
	}
	r = cli(t, append([]string{"inbox", "ack", "worker", id1, "--lease", lease.Lease}, srv...)...)
	if r.code != 0 || !strings.HasPrefix(r.stdout, id1+" ") || !strings.Contains(r.stdout, "completed") {
		t.Fatalf("inbox ack: %v", r)
	}
	r = cli(t, append([]string{"inbox", "nack", "worker", id2, "--lease", lease.Lease, "--delay", "1m", "--reason", "downstream 503"}, srv...)...)
	if r.code != 0 || !strings.HasPrefix(r.stdout, id2+" ") || !strings.Contains(r.stdout, "pending") {
		t.Fatalf("inbox nack: %v", r)
	}
	var item map[string]any
	cliJSON(t, &item, append([]string{"inbox", "show", "worker", id2, "--json"}, srv...)...)
	if item["state"] != "pending" || item["last_error"] != "downstream 503" || item["attempts"] != 1.0 {
		t.Fatalf("inbox show after nack: %v", item)
	}
	r = cli(t, append([]string{"inbox", "show", "worker", id2}, srv...)...)
	if r.code != 0 || !strings.Contains(r.stdout, "downstream 503") || !strings.Contains(r.stdout, `"n":`) {
		t.Fatalf("inbox show: %v", r)
	}
	if r := cli(t, append([]string{"inbox", "show", "worker", "999999"}, srv...)...); r.code != 1 || !strings.Contains(r.stderr, "404 not_found") {
		t.Fatalf("inbox show of an unknown id: %v", r)
	}

	// Acking a completed item again is a no-op; an unknown id fails, after
	// every result is printed.
	r = cli(t, append([]string{"inbox", "ack", "worker", id1, "999999"}, srv...)...)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 1 || len(lines) != 2 || !strings.Contains(lines[0], "completed") ||
		!strings.HasPrefix(lines[1], "999999 ") || !strings.Contains(lines[1], "error") || !strings.Contains(r.stderr, "1 of 2 items failed") {
		t.Fatalf("inbox ack of a completed and an unknown id: %v", r)
	}
	// More ids than one request carries: one result per id all the same.
	many := []string{"inbox", "ack", "worker", "--json", id1}
	for i := range 1000 {
		many = append(many, strconv.Itoa(1_000_000+i))
	}
	r = cli(t, append(many, srv...)...)
	var settled struct {
		Items []map[string]any `json:"items"`
	}
	if r.code != 1 || json.Unmarshal([]byte(r.stdout), &settled) != nil || len(settled.Items) != 1001 ||
		settled.Items[0]["state"] != "completed" || settled.Items[1000]["error"] == nil || !strings.Contains(r.stderr, "1000 of 1001 items failed") {
		t.Fatalf("inbox ack of 1001 ids: exit %d, %d results, stderr %s", r.code, len(settled.Items), r.stderr)
	}
	// The nacked item no longer holds the lease.
	r = cli(t, append([]string{"inbox", "ack", "worker", id2, "--lease", lease.Lease}, srv...)...)
	if r.code != 1 || !strings.Contains(r.stdout, "lease_lost") || strings.Contains(r.stdout, "now expires") {
		t.Fatalf("inbox ack with a lost lease: %v", r)
	}

	r = cli(t, append([]string{"inbox", "lease", "worker", "--max", "1"}, srv...)...)
	if r.code != 0 || !strings.HasPrefix(r.stdout, "lease ") || !strings.Contains(r.stdout, "ATTEMPTS") || !strings.Contains(r.stdout, "proposal.task") {
		t.Fatalf("inbox lease: %v", r)
	}
	cliJSON(t, &items, append([]string{"inbox", "list", "worker", "--state", "completed", "--json"}, srv...)...)
	if len(items) != 1 || strconv.FormatFloat(items[0]["id"].(float64), 'f', -1, 64) != id1 {
		t.Fatalf("completed items: %v, want %s only", items, id1)
	}
	if r := cli(t, append([]string{"inbox", "lease", "nosuchinbox"}, srv...)...); r.code != 0 || !strings.Contains(r.stdout, "no items ready") || !strings.Contains(r.stdout, "no subscription fills an inbox of that name") {
		t.Fatalf("inbox lease of an inbox the server does not know: %v", r)
	}
	// An inbox the server knows, leased until empty, says no more.
	for range 100 {
		r = cli(t, append([]string{"inbox", "lease", "worker", "--max", "100"}, srv...)...)
		if r.code != 0 || strings.Contains(r.stdout, "no items ready") {
			break
		}
	}
	if r.code != 0 || !strings.Contains(r.stdout, "no items ready") || strings.Contains(r.stdout, "no subscription fills") {
		t.Fatalf("inbox lease of an empty inbox: %v", r)
	}

	// The nacked item, completed by an operator, keeps its error as
	// history: not printed as its last error.
	if r := cli(t, append([]string{"inbox", "ack", "worker", id2}, srv...)...); r.code != 0 || !strings.Contains(r.stdout, "completed") {
		t.Fatalf("inbox ack of the nacked item: %v", r)
	}
	r = cli(t, append([]string{"inbox", "show", "worker", id2}, srv...)...)
	if r.code != 0 || !regexp.MustCompile(`(?m)^last_error:\s+-$`).MatchString(r.stdout) ||
		!regexp.MustCompile(`(?m)^earlier_error:\s+downstream 503$`).MatchString(r.stdout) {
		t.Fatalf("inbox show of a completed item that failed before: %v", r)
	}
	r = cli(t, append([]string{"inbox", "list", "worker", "--state", "completed"}, srv...)...)
	if r.code != 0 || !strings.Contains(r.stdout, id2) || strings.Contains(r.stdout, "downstream 503") {
		t.Fatalf("inbox list of completed items: %v, want no old error shown", r)
	}
}

// TestOperatorAPIToken: a server started with an API token refuses the
// operator commands without it (exit 1, saying so) and answers them with
// it, from --token or POSTBOX_API_TOKEN.
func TestOperatorAPIToken(t *testing.T) {
	s := servertest.Start(t, server.Config{APIToken: "s3cret"}, nil)
	r := cli(t, "streams", "--server", s.Base)
	if r.code != 1 || !strings.Contains(r.stderr, "server "+s.Base+" needs an API token (401 unauthorized): give it with --token or POSTBOX_API_TOKEN") {
		t.Fatalf("without the token: %v", r)
	}
	// A token given and refused says so, not that one is needed.
	if r := cli(t, "streams", "--server", s.Base, "--token", "wrong"); r.code != 1 || !strings.Contains(r.stderr, "refused the token given with --token (401 unauthorized)") ||
		strings.Contains(r.stderr, "needs") {
		t.Fatalf("with a wrong token: %v", r)
	}
	if r := cliEnv(t, map[string]string{"POSTBOX_API_TOKEN": "wrong"}, "streams", "--server", s.Base); r.code != 1 || !strings.Contains(r.stderr, "refused the token given with POSTBOX_API_TOKEN") {
		t.Fatalf("with a wrong POSTBOX_API_TOKEN: %v", r)
	}
	if r := cli(t, "streams", "--server", s.Base, "--token", "s3cret"); r.code != 0 || !strings.Contains(r.stdout, "devices") {
		t.Fatalf("with --token: %v", r)
	}
	if r := cliEnv(t, map[string]string{"POSTBOX_API_TOKEN": "s3cret", "POSTBOX_SERVER": s.Base}, "subscriptions", "create", "t", "--source", "devices"); r.code != 0 {
		t.Fatalf("with POSTBOX_API_TOKEN: %v", r)
	}
}
