// Package webhooksig verifies the signatures webhook providers put on
// their deliveries in schemes of their own (Standard Webhooks is
// package stdwebhook): GitHub's X-Hub-Signature-256 and Stripe's
// Stripe-Signature. Both are an HMAC-SHA256 of the exact bytes received,
// so a body must be verified as it arrived, before anything parses it.
package webhooksig

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The headers the providers sign in.
const (
	GitHubHeader = "X-Hub-Signature-256"
	StripeHeader = "Stripe-Signature"
)

// StripeTolerance is how far a Stripe signature's timestamp may be from
// now, either way, before the delivery is refused as a replay.
const StripeTolerance = 5 * time.Minute

// Errors of the verifiers, wrapped with detail.
var (
	ErrMissing   = errors.New("missing signature")
	ErrMalformed = errors.New("malformed signature")
	ErrTimestamp = errors.New("timestamp outside the tolerance")
	ErrSignature = errors.New("no signature matches")
)

// GitHub checks header (the X-Hub-Signature-256 value, "sha256=" and the
// hex HMAC-SHA256 of body) against each of secrets, GitHub's webhook
// secrets as the text configured at GitHub.
func GitHub(secrets []string, header string, body []byte) error {
	header = strings.TrimSpace(header)
	if header == "" {
		return ErrMissing
	}
	hexSig, ok := strings.CutPrefix(header, "sha256=")
	if !ok {
		return fmt.Errorf("%w: want sha256= and hex", ErrMalformed)
	}
	got, err := hex.DecodeString(hexSig)
	if err != nil || len(got) != sha256.Size {
		return fmt.Errorf("%w: want sha256= and 64 hex digits", ErrMalformed)
	}
	for _, s := range secrets {
		if hmac.Equal(got, mac([]byte(s), nil, body)) {
			return nil
		}
	}
	return ErrSignature
}

// SignGitHub returns the X-Hub-Signature-256 value of body under secret.
func SignGitHub(secret string, body []byte) string {
	return "sha256=" + hex.EncodeToString(mac([]byte(secret), nil, body))
}

// Stripe checks header (the Stripe-Signature value,
// "t=TIMESTAMP,v1=HEX[,v1=HEX…]") against each of secrets, Stripe's
// endpoint secrets ("whsec_…", used as they are written): one v1 must be
// the hex HMAC-SHA256 of "TIMESTAMP.body", and the timestamp (Unix
// seconds) must be within StripeTolerance of now. Other schemes (v0) are
// ignored.
func Stripe(secrets []string, header string, body []byte, now time.Time) error {
	header = strings.TrimSpace(header)
	if header == "" {
		return ErrMissing
	}
	var ts string
	var sigs [][]byte
	for part := range strings.SplitSeq(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return fmt.Errorf("%w: want t=TIMESTAMP,v1=HEX", ErrMalformed)
		}
		switch k {
		case "t":
			ts = v
		case "v1":
			if b, err := hex.DecodeString(v); err == nil {
				sigs = append(sigs, b)
			}
		}
	}
	if ts == "" || len(sigs) == 0 {
		return fmt.Errorf("%w: want t=TIMESTAMP and at least one v1=HEX", ErrMalformed)
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: t=%q is not Unix seconds", ErrMalformed, ts)
	}
	if d := now.Sub(time.Unix(sec, 0)); d > StripeTolerance || d < -StripeTolerance {
		return fmt.Errorf("%w: t=%d is %v from now (at most %v)", ErrTimestamp, sec, d.Round(time.Second), StripeTolerance)
	}
	for _, s := range secrets {
		want := mac([]byte(s), []byte(ts+"."), body)
		for _, got := range sigs {
			if hmac.Equal(got, want) {
				return nil
			}
		}
	}
	return ErrSignature
}

// SignStripe returns the Stripe-Signature value of body sent at t under
// secret.
func SignStripe(secret string, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac([]byte(secret), []byte(ts+"."), body))
}

func mac(key, prefix, body []byte) []byte {
	h := hmac.New(sha256.New, key)
	h.Write(prefix)
	h.Write(body)
	return h.Sum(nil)
}
