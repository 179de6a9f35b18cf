// Package stdwebhook signs and verifies webhooks the Standard Webhooks way
// (standardwebhooks.com): an HMAC-SHA256 over "id.timestamp.body", sent as
// webhook-id, webhook-timestamp and webhook-signature ("v1,<base64>", several
// separated by spaces so that a sender can rotate secrets).
package stdwebhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Tolerance is how far a webhook's timestamp may be from now, either way,
// before it is refused as a replay (or a badly set clock).
const Tolerance = 5 * time.Minute

// Errors Verify returns, wrapped with detail.
var (
	ErrMissingHeaders = errors.New("missing webhook-id, webhook-timestamp or webhook-signature")
	ErrTimestamp      = errors.New("timestamp outside the tolerance")
	ErrSignature      = errors.New("no signature matches")
)

// ParseSecret decodes a secret as Standard Webhooks writes it: "whsec_"
// and base64. A secret without the prefix is taken as base64 too.
func ParseSecret(s string) ([]byte, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(strings.TrimSpace(s), "whsec_"))
	if err != nil || len(key) == 0 {
		return nil, fmt.Errorf("webhook secret: want whsec_ and base64")
	}
	return key, nil
}

// MinKeyBytes and MaxKeyBytes bound the key of a secret postbox takes: a
// shorter key is guessable, and Standard Webhooks asks for 24 to 64
// bytes.
const (
	MinKeyBytes = 16
	MaxKeyBytes = 128
)

// CheckSecret is ParseSecret that also refuses a key shorter than
// MinKeyBytes or longer than MaxKeyBytes: the check for a secret being
// configured, where ParseSecret reads one that was.
func CheckSecret(s string) ([]byte, error) {
	key, err := ParseSecret(s)
	if err != nil {
		return nil, err
	}
	if len(key) < MinKeyBytes || len(key) > MaxKeyBytes {
		return nil, fmt.Errorf("webhook secret: a key of %d bytes; want %d to %d (e.g. whsec_ and 32 random bytes in base64)", len(key), MinKeyBytes, MaxKeyBytes)
	}
	return key, nil
}

// Sign returns the webhook-signature value for body sent as message id at
// ts, signed with key.
func Sign(key []byte, id string, ts time.Time, body []byte) string {
	return "v1," + base64.StdEncoding.EncodeToString(mac(key, id, strconv.FormatInt(ts.Unix(), 10), body))
}

func mac(key []byte, id, ts string, body []byte) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(id))
	h.Write([]byte{'.'})
	h.Write([]byte(ts))
	h.Write([]byte{'.'})
	h.Write(body)
	return h.Sum(nil)
}

// Verify checks that one of the signatures (the webhook-signature header)
// is the HMAC of id, timestamp and the raw body under one of keys, and that
// timestamp (Unix seconds) is within Tolerance of now.
func Verify(keys [][]byte, id, timestamp, signatures string, body []byte, now time.Time) error {
	if id == "" || timestamp == "" || signatures == "" {
		return ErrMissingHeaders
	}
	sec, err := strconv.ParseInt(timestamp, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: webhook-timestamp %q is not Unix seconds", ErrTimestamp, timestamp)
	}
	if d := now.Sub(time.Unix(sec, 0)); d > Tolerance || d < -Tolerance {
		return fmt.Errorf("%w: webhook-timestamp %d is %v from now (at most %v)", ErrTimestamp, sec, d.Round(time.Second), Tolerance)
	}
	for _, key := range keys {
		want := mac(key, id, timestamp, body)
		for _, sig := range strings.Fields(signatures) {
			version, value, ok := strings.Cut(sig, ",")
			if !ok || version != "v1" {
				continue // other schemes (v1a: asymmetric) are not ours
			}
			got, err := base64.StdEncoding.DecodeString(value)
			if err == nil && hmac.Equal(got, want) {
				return nil
			}
		}
	}
	return ErrSignature
}
