package stdwebhook_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/stdwebhook"
)

// The example of the Standard Webhooks specification and its libraries'
// tests.
const (
	vectorSecret    = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	vectorID        = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	vectorTimestamp = "1614265330"
	vectorBody      = `{"test": 2432232314}`
	vectorSignature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
)

var vectorTime = time.Unix(1614265330, 0)

func TestPublishedVector(t *testing.T) {
	key, err := stdwebhook.ParseSecret(vectorSecret)
	if err != nil {
		t.Fatal(err)
	}
	if got := stdwebhook.Sign(key, vectorID, vectorTime, []byte(vectorBody)); got != vectorSignature {
		t.Fatalf("Sign = %s, want %s", got, vectorSignature)
	}
	other, _ := stdwebhook.ParseSecret("whsec_" + "c2VjcmV0LW9mLWFub3RoZXItZW5kcG9pbnQ=")
	for _, c := range []struct {
		name       string
		keys       [][]byte
		id, ts     string
		signatures string
		body       string
		now        time.Time
		want       error
	}{
		{"valid", [][]byte{key}, vectorID, vectorTimestamp, vectorSignature, vectorBody, vectorTime, nil},
		{"several signatures, one matches", [][]byte{key}, vectorID, vectorTimestamp, "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc= " + vectorSignature, vectorBody, vectorTime, nil},
		{"rotated secrets: the second matches", [][]byte{other, key}, vectorID, vectorTimestamp, vectorSignature, vectorBody, vectorTime, nil},
		{"4 minutes late", [][]byte{key}, vectorID, vectorTimestamp, vectorSignature, vectorBody, vectorTime.Add(4 * time.Minute), nil},
		{"6 minutes late", [][]byte{key}, vectorID, vectorTimestamp, vectorSignature, vectorBody, vectorTime.Add(6 * time.Minute), stdwebhook.ErrTimestamp},
		{"6 minutes early", [][]byte{key}, vectorID, vectorTimestamp, vectorSignature, vectorBody, vectorTime.Add(-6 * time.Minute), stdwebhook.ErrTimestamp},
		{"timestamp not a number", [][]byte{key}, vectorID, "yesterday", vectorSignature, vectorBody, vectorTime, stdwebhook.ErrTimestamp},
		{"body changed", [][]byte{key}, vectorID, vectorTimestamp, vectorSignature, `{"test": 2432232315}`, vectorTime, stdwebhook.ErrSignature},
		{"body re-encoded", [][]byte{key}, vectorID, vectorTimestamp, vectorSignature, `{"test":2432232314}`, vectorTime, stdwebhook.ErrSignature},
		{"id changed", [][]byte{key}, "msg_other", vectorTimestamp, vectorSignature, vectorBody, vectorTime, stdwebhook.ErrSignature},
		{"wrong secret", [][]byte{other}, vectorID, vectorTimestamp, vectorSignature, vectorBody, vectorTime, stdwebhook.ErrSignature},
		{"other scheme only", [][]byte{key}, vectorID, vectorTimestamp, "v1a," + vectorSignature[3:], vectorBody, vectorTime, stdwebhook.ErrSignature},
		{"no signature", [][]byte{key}, vectorID, vectorTimestamp, "", vectorBody, vectorTime, stdwebhook.ErrMissingHeaders},
		{"no id", [][]byte{key}, "", vectorTimestamp, vectorSignature, vectorBody, vectorTime, stdwebhook.ErrMissingHeaders},
	} {
		err := stdwebhook.Verify(c.keys, c.id, c.ts, c.signatures, []byte(c.body), c.now)
		if (c.want == nil) != (err == nil) || (c.want != nil && !errors.Is(err, c.want)) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if _, err := stdwebhook.ParseSecret("whsec_not base64!"); err == nil {
		t.Error("a secret that is not base64 was accepted")
	}
}

// BenchmarkSign measures signing one request of a 200-byte body, as the
// workers do for each attempt to an endpoint with a secret.
func BenchmarkSign(b *testing.B) {
	key, err := stdwebhook.ParseSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		b.Fatal(err)
	}
	body := []byte(strings.Repeat("x", 200))
	now := time.Now()
	for b.Loop() {
		stdwebhook.Sign(key, "item_123456", now, body)
	}
}

func TestCheckSecret(t *testing.T) {
	if _, err := stdwebhook.CheckSecret(vectorSecret); err != nil {
		t.Errorf("CheckSecret(%q): %v", vectorSecret, err)
	}
	for _, c := range []struct{ secret, want string }{
		{"whsec_bm9wZQ==", "a key of 4 bytes; want 16 to 128"},
		{"nope", "a key of 3 bytes"},
		{"whsec_" + strings.Repeat("QUFB", 44), "a key of 132 bytes"},
		{"whsec_%%%", "want whsec_ and base64"},
	} {
		if _, err := stdwebhook.CheckSecret(c.secret); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("CheckSecret(%q) = %v, want an error saying %q", c.secret, err, c.want)
		}
	}
}
