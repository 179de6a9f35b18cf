package intake_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/intake"
	"github.com/postbox-events/postbox/internal/replyto"
	"github.com/postbox-events/postbox/internal/webhooksig"
)

// gh is a GitHub webhook of event with body, signed.
func gh(event, body string) webhook {
	return webhook{headers: map[string]string{"X-GitHub-Delivery": "d-" + event, "X-GitHub-Event": event,
		"X-Hub-Signature-256": webhooksig.SignGitHub(githubSecret, []byte(body))}, body: body}
}

// st is a Stripe webhook with body, signed.
func st(body string) webhook {
	return webhook{headers: map[string]string{"Stripe-Signature": webhooksig.SignStripe(stripeSecret, now, []byte(body))}, body: body}
}

// TestWebhookHandles: the delivery handle each kind of webhook source
// captures, byte for byte, and none where the source or the webhook has
// none.
func TestWebhookHandles(t *testing.T) {
	ghe := intake.WebhookSettings{Preset: intake.PresetGitHub, Secrets: []string{githubSecret}, APIURL: "https://ghe.example.com/api/v3/"}
	stripeAt := intake.WebhookSettings{Preset: intake.PresetStripe, Secrets: []string{stripeSecret}, APIURL: "http://127.0.0.1:9"}
	header := intake.WebhookSettings{HandleHeader: "X-Reply-To"}
	pointer := intake.WebhookSettings{HandlePointer: "/reply/to"}
	for _, c := range []struct {
		name     string
		settings intake.WebhookSettings
		w        webhook
		want     string // "": none
	}{
		{"github issue", github, gh("issues", `{"action":"opened","issue":{"number":12},"repository":{"full_name":"o/r"}}`),
			`{"kind":"github","repository":"o/r","issue":12,"url":"https://api.github.com/repos/o/r/issues/12/comments"}`},
		{"github issue_comment", github, gh("issue_comment", `{"action":"created","issue":{"number":7,"pull_request":{"url":"x"}},"comment":{"id":1},"repository":{"full_name":"o/r"}}`),
			`{"kind":"github","repository":"o/r","issue":7,"url":"https://api.github.com/repos/o/r/issues/7/comments"}`},
		{"github pull_request", github, gh("pull_request", `{"action":"opened","number":3,"pull_request":{"number":3},"repository":{"full_name":"o/r"}}`),
			`{"kind":"github","repository":"o/r","issue":3,"url":"https://api.github.com/repos/o/r/issues/3/comments"}`},
		{"github pull_request: the top-level number", github, gh("pull_request", `{"action":"closed","number":4,"repository":{"full_name":"o/r"}}`),
			`{"kind":"github","repository":"o/r","issue":4,"url":"https://api.github.com/repos/o/r/issues/4/comments"}`},
		{"github pretty-printed, the repository last", github, gh("issues", "{\n  \"issue\" : { \"title\": \"a \\\"b\\\"\", \"number\" : 5 },\n  \"repository\": {\"id\": 1, \"full_name\": \"o/r\"}\n}\n"),
			`{"kind":"github","repository":"o/r","issue":5,"url":"https://api.github.com/repos/o/r/issues/5/comments"}`},
		{"github push: no issue, no url", github, gh("push", `{"ref":"refs/heads/main","number":9,"repository":{"full_name":"o/r"}}`),
			`{"kind":"github","repository":"o/r"}`},
		{"github without a repository", github, gh("ping", `{"zen":"x","hook_id":1}`), ""},
		{"github enterprise api_url", ghe, gh("issues", `{"issue":{"number":1},"repository":{"full_name":"o/r"}}`),
			`{"kind":"github","repository":"o/r","issue":1,"url":"https://ghe.example.com/api/v3/repos/o/r/issues/1/comments"}`},
		{"stripe", stripe, st(`{"id":"evt_1","type":"charge.succeeded","data":{"object":{"id":"ch_1","object":"charge"}}}`),
			`{"kind":"stripe","object":"charge","id":"ch_1","url":"https://api.stripe.com/v1/charges/ch_1"}`},
		{"stripe checkout.session", stripeAt, st(`{"id":"evt_2","type":"checkout.session.completed","data":{"object":{"id":"cs_1","object":"checkout.session"}}}`),
			`{"kind":"stripe","object":"checkout.session","id":"cs_1","url":"http://127.0.0.1:9/v1/checkout/sessions/cs_1"}`},
		{"stripe without data.object", stripe, st(`{"id":"evt_3","type":"x"}`), ""},
		{"cloudevents with a subject", intake.WebhookSettings{}, binary(`{}`, map[string]string{"ce-subject": "orders/1"}),
			`{"kind":"cloudevents","source":"/shop","subject":"orders/1"}`},
		{"cloudevents without a subject", intake.WebhookSettings{}, structured(`{"specversion":"1.0","id":"e","source":"/s","type":"t"}`),
			`{"kind":"cloudevents","source":"/s"}`},
		{"generic header: a url", header, webhook{headers: map[string]string{"Idempotency-Key": "k", "X-Reply-To": " https://chat.example/r/1 "}, body: `{}`},
			`{"kind":"webhook","url":"https://chat.example/r/1"}`},
		{"generic header: a target", header, webhook{headers: map[string]string{"Idempotency-Key": "k", "X-Reply-To": "room-7"}, body: `{}`},
			`{"kind":"webhook","target":"room-7"}`},
		{"generic header absent", header, webhook{headers: map[string]string{"Idempotency-Key": "k"}, body: `{}`}, ""},
		{"generic pointer: a url", pointer, webhook{headers: map[string]string{"Idempotency-Key": "k"}, body: `{"reply":{"to":"http://127.0.0.1:8/x?a=1&b=2"}}`},
			`{"kind":"webhook","url":"http://127.0.0.1:8/x?a=1\u0026b=2"}`},
		{"generic pointer: a number", pointer, webhook{headers: map[string]string{"Idempotency-Key": "k"}, body: `{"reply":{"to":42}}`},
			`{"kind":"webhook","target":"42"}`},
		{"generic pointer: nothing there", pointer, webhook{headers: map[string]string{"Idempotency-Key": "k"}, body: `{"reply":{}}`}, ""},
		{"generic pointer: a CloudEvent's data", pointer, binary(`{"reply":{"to":"t"}}`, nil), `{"kind":"webhook","target":"t"}`},
		{"generic without settings", intake.WebhookSettings{}, webhook{headers: map[string]string{"Idempotency-Key": "k", "X-Reply-To": "x"}, body: `{"reply":{"to":"t"}}`}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, ref, _ := parse(t, c.settings, c.w)
			if ref != nil {
				t.Fatalf("refused %s %q", ref.Code, ref.Message)
			}
			if got := string(p.Event().DeliveryHandle); got != c.want {
				t.Fatalf("handle %s\nwant   %s", got, c.want)
			}
			if c.want == "" {
				return
			}
			h, err := replyto.Parse(p.Handle)
			if err != nil {
				t.Fatal(err)
			}
			want, _ := replyto.Parse(json.RawMessage(c.want))
			if u, err := replyto.Target(h); (err == nil) != (want.URL != "") || u != want.URL {
				t.Fatalf("target %q, %v; want %q", u, err, want.URL)
			}
		})
	}
}

