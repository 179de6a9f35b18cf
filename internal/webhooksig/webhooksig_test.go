package webhooksig_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/webhooksig"
)

// TestGitHubVector: the example of GitHub's documentation on validating
// webhook deliveries verifies, and fails with a byte changed, another
// secret, or a malformed or missing header.
func TestGitHubVector(t *testing.T) {
	const secret, body = "It's a Secret to Everybody", "Hello, World!"
	const sig = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
	if err := webhooksig.GitHub([]string{"other", secret}, sig, []byte(body)); err != nil {
		t.Fatalf("GitHub's example: %v", err)
	}
	if got := webhooksig.SignGitHub(secret, []byte(body)); got != sig {
		t.Fatalf("SignGitHub: %s, want %s", got, sig)
	}
	for _, c := range []struct {
		secret, header, body string
		want                 error
	}{
		{secret, sig, "Hello, World?", webhooksig.ErrSignature},
		{"It's a secret to everybody", sig, body, webhooksig.ErrSignature},
		{secret, "", body, webhooksig.ErrMissing},
		{secret, "sha1=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17", body, webhooksig.ErrMalformed},
		{secret, "sha256=7571", body, webhooksig.ErrMalformed},
		{secret, "sha256=zz7107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17", body, webhooksig.ErrMalformed},
	} {
		if err := webhooksig.GitHub([]string{c.secret}, c.header, []byte(c.body)); !errors.Is(err, c.want) {
			t.Errorf("GitHub(%q, %q, %q): %v, want %v", c.secret, c.header, c.body, err, c.want)
		}
	}
}

// stripeSig is the v1 signature as Stripe's documentation describes it,
// written here from the description: hex HMAC-SHA256, keyed with the
// endpoint secret as written, of "timestamp.body".
func stripeSig(secret, ts, body string) string {
	h := hmac.New(sha256.New, []byte(secret))
	h.Write([]byte(ts + "." + body))
	return hex.EncodeToString(h.Sum(nil))
}

// TestStripe: a signature verifies with any of its v1 values and any of
// the secrets, within five minutes of its timestamp either way; a stale
// or future timestamp, another body, a v0-only or malformed header fail.
func TestStripe(t *testing.T) {
	const secret, body = "whsec_test_3Yq8mZkB1", `{"id":"evt_1","type":"charge.succeeded"}`
	now := time.Unix(1_800_000_000, 0)
	ts := strconv.FormatInt(now.Unix(), 10)
	good := "t=" + ts + ",v1=" + stripeSig("whsec_old", ts, body) + ",v1=" + stripeSig(secret, ts, body) + ",v0=abcd"
	if err := webhooksig.Stripe([]string{secret}, good, []byte(body), now); err != nil {
		t.Fatalf("a good signature: %v", err)
	}
	if got := webhooksig.SignStripe(secret, now, []byte(body)); got != "t="+ts+",v1="+stripeSig(secret, ts, body) {
		t.Fatalf("SignStripe: %s", got)
	}
	at := func(d time.Duration) string {
		ts := strconv.FormatInt(now.Add(d).Unix(), 10)
		return "t=" + ts + ",v1=" + stripeSig(secret, ts, body)
	}
	for _, c := range []struct {
		name, header, body string
		want               error
	}{
		{"five minutes old", at(-webhooksig.StripeTolerance), body, nil},
		{"five minutes ahead", at(webhooksig.StripeTolerance), body, nil},
		{"stale", at(-webhooksig.StripeTolerance - time.Second), body, webhooksig.ErrTimestamp},
		{"ahead", at(webhooksig.StripeTolerance + time.Second), body, webhooksig.ErrTimestamp},
		{"another body", good, body + " ", webhooksig.ErrSignature},
		{"v0 only", "t=" + ts + ",v0=" + stripeSig(secret, ts, body), body, webhooksig.ErrMalformed},
		{"no t", "v1=" + stripeSig(secret, ts, body), body, webhooksig.ErrMalformed},
		{"t not a number", "t=soon,v1=" + stripeSig(secret, ts, body), body, webhooksig.ErrMalformed},
		{"missing", "", body, webhooksig.ErrMissing},
		{"garbage", "garbage", body, webhooksig.ErrMalformed},
	} {
		err := webhooksig.Stripe([]string{secret}, c.header, []byte(c.body), now)
		if (c.want == nil) != (err == nil) || (c.want != nil && !errors.Is(err, c.want)) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
}
