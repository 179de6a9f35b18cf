package server_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/servertest"
)

var fingerprintForm = regexp.MustCompile(`^hmac:[0-9a-f]{16}$`)

// isFingerprint reports whether v is a secret's fingerprint as the API
// shows it.
func isFingerprint(v any) bool {
	s, _ := v.(string)
	return fingerprintForm.MatchString(s)
}

// TestFingerprintsKeyed: the fingerprints the API shows of secrets (a
// webhook source's, an endpoint's, a credential header's, a poll header's
// and a feed token) are keyed by the store: one secret has one
// fingerprint in a store, across sources and restarts, another in another
// store, and none is a plain hash of the secret or holds any of it.
func TestFingerprintsKeyed(t *testing.T) {
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	fingerprints := func(ts *servertest.Server, create bool) map[string]string {
		t.Helper()
		if create {
			for _, c := range []struct{ path, body string }{
				{"/v1/sources", `{"name": "gh", "kind": "webhook", "settings": {"preset": "github", "secrets": ["` + secret + `"]}}`},
				{"/v1/sources", `{"name": "std", "kind": "webhook", "settings": {"secrets": ["` + secret + `"]}}`},
				{"/v1/sources", `{"name": "pl", "kind": "poll", "settings": {"url": "http://127.0.0.1:9/items", "items": "/items", "id": "/id", "type": "/type", "headers": {"X-Api-Key": "` + secret + `"}}}`},
				{"/v1/sources", `{"name": "fd", "kind": "feed", "settings": {"url": "http://127.0.0.1:9/v1/streams/devices", "token": "` + secret + `"}}`},
				{"/v1/subscriptions", `{"name": "ep", "source": "webhooks", "target": "http://127.0.0.1:9/in", "secret": "` + secret + `", "headers": {"Authorization": "` + secret + `"}}`},
			} {
				if st, body := srcCall(t, ts, "POST", c.path, c.body, nil); st != 201 {
					t.Fatalf("POST %s: %d %v", c.path, st, body)
				}
			}
		}
		out := map[string]string{}
		for _, name := range []string{"gh", "std"} {
			_, src := srcCall(t, ts, "GET", "/v1/sources/"+name, "", nil)
			settings, _ := src["settings"].(map[string]any)
			secrets, _ := settings["secrets"].([]any)
			if len(secrets) != 1 {
				t.Fatalf("source %s: %v", name, src)
			}
			out[name], _ = secrets[0].(map[string]any)["fingerprint"].(string)
		}
		_, pl := srcCall(t, ts, "GET", "/v1/sources/pl", "", nil)
		out["poll header"], _ = pl["settings"].(map[string]any)["headers"].(map[string]any)["X-Api-Key"].(string)
		_, fd := srcCall(t, ts, "GET", "/v1/sources/fd", "", nil)
		out["feed token"], _ = fd["settings"].(map[string]any)["token"].(string)
		_, ep := srcCall(t, ts, "GET", "/v1/subscriptions/ep", "", nil)
		secrets, _ := ep["secrets"].([]any)
		if len(secrets) != 1 {
			t.Fatalf("subscription ep: %v", ep)
		}
		out["endpoint"], _ = secrets[0].(map[string]any)["fingerprint"].(string)
		auth, _ := ep["headers"].(map[string]any)["Authorization"].(string)
		out["endpoint header"] = strings.TrimSuffix(strings.TrimPrefix(auth, "(hidden, "), ")")
		for what, fp := range out {
			if !isFingerprint(fp) {
				t.Fatalf("%s shows %q, want hmac: and 16 hex digits", what, fp)
			}
		}
		all, _ := json.Marshal([]any{pl, fd, ep})
		sum := sha256.Sum256([]byte(secret))
		for _, leak := range []string{secret[6:12], secret[len(secret)-4:], hex.EncodeToString(sum[:6])} {
			if strings.Contains(string(all), leak) {
				t.Fatalf("the API shows %q of the secret: %s", leak, all)
			}
		}
		return out
	}
	ts := servertest.Start(t, server.Config{}, nil)
	first := fingerprints(ts, true)
	for what, fp := range first {
		if fp != first["gh"] {
			t.Fatalf("one secret, two fingerprints in one store: %v", first)
		}
		_ = what
	}
	ts.Stop()
	ts = servertest.Start(t, server.Config{DBPath: ts.DBPath}, nil)
	if again := fingerprints(ts, false); again["gh"] != first["gh"] {
		t.Fatalf("after a restart: %v, before %v", again, first)
	}
	other := fingerprints(servertest.Start(t, server.Config{}, nil), true)
	if other["gh"] == first["gh"] {
		t.Fatalf("two stores show one secret as %s: the fingerprint is not keyed", other["gh"])
	}
}