// TestWebhookHandleRefusals: a generic webhook whose configured handle
// is not one is refused, naming the setting.
func TestWebhookHandleRefusals(t *testing.T) {
	for _, c := range []struct {
		name     string
		settings intake.WebhookSettings
		w        webhook
		msg      string
	}{
		{"pointer at an object", intake.WebhookSettings{HandlePointer: "/to"}, webhook{headers: map[string]string{"Idempotency-Key": "k"}, body: `{"to":{"a":1}}`},
			"the body's /to (settings.handle_pointer): want a string or a number, the event's delivery handle"},
		{"pointer at a control character", intake.WebhookSettings{HandlePointer: "/to"}, webhook{headers: map[string]string{"Idempotency-Key": "k"}, body: `{"to":"a\u0001"}`},
			"the body's /to (settings.handle_pointer): holds the control character U+0001"},
		{"header too long", intake.WebhookSettings{HandleHeader: "x-reply-to"}, webhook{headers: map[string]string{"Idempotency-Key": "k", "X-Reply-To": strings.Repeat("a", 4097)}, body: `{}`},
			"X-Reply-To header (settings.handle_header): 4097 bytes, at most 4096"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, ref, _ := parse(t, c.settings, c.w)
			if ref == nil || ref.Code != api.CodeInvalidField || ref.Message != c.msg {
				t.Fatalf("refusal %+v, want invalid_field %q", ref, c.msg)
			}
		})
	}
}

