package intake_test

import (
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/intake"
	"github.com/postbox-events/postbox/internal/intakerate"
)

// TestWebhookSettingsValidate: every setting a source is refused for
// names its field; what is accepted is accepted.
func TestWebhookSettingsValidate(t *testing.T) {
	for _, c := range []struct {
		name string
		ws   intake.WebhookSettings
		err  string // "": valid; else the beginning of the error
	}{
		{"zero", intake.WebhookSettings{}, ""},
		{"serve flags", intake.WebhookSettings{ServeFlags: true}, ""},
		{"serve flags with a rate limit", intake.WebhookSettings{ServeFlags: true, RateLimit: &intakerate.Rate{PerSecond: 100, Burst: 100}}, ""},
		{"rate limit of 0", intake.WebhookSettings{RateLimit: &intakerate.Rate{}}, "settings.rate_limit.per_second 0: want events per second above 0"},
		{"rate limit with a negative burst", intake.WebhookSettings{RateLimit: &intakerate.Rate{PerSecond: 1, Burst: -2}}, "settings.rate_limit.burst -2"},
		{"serve flags and more", intake.WebhookSettings{ServeFlags: true, KeyField: "id"}, "settings.serve_flags: takes every setting from serve's --webhook-* flags; give no other"},
		{"standard secrets", intake.WebhookSettings{Secrets: []string{stdSecret, "whsec_QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFB"}}, ""},
		{"github", intake.WebhookSettings{Preset: intake.PresetGitHub, Secrets: []string{"s"}, ReplayWindow: "72h"}, ""},
		{"stripe with a key header", intake.WebhookSettings{Preset: intake.PresetStripe, Secrets: []string{"whsec_x"}, KeyHeader: "X-Key"}, ""},
		{"unknown preset", intake.WebhookSettings{Preset: "gitlab"}, `settings.preset "gitlab": use github or stripe, or none`},
		{"preset without secrets", intake.WebhookSettings{Preset: intake.PresetStripe}, "settings.secrets: the stripe preset verifies every webhook's signature: give the secret set at stripe"},
		{"too many secrets", intake.WebhookSettings{Preset: intake.PresetGitHub, Secrets: strings.Split(strings.Repeat("s,", 10)+"s", ",")}, "settings.secrets: 11 secrets, at most 10"},
		{"blank secret", intake.WebhookSettings{Preset: intake.PresetGitHub, Secrets: []string{" s"}}, "settings.secrets[0]: want 1 to 1024 bytes without surrounding space"},
		{"long secret", intake.WebhookSettings{Preset: intake.PresetGitHub, Secrets: []string{"s", strings.Repeat("s", 1025)}}, "settings.secrets[1]: want 1 to 1024 bytes"},
		{"not whsec_", intake.WebhookSettings{Secrets: []string{"plain"}}, "settings.secrets[0]: a Standard Webhooks secret is whsec_ and base64 (or give a preset)"},
		{"short whsec_", intake.WebhookSettings{Secrets: []string{"whsec_bm9wZQ=="}}, "settings.secrets[0]: webhook secret: a key of 4 bytes"},
		{"key header", intake.WebhookSettings{KeyHeader: "Bad Header"}, `settings.key_header "Bad Header": not a header name`},
		{"type header too long", intake.WebhookSettings{TypeHeader: strings.Repeat("h", 129)}, "settings.type_header"},
		{"key field with a control character", intake.WebhookSettings{KeyField: "a\nb"}, "settings.key_field: holds the control character U+000A"},
		{"type field too long", intake.WebhookSettings{TypeField: strings.Repeat("f", 129)}, "settings.type_field: 129 bytes, at most 128"},
		{"replay window without github", intake.WebhookSettings{Preset: intake.PresetStripe, Secrets: []string{"s"}, ReplayWindow: "1h"}, "settings.replay_window: only for the github preset"},
		{"replay window too long", intake.WebhookSettings{Preset: intake.PresetGitHub, Secrets: []string{"s"}, ReplayWindow: "2161h"}, `settings.replay_window "2161h": want a duration from 0 (none) to 2160h0m0s, e.g. 24h`},
		{"replay window negative", intake.WebhookSettings{Preset: intake.PresetGitHub, Secrets: []string{"s"}, ReplayWindow: "-1s"}, `settings.replay_window "-1s"`},
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

// TestWebhookSettingsEffective: a preset's identity fills in what the
// source does not say, and its replay window defaults for GitHub alone.
func TestWebhookSettingsEffective(t *testing.T) {
	for _, c := range []struct {
		ws     intake.WebhookSettings
		want   intake.Identity
		window time.Duration
	}{
		{intake.WebhookSettings{}, intake.Identity{}, 0},
		{intake.WebhookSettings{Preset: intake.PresetGitHub}, intake.Identity{KeyHeader: "X-GitHub-Delivery", TypeHeader: "X-GitHub-Event"}, intake.DefaultReplayWindow},
		{intake.WebhookSettings{Preset: intake.PresetGitHub, KeyField: "id", ReplayWindow: "1h"}, intake.Identity{KeyField: "id", TypeHeader: "X-GitHub-Event"}, time.Hour},
		{intake.WebhookSettings{Preset: intake.PresetGitHub, ReplayWindow: "0"}, intake.Identity{KeyHeader: "X-GitHub-Delivery", TypeHeader: "X-GitHub-Event"}, 0},
		{intake.WebhookSettings{Preset: intake.PresetStripe}, intake.Identity{KeyField: "id", TypeField: "type"}, 0},
		{intake.WebhookSettings{Preset: intake.PresetStripe, TypeHeader: "X-T"}, intake.Identity{KeyField: "id", TypeHeader: "X-T"}, 0},
	} {
		e := c.ws.Effective()
		if got := (intake.Identity{KeyHeader: e.KeyHeader, KeyField: e.KeyField, TypeHeader: e.TypeHeader, TypeField: e.TypeField}); got != c.want {
			t.Errorf("%+v: identity %+v, want %+v", c.ws, got, c.want)
		}
		if d, err := c.ws.ParseReplayWindow(); err != nil || d != c.window {
			t.Errorf("%+v: replay window %v %v, want %v", c.ws, d, err, c.window)
		}
		if wh := c.ws.Webhook(intake.ServeConfig{MaxBytes: 10, MaxTypeBytes: 20}); wh.Identity != c.want || wh.ReplayWindow != c.window || wh.MaxBytes != 10 || wh.MaxTypeBytes != 20 {
			t.Errorf("%+v: intake %+v", c.ws, wh)
		}
	}
}
