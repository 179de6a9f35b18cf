package replyto_test

import (
	"strings"
	"testing"

	"github.com/postbox-events/postbox/internal/replyto"
)

func TestSettingsValidate(t *testing.T) {
	for _, c := range []struct {
		set  replyto.Settings
		want string // "" valid
	}{
		{replyto.Settings{Headers: map[string]string{"Authorization": "env:TOKEN"}, Origins: []string{"https://chat.example", "http://127.0.0.1:8080/"}}, ""},
		{replyto.Settings{Headers: map[string]string{"Authorization": "a", "authorization": "b"}}, "are one header"},
		{replyto.Settings{Headers: map[string]string{"Proxy-Authorization": "x"}}, "set by postbox"},
		{replyto.Settings{Headers: map[string]string{"X-Key": "env:"}}, "names no variable"},
		{replyto.Settings{Headers: map[string]string{"Bad Name": "x"}}, "not a header name"},
		{replyto.Settings{Origins: []string{"https://chat.example/path"}}, "want an origin"},
		{replyto.Settings{Origins: []string{"ftp://chat.example"}}, "want an origin"},
		{replyto.Settings{Origins: []string{"https://user:pw@chat.example"}}, "want an origin"},
		{replyto.Settings{SigningSecret: "secret"}, "whsec_"},
	} {
		err := c.set.Validate("settings.reply")
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "settings.reply")) {
			t.Errorf("%+v: %v, want %q", c.set, err, c.want)
		}
	}
}

func TestSettingsAllows(t *testing.T) {
	withHeaders := replyto.Settings{Headers: map[string]string{"Authorization": "env:T"}, Origins: []string{"https://Chat.example"}}
	for _, c := range []struct {
		set       replyto.Settings
		kind, url string
		ok        bool
	}{
		{withHeaders, replyto.KindGitHub, "https://api.github.com/repos/o/r/issues/1/comments", true},
		{withHeaders, replyto.KindStripe, "https://api.stripe.com/v1/charges/ch_1", true},
		{withHeaders, replyto.KindWebhook, "https://chat.example/r/1", true},
		{withHeaders, replyto.KindWebhook, "https://chat.example:8443/r/1", false},
		{withHeaders, replyto.KindWebhook, "http://chat.example/r/1", false},
		{withHeaders, replyto.KindPoll, "https://evil.example/", false},
		{replyto.Settings{SigningSecret: "whsec_x"}, replyto.KindWebhook, "https://evil.example/", true}, // nothing to hand over
	} {
		if err := c.set.Allows(c.kind, c.url); (err == nil) != c.ok {
			t.Errorf("%s %s: %v, want allowed %v", c.kind, c.url, err, c.ok)
		}
	}
}
