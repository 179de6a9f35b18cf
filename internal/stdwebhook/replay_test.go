package stdwebhook_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/stdwebhook"
)

// TestReplayWindow: a correctly signed webhook is accepted only while its
// timestamp is within Tolerance of now, either way: a captured delivery
// replayed later, or one signed ahead of time to be replayed later still,
// is refused, however far the timestamp is (no overflow lets it through).
func TestReplayWindow(t *testing.T) {
	key, err := stdwebhook.ParseSecret(vectorSecret)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	for _, c := range []struct {
		name string
		ts   string
		ok   bool
	}{
		{"now", "1700000000", true},
		{"at the tolerance, late", strconv.FormatInt(now.Add(-stdwebhook.Tolerance).Unix(), 10), true},
		{"at the tolerance, early", strconv.FormatInt(now.Add(stdwebhook.Tolerance).Unix(), 10), true},
		{"a second too late", strconv.FormatInt(now.Add(-stdwebhook.Tolerance-time.Second).Unix(), 10), false},
		{"a second too early", strconv.FormatInt(now.Add(stdwebhook.Tolerance+time.Second).Unix(), 10), false},
		{"a year ahead", strconv.FormatInt(now.AddDate(1, 0, 0).Unix(), 10), false},
		{"the largest int64", "9223372036854775807", false},
		{"the smallest int64", "-9223372036854775808", false},
		{"zero", "0", false},
		{"past int64", "9223372036854775808", false},
	} {
		sig := "v1," + signature(key, vectorID, c.ts, vectorBody)
		err := stdwebhook.Verify([][]byte{key}, vectorID, c.ts, sig, []byte(vectorBody), now)
		if c.ok != (err == nil) || (err != nil && !errors.Is(err, stdwebhook.ErrTimestamp)) {
			t.Errorf("%s (%s): %v, want accepted=%v", c.name, c.ts, err, c.ok)
		}
	}
}

// signature is the base64 HMAC of id.ts.body, for timestamps Sign cannot
// write.
func signature(key []byte, id, ts, body string) string {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(id + "." + ts + "." + body))
	return base64.StdEncoding.EncodeToString(h.Sum(nil))
}