// TestWebhookHandleSettings: the settings of handles and replies are
// refused naming their field.
func TestWebhookHandleSettings(t *testing.T) {
	for _, c := range []struct {
		name string
		ws   intake.WebhookSettings
		err  string // "": valid
	}{
		{"github api_url", intake.WebhookSettings{Preset: intake.PresetGitHub, Secrets: []string{"s"}, APIURL: "https://ghe.example.com/api/v3"}, ""},
		{"api_url without a preset", intake.WebhookSettings{APIURL: "https://api.github.com"}, "settings.api_url: only for the github and stripe presets"},
		{"api_url not http", intake.WebhookSettings{Preset: intake.PresetStripe, Secrets: []string{"s"}, APIURL: "ftp://x"}, `settings.api_url "ftp://x": want an http:// or https:// URL`},
		{"api_url with credentials", intake.WebhookSettings{Preset: intake.PresetGitHub, Secrets: []string{"s"}, APIURL: "https://u:p@x"}, "settings.api_url: no credentials in the URL"},
		{"api_url with a query", intake.WebhookSettings{Preset: intake.PresetGitHub, Secrets: []string{"s"}, APIURL: "https://x/?a=1"}, `settings.api_url "https://x/?a=1": an API base, without a query or fragment`},
		{"handle header", intake.WebhookSettings{HandleHeader: "X-Reply-To"}, ""},
		{"handle pointer", intake.WebhookSettings{HandlePointer: "/a/b~1c"}, ""},
		{"both", intake.WebhookSettings{HandleHeader: "X-Reply-To", HandlePointer: "/a"}, "settings.handle_header and settings.handle_pointer: give one of them"},
		{"handle with a preset", intake.WebhookSettings{Preset: intake.PresetGitHub, Secrets: []string{"s"}, HandleHeader: "X-A"}, "settings.handle_header, settings.handle_pointer: the github preset makes its own"},
		{"bad handle header", intake.WebhookSettings{HandleHeader: "X A"}, `settings.handle_header "X A": not a header name`},
		{"bad handle pointer", intake.WebhookSettings{HandlePointer: "a"}, `settings.handle_pointer: JSON pointer "a": starts with /`},
		{"bad handle pointer escape", intake.WebhookSettings{HandlePointer: "/a~2"}, `settings.handle_pointer: JSON pointer "/a~2": ~ must be followed by 0`},
		{"serve flags and a handle", intake.WebhookSettings{ServeFlags: true, HandleHeader: "X-A"}, "settings.serve_flags: takes every setting"},
		{"serve flags and reply", intake.WebhookSettings{ServeFlags: true, Reply: &replyto.Settings{Headers: map[string]string{"Authorization": "env:TOKEN"}}}, ""},
		{"reply header refused", intake.WebhookSettings{Reply: &replyto.Settings{Headers: map[string]string{"Content-Type": "x"}}}, "settings.reply.headers: Content-Type is set by postbox"},
		{"reply secret", intake.WebhookSettings{Reply: &replyto.Settings{SigningSecret: "nope"}}, "settings.reply.signing_secret: want whsec_ and base64"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.ws.Validate()
			switch {
			case c.err == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.err != "" && (err == nil || !strings.HasPrefix(err.Error(), c.err)):
				t.Fatalf("error %v, want %q", err, c.err)
			}
		})
	}
}
