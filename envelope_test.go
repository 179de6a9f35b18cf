package postbox_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/postbox-events/postbox"
)

var update = flag.Bool("update", false, "rewrite golden files")

// TestDecodeEnvelopeGolden decodes every testdata/envelopes/*.json and
// compares the result (the envelope, or the NACK it earns) with its .golden
// file. Run with -update after a deliberate change.
func TestDecodeEnvelopeGolden(t *testing.T) {
	files, err := filepath.Glob("testdata/envelopes/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden inputs: %v", err)
	}
	for _, in := range files {
		name := strings.TrimSuffix(filepath.Base(in), ".json")
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(in)
			if err != nil {
				t.Fatal(err)
			}
			data = bytes.TrimSuffix(data, []byte("\n"))
			env, err := postbox.DecodeEnvelope(data, postbox.Limits{})
			var got any = env
			if err != nil {
				got = postbox.Nack(postbox.PeekEventID(data), err)
			}
			if strings.HasPrefix(name, "valid_") != (err == nil) {
				t.Errorf("valid_ prefix says %v, decode error %v", strings.HasPrefix(name, "valid_"), err)
			}
			out, _ := json.MarshalIndent(got, "", "  ")
			out = append(out, '\n')
			golden := strings.TrimSuffix(in, ".json") + ".golden"
			if *update {
				if err := os.WriteFile(golden, out, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -update to create it)", err)
			}
			if !bytes.Equal(out, want) {
				t.Errorf("%s: got\n%s\nwant\n%s", name, out, want)
			}
		})
	}
}

func TestNackNamesField(t *testing.T) {
	for _, tc := range []struct{ in, field string }{
		{`{"schema_version":1,"event_id":"e","type":"t","ts":"nope","session_id":"s","device_id":"d","payload":{}}`, "ts"},
		{`{"schema_version":1,"event_id":"e","type":"t","ts":"2026-01-01T00:00:00Z","session_id":"s","device_id":"d","payload":[]}`, "payload"},
		{`{"schema_version":1,"event_id":"e","type":"t","ts":"2026-01-01T00:00:00Z","session_id":"s","payload":{}}`, "device_id"},
	} {
		_, err := postbox.DecodeEnvelope([]byte(tc.in), postbox.Limits{})
		r := postbox.Nack("e", err)
		if r.Field != tc.field || !strings.HasPrefix(r.Message, tc.field+":") || r.Retryable {
			t.Errorf("%s: got %+v, want a non-retryable NACK naming %s", tc.in, r, tc.field)
		}
	}
}

func TestDecodeEnvelopeSizeLimit(t *testing.T) {
	big := `{"schema_version":1,"event_id":"e","type":"t","ts":"2026-01-01T00:00:00Z","session_id":"s","device_id":"d","payload":{"x":"` + strings.Repeat("a", 2000) + `"}}`
	if _, err := postbox.DecodeEnvelope([]byte(big), postbox.Limits{MaxEnvelopeBytes: 1000}); postbox.Nack("e", err).Code != postbox.CodeTooLarge {
		t.Fatalf("got %v, want too_large", err)
	}
	if _, err := postbox.DecodeEnvelope([]byte(big), postbox.Limits{}); err != nil {
		t.Fatalf("default limit refused a 2 KB envelope: %v", err)
	}
}

func TestSplitFrame(t *testing.T) {
	one := `{"event_id":"a"}`
	got, err := postbox.SplitFrame([]byte(one))
	if err != nil || len(got) != 1 {
		t.Fatalf("single: %v %v", got, err)
	}
	got, err = postbox.SplitFrame([]byte(`[` + one + `,` + one + `, 5]`))
	if err != nil || len(got) != 3 {
		t.Fatalf("array: %v %v", got, err)
	}
	for _, bad := range []string{``, `5`, `[{"a":1}`, `"x"`} {
		if _, err := postbox.SplitFrame([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// FuzzDecodeEnvelope checks that decoding never panics, that every refusal
// is a NACK with a code and a message, and that an accepted envelope
// survives a round trip through encoding.
func FuzzDecodeEnvelope(f *testing.F) {
	files, _ := filepath.Glob("testdata/envelopes/*.json")
	for _, in := range files {
		data, _ := os.ReadFile(in)
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, raw := range mustSplit(data) {
			env, err := postbox.DecodeEnvelope(raw, postbox.Limits{})
			if err != nil {
				r := postbox.Nack(postbox.PeekEventID(raw), err)
				if r.Code == "" || r.Message == "" || r.Retryable {
					t.Fatalf("bad NACK %+v for %q", r, raw)
				}
				continue
			}
			enc, err := json.Marshal(env)
			if err != nil {
				t.Fatal(err)
			}
			again, err := postbox.DecodeEnvelope(enc, postbox.Limits{MaxEnvelopeBytes: 1 << 30})
			if err != nil {
				t.Fatalf("re-decode of %s: %v", enc, err)
			}
			if again.EventID != env.EventID || again.TS != env.TS {
				t.Fatalf("round trip changed %+v into %+v", env, again)
			}
		}
	})
}

func mustSplit(data []byte) []json.RawMessage {
	envs, err := postbox.SplitFrame(data)
	if err != nil {
		return nil
	}
	return envs
}

// TestDecodeEnvelopePayloadDepth: a payload nested deeper than
// MaxPayloadDepth is refused on its own, naming the payload, with the
// envelope's event_id kept so that a NACK can name the event; one at the
// limit is taken.
func TestDecodeEnvelopePayloadDepth(t *testing.T) {
	env := func(depth int) []byte {
		return []byte(`{"schema_version":1,"event_id":"evt-deep","type":"t","ts":"2026-01-02T03:04:05Z","session_id":"s","device_id":"d","payload":` +
			strings.Repeat(`{"a":`, depth) + `1` + strings.Repeat(`}`, depth) + `}`)
	}
	if _, err := postbox.DecodeEnvelope(env(postbox.MaxPayloadDepth), postbox.Limits{}); err != nil {
		t.Fatalf("a payload %d deep: %v", postbox.MaxPayloadDepth, err)
	}
	got, err := postbox.DecodeEnvelope(env(postbox.MaxPayloadDepth+1), postbox.Limits{})
	var fe *postbox.FieldError
	if !errors.As(err, &fe) || fe.Field != "payload" || fe.Code != postbox.CodeInvalidField || got.EventID != "evt-deep" {
		t.Fatalf("a payload %d deep: %v, event id %q; want invalid_field payload naming evt-deep", postbox.MaxPayloadDepth+1, err, got.EventID)
	}
	// In a frame it is one envelope's NACK, not the frame's.
	envs, ferr := postbox.SplitFrame([]byte("[" + string(env(postbox.MaxPayloadDepth+1)) + "]"))
	if ferr != nil || len(envs) != 1 {
		t.Fatalf("a frame with it: %v", ferr)
	}
}
