package postbox_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/postbox-events/postbox"
)

// TestEnvelopeDeliverAt: deliver_at is decoded, encoded (after
// tracestate, as encoding/json writes the struct) and validated: an RFC
// 3339 time, in the past too; not one that does not parse, is not a
// string, or is more than MaxDeliverAhead ahead.
func TestEnvelopeDeliverAt(t *testing.T) {
	base := `{"schema_version":1,"event_id":"e1","type":"t","ts":"2026-02-16T23:10:21Z","session_id":"s","device_id":"d",`
	soon := time.Now().Add(30 * 24 * time.Hour).In(time.FixedZone("", 2*3600)).Format(time.RFC3339)
	env, err := postbox.DecodeEnvelope([]byte(base+`"deliver_at":"`+soon+`","payload":{}}`), postbox.Limits{})
	if err != nil || env.DeliverAt != soon {
		t.Fatalf("decode: %+v, %v", env, err)
	}
	if err := env.Validate(postbox.Limits{}); err != nil {
		t.Fatalf("validate: %v", err)
	}
	b, err := env.AppendJSON(nil)
	if err != nil {
		t.Fatal(err)
	}
	std, _ := json.Marshal(env)
	if string(b) != string(std) {
		t.Fatalf("AppendJSON %s, json.Marshal %s", b, std)
	}
	back, err := postbox.DecodeEnvelope(b, postbox.Limits{})
	if err != nil || back.DeliverAt != env.DeliverAt {
		t.Fatalf("decode of the encoding: %+v, %v", back, err)
	}
	for value, ok := range map[string]bool{
		`"2020-01-02T03:04:05Z"`: true, // past: due at once
		`"` + time.Now().Add(postbox.MaxDeliverAhead-time.Hour).UTC().Format(time.RFC3339) + `"`: true,
		`"` + time.Now().Add(postbox.MaxDeliverAhead+time.Hour).UTC().Format(time.RFC3339) + `"`: false,
		`"tomorrow"`:             false,
		`"2030-13-01T00:00:00Z"`: false,
		`1893456000`:             false,
	} {
		env, err := postbox.DecodeEnvelope([]byte(base+`"deliver_at":`+value+`,"payload":{}}`), postbox.Limits{})
		if err == nil {
			err = env.Validate(postbox.Limits{})
		}
		var fe *postbox.FieldError
		switch {
		case ok && err != nil:
			t.Errorf("deliver_at %s: %v, want it taken", value, err)
		case !ok && (!errors.As(err, &fe) || fe.Field != "deliver_at" || fe.Code != postbox.CodeInvalidField):
			t.Errorf("deliver_at %s: %v, want invalid_field naming deliver_at", value, err)
		}
	}
}
