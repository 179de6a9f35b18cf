package postbox_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/postbox-events/postbox"
)

// The reference decoder: the encoding/json-based ParseEnvelope and
// SplitFrame that decode.go replaced, kept verbatim (but for the limit
// default) as the behaviour the hand-written decoder must reproduce, with
// refFieldErrors for the refusals encoding/json does not make.

func refParseEnvelope(data []byte, lim postbox.Limits) (postbox.Envelope, error) {
	var env postbox.Envelope
	maxBytes := lim.MaxEnvelopeBytes
	if maxBytes <= 0 {
		maxBytes = postbox.DefaultMaxEnvelopeBytes
	}
	if len(data) > maxBytes {
		return env, &postbox.FieldError{Code: postbox.CodeTooLarge, Message: fmt.Sprintf("envelope is %d bytes, over the limit of %d", len(data), maxBytes)}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&env); err != nil {
		fe := refDecodeError(data, err)
		if fe.Code == postbox.CodeInvalidJSON { // syntax, or not an object: these beat field errors
			return env, fe
		}
	}
	if fe := refFieldErrors(data, &env); fe != nil {
		return env, fe
	}
	if dec.More() {
		return env, &postbox.FieldError{Code: postbox.CodeInvalidJSON, Message: "envelope: unexpected data after the JSON object"}
	}
	return env, nil
}

// refFields are the envelope's fields by their JSON names.
var refFields = []string{"schema_version", "event_id", "type", "ts", "session_id", "device_id", "traceparent", "tracestate", "seq", "payload"}

// refFieldErrors walks the members of the valid JSON object data in order
// and returns the first field error: an unknown field or a wrong type (as
// encoding/json reports them: it decodes each member alone), a field given
// twice, a string field that is not valid UTF-8 text, a payload that is
// not valid UTF-8. It empties the fields of env whose last string was not
// valid text, and event_id when it was given twice.
func refFieldErrors(data []byte, env *postbox.Envelope) *postbox.FieldError {
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	var first *postbox.FieldError
	seen := map[string]bool{}
	lastBad := map[string]bool{} // the field's last string was not valid text
	idTwice := false
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			panic(err) // data is valid JSON
		}
		key := tok.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			panic(err)
		}
		name := ""
		for _, f := range refFields {
			if key == f {
				name = f
				break
			}
		}
		for _, f := range refFields {
			if name == "" && strings.EqualFold(key, f) {
				name = f
			}
		}
		// The member alone, to encoding/json.
		k, _ := json.Marshal(key)
		var alone postbox.Envelope
		adec := json.NewDecoder(bytes.NewReader([]byte(`{` + string(k) + `:` + string(raw) + `}`)))
		adec.DisallowUnknownFields()
		var fe *postbox.FieldError
		if err := adec.Decode(&alone); err != nil {
			fe = refDecodeError(data, err)
		}
		if (fe != nil && fe.Code == postbox.CodeUnknownField) != (name == "") {
			panic(fmt.Sprintf("key %q: field %q, error %v", key, name, fe))
		}
		if name != "" {
			if seen[name] {
				fe = &postbox.FieldError{Field: name, Code: postbox.CodeInvalidField, Message: name + ": given more than once"}
				idTwice = idTwice || name == "event_id"
			}
			seen[name] = true
			switch {
			case name == "payload":
				if fe == nil && !utf8.Valid(raw) {
					fe = &postbox.FieldError{Field: name, Code: postbox.CodeInvalidField, Message: name + ": not valid UTF-8"}
				}
				if d := refDepth(raw); fe == nil && d > postbox.MaxPayloadDepth {
					fe = &postbox.FieldError{Field: name, Code: postbox.CodeInvalidField,
						Message: fmt.Sprintf("payload: arrays and objects nested %d deep, at most %d", d, postbox.MaxPayloadDepth)}
				}
			case raw[0] == '"' && name != "schema_version" && name != "seq":
				valid := refValidText(raw)
				if !valid && fe == nil {
					fe = &postbox.FieldError{Field: name, Code: postbox.CodeInvalidField,
						Message: name + `: not valid UTF-8 text (an invalid byte sequence or an unpaired \u surrogate escape)`}
				}
				lastBad[name] = !valid
			}
		}
		if first == nil {
			first = fe
		}
	}
	for name, bad := range lastBad {
		if bad {
			*map[string]*string{"event_id": &env.EventID, "type": &env.Type, "ts": &env.TS,
				"session_id": &env.SessionID, "device_id": &env.DeviceID, "traceparent": &env.TraceParent, "tracestate": &env.TraceState}[name] = ""
		}
	}
	if idTwice {
		env.EventID = ""
	}
	return first
}

// refValidText reports whether the JSON string token raw holds valid
// UTF-8 and no \u escape of a lone surrogate.
func refValidText(raw []byte) bool {
	if !utf8.Valid(raw) {
		return false
	}
	s := string(raw[1 : len(raw)-1])
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			continue
		}
		i++
		if s[i] != 'u' {
			continue
		}
		r, _ := strconv.ParseUint(s[i+1:i+5], 16, 32)
		i += 4
		switch {
		case r >= 0xdc00 && r <= 0xdfff:
			return false
		case r >= 0xd800 && r <= 0xdbff:
			if i+7 > len(s) || s[i+1] != '\\' || s[i+2] != 'u' {
				return false
			}
			lo, _ := strconv.ParseUint(s[i+3:i+7], 16, 32)
			if lo < 0xdc00 || lo > 0xdfff {
				return false
			}
			i += 6
		}
	}
	return true
}

func refDecodeEnvelope(data []byte, lim postbox.Limits) (postbox.Envelope, error) {
	env, err := refParseEnvelope(data, lim)
	if err != nil {
		return env, err
	}
	return env, env.Validate(lim)
}

func refDecodeError(data []byte, err error) *postbox.FieldError {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		field := te.Field
		if field == "" {
			return &postbox.FieldError{Code: postbox.CodeInvalidJSON, Message: "envelope must be a JSON object, not " + te.Value}
		}
		return &postbox.FieldError{Field: field, Code: postbox.CodeInvalidField, Message: fmt.Sprintf("%s: must be %s, not %s", field, refJSONKind(te.Type.Kind().String()), te.Value)}
	case errors.As(err, &se):
		return &postbox.FieldError{Code: postbox.CodeInvalidJSON, Message: fmt.Sprintf("envelope is not valid JSON at byte %d: %v", se.Offset, se)}
	}
	msg := err.Error()
	if f, ok := refUnknownField(msg); ok {
		return &postbox.FieldError{Field: f, Code: postbox.CodeUnknownField, Message: fmt.Sprintf("%s: unknown field", f)}
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return &postbox.FieldError{Code: postbox.CodeInvalidJSON, Message: "envelope is empty"}
	}
	return &postbox.FieldError{Code: postbox.CodeInvalidJSON, Message: "envelope is not valid JSON: " + msg}
}

func refUnknownField(msg string) (string, bool) {
	const prefix = `json: unknown field "`
	if len(msg) > len(prefix) && msg[:len(prefix)] == prefix && msg[len(msg)-1] == '"' {
		return msg[len(prefix) : len(msg)-1], true
	}
	return "", false
}

func refJSONKind(goKind string) string {
	switch goKind {
	case "string":
		return "a string"
	case "int", "int64":
		return "an integer"
	case "ptr":
		return "an integer"
	case "slice":
		return "a JSON object"
	}
	return goKind
}

func refSplitFrame(frame []byte) ([]json.RawMessage, error) {
	b := bytes.TrimLeft(frame, " \t\r\n")
	if len(b) > 0 && b[0] == '[' {
		var envs []json.RawMessage
		if err := json.Unmarshal(b, &envs); err != nil {
			return nil, &postbox.FieldError{Code: postbox.CodeInvalidJSON, Message: "frame is not a valid JSON array of envelopes: " + err.Error()}
		}
		return envs, nil
	}
	if len(b) == 0 || b[0] != '{' {
		return nil, &postbox.FieldError{Code: postbox.CodeInvalidJSON, Message: "frame must be an envelope object or an array of envelopes"}
	}
	return []json.RawMessage{frame}, nil
}

// checkSameDecode fails t unless ParseEnvelope and DecodeEnvelope answer
// data exactly as the reference does: the same error, and the same
// envelope, also the partial one an error leaves (its EventID names NACKs).
func checkSameDecode(t *testing.T, data []byte) {
	t.Helper()
	for _, fn := range []struct {
		name     string
		got, ref func([]byte, postbox.Limits) (postbox.Envelope, error)
	}{
		{"ParseEnvelope", postbox.ParseEnvelope, refParseEnvelope},
		{"DecodeEnvelope", postbox.DecodeEnvelope, refDecodeEnvelope},
	} {
		got, gerr := fn.got(data, postbox.Limits{})
		want, werr := fn.ref(data, postbox.Limits{})
		if !sameError(gerr, werr) {
			t.Fatalf("%s(%q):\n got error %#v\nwant error %#v", fn.name, data, gerr, werr)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s(%q) (error %v):\n got %s\nwant %s", fn.name, data, werr, showEnvelope(got), showEnvelope(want))
		}
	}
	env, err := postbox.ParseEnvelope(data, postbox.Limits{})
	if err == nil && env.Payload != nil {
		checkCompact(t, env.Payload)
	}
}

// checkCompact fails t unless AppendCompact writes what json.Compact
// writes for the valid JSON p.
func checkCompact(t *testing.T, p []byte) {
	t.Helper()
	var want bytes.Buffer
	if err := json.Compact(&want, p); err != nil {
		t.Fatalf("json.Compact(%q): %v", p, err)
	}
	if got := postbox.AppendCompact(nil, p); !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("AppendCompact(nil, %q) = %q, want %q", p, got, want.Bytes())
	}
	if got := postbox.AppendCompact([]byte("x"), p); !bytes.Equal(got, append([]byte("x"), want.Bytes()...)) {
		t.Fatalf("AppendCompact(x, %q) = %q, want x%q", p, got, want.Bytes())
	}
}

// checkSameSplit fails t unless SplitFrame answers frame as the reference
// does, and then decodes every envelope of it as the reference does.
func checkSameSplit(t *testing.T, frame []byte) {
	t.Helper()
	got, gerr := postbox.SplitFrame(frame)
	want, werr := refSplitFrame(frame)
	if !sameError(gerr, werr) {
		t.Fatalf("SplitFrame(%q):\n got error %#v\nwant error %#v", frame, gerr, werr)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("SplitFrame(%q):\n got %q\nwant %q", frame, got, want)
	}
	for _, raw := range got {
		checkSameDecode(t, raw)
	}
}

func sameError(a, b error) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	var fa, fb *postbox.FieldError
	return errors.As(a, &fa) && errors.As(b, &fb) && *fa == *fb
}

func showEnvelope(e postbox.Envelope) string {
	seq := "nil"
	if e.Seq != nil {
		seq = strconv.FormatInt(*e.Seq, 10)
	}
	return fmt.Sprintf("{v=%d id=%q type=%q ts=%q session=%q device=%q seq=%s payload=%q (nil %v)}",
		e.SchemaVersion, e.EventID, e.Type, e.TS, e.SessionID, e.DeviceID, seq, e.Payload, e.Payload == nil)
}

// envWith returns a valid envelope followed by the members field, without
// the envelope's own members of the names field holds (given twice, a
// field is refused).
func envWith(field string) string {
	e := "{"
	for _, m := range []string{`"schema_version":1`, `"event_id":"e"`, `"type":"t"`, `"ts":"2026-01-01T00:00:00Z"`,
		`"session_id":"s"`, `"device_id":"d"`, `"payload":{"a":[1,{"b":null}]}`} {
		if !strings.Contains(field, m[:strings.IndexByte(m, ':')]) {
			e += m + ","
		}
	}
	if field == "" {
		return strings.TrimSuffix(e, ",") + `}`
	}
	return e + field + `}`
}

// trickySeeds are inputs where a hand-written decoder easily parts ways
// with encoding/json.
func trickySeeds() []string {
	var seeds []string
	add := func(s ...string) { seeds = append(seeds, s...) }
	for _, n := range []string{"1", "1e2", "1E0", "1.0", "-0", "-0.0", "0", "01", "-", "1.", "1.e1", "1e", "1e+", "2",
		"9223372036854775807", "9223372036854775808", "-9223372036854775808", "-9223372036854775809",
		"123456789012345678", "1234567890123456789", "99999999999999999999", "null", "true", "false", `"1"`, "[1]", `{"a":1}`, "nul", "tru"} {
		add(envWith(`"schema_version":`+n), envWith(`"schema_version":1,"seq":`+n))
	}
	add(
		envWith(`"schema_version":1,"seq":5,"seq":null`),
		envWith(`"schema_version":1,"seq":null,"seq":5`),
		envWith(`"schema_version":1,"seq":5,"seq":1.5`),
		envWith(`"schema_version":1,"seq":"x","seq":3`),
		envWith(`"schema_version":1,"seq":-1`),
		envWith(`"schema_version":2,"schema_version":1`),
		// Fields given twice, also under another case, and after an error.
		envWith("")[:len(envWith(""))-1]+`,"event_id":"e2"}`,
		envWith("")[:len(envWith(""))-1]+`,"Event_ID":"e"}`,
		envWith("")[:len(envWith(""))-1]+`,"payload":{}}`,
		envWith("")[:len(envWith(""))-1]+`,"ſeq":1,"seq":2}`,
		envWith(`"schema_version":1,"event_id":"a","event_id":5`),
		envWith(`"schema_version":1,"event_id":5,"event_id":"a"`),
		envWith(`"schema_version":1,"devise":1,"type":"a","type":"b"`),
		envWith(`"schema_version":1,"type":"a","type":"b","devise":1`),
		envWith("\"schema_version\":1,\"type\":\"\xff\",\"type\":\"b\""),
		envWith("\"schema_version\":1,\"type\":\"b\",\"type\":\"\xff\",\"type\":null"),
		envWith("\"schema_version\":1,\"event_id\":\"\xff\",\"event_id\":\"b\""),
		// Text that is not valid UTF-8, in each field and in the payload.
		envWith("\"schema_version\":1,\"type\":\"a\xc3\""),
		envWith("\"schema_version\":1,\"ts\":\"2026\xe2\x82\""),
		envWith("\"schema_version\":1,\"session_id\":\"\xf4\x90\x80\x80\""),
		envWith("\"schema_version\":1,\"device_id\":\"\xc0\xaf\""),
		envWith(`"schema_version":1,"device_id":"\udc00"`),
		envWith(`"schema_version":1,"device_id":"\ud800\\ud800"`),
		envWith(`"schema_version":1,"device_id":"\\ud800"`),
		envWith(`"schema_version":1,"device_id":"\uDBFF\uDFFF\ud800"`),
		envWith("\"schema_version\":1,\"payload\":{\"k\":\"\xff\"}"),
		// Payloads nested to the limit and one past it.
		envWith(`"schema_version":1,"payload":`+strings.Repeat(`[`, postbox.MaxPayloadDepth)+strings.Repeat(`]`, postbox.MaxPayloadDepth)),
		envWith(`"schema_version":1,"payload":`+strings.Repeat(`{"a":[`, postbox.MaxPayloadDepth/2)+`"]}"`+strings.Repeat(`]}`, postbox.MaxPayloadDepth/2)+`,"event_id":5`),
		envWith(`"schema_version":1,"payload":`+strings.Repeat(`[`, postbox.MaxPayloadDepth+1)+strings.Repeat(`]`, postbox.MaxPayloadDepth+1)),
		envWith("\"schema_version\":1,\"payload\":{\"\xed\xa0\x80\":1}"),
		envWith(`"schema_version":1,"payload":{"k":"\ud800"}`),
		envWith("\"schema_version\":1,\"payload\":{\"k\":\"\xff\"},\"event_id\":5"),
		envWith("\"schema_version\":1,\"event_id\":5,\"payload\":{\"k\":\"\xff\"}"),
		envWith(`"schema_version":1,"schema_version":null`),
		// Strings.
		envWith(`"schema_version":1,"event_id":"e\u0041\"\\\/\b\f\n\r\t"`),
		envWith(`"schema_version":1,"event_id":"\ud83d\ude00 \uD83D\uDE00"`),
		envWith(`"schema_version":1,"event_id":"\ud83d"`),
		envWith(`"schema_version":1,"event_id":"\ude00x"`),
		envWith(`"schema_version":1,"event_id":"\ud83dx\ud83d\u0041\ud83d\ud83d\ude00"`),
		envWith(`"schema_version":1,"event_id":"\u0000\u001f\u007f\u2028"`),
		envWith("\"schema_version\":1,\"event_id\":\"caf\xc3\xa9 \xff \xed\xa0\x80 \xef\xbf\xbd \xe2\x82\""),
		envWith(`"schema_version":1,"event_id":"\x"`),
		envWith(`"schema_version":1,"event_id":"\u12G4"`),
		envWith("\"schema_version\":1,\"event_id\":\"a\tb\""),
		envWith(`"schema_version":1,"event_id":"`+strings.Repeat("x", 200)+`"`),
		// Keys.
		envWith(`"Schema_Version":1,"EVENT_ID":"E"`),
		envWith(`"ſchema_verſion":1,"ſeq":3`),
		envWith(`"schema_version":1,"\u0065vent_id":"u","even\u0074_id":"v"`),
		envWith(`"schema_version":1,"seq\u0000":1`),
		envWith(`"schema_version":1,"de\"vise":1`),
		envWith(`"schema_version":1,"":1`),
		envWith(`"schema_version":1,"a\nb\u00e9\u2028":1`),
		envWith("\"schema_version\":1,\"\xff\":1"),
		envWith("\"schema_version\":1,\"s\xc5\xbfq\":1"),
		envWith(`"schema_version":1,"devise":"x","payload":7`),
		envWith(`"schema_version":1,"event_id":7,"devise":"x"`),
		envWith(`"schema_version":1,"devise":"x","event_id":7`),
		envWith(`"schema_version":1,"event_id":"a","event_id":null`),
		envWith(`"schema_version":1,"event_id":{"a":1},"type":[1],"ts":true,"session_id":1.5`),
		envWith(`"schema_version":1,"payload":null`),
		envWith(`"schema_version":1,"payload":[1,2]`),
		envWith(`"schema_version":1,"payload":"x"`),
		envWith(`"schema_version":1,"payload":{"a":1},"payload":{"b":2}`),
		// Whitespace and nesting.
		" \t\r\n{ \"schema_version\" :\t1 ,\n\"event_id\" : \"e\" , \"type\":\"t\",\"ts\":\"2026-01-01T00:00:00Z\",\"session_id\":\"s\",\"device_id\":\"d\",\"payload\" : { \"a\" : [ 1 , { \"b\" : \"x y\" } ] , \"c\" : -1.5e-3 } } \n",
		envWith(`"schema_version":1,"payload":{"deep":[[[[[[{"x":[true,false,null,0,-0,1.25,1E+9,"\u00e9"]}]]]]]]}`),
		`{"schema_version":1,"payload":{"a":`+strings.Repeat("[", 9998)+strings.Repeat("]", 9998)+`}}`,
		`{"schema_version":1,"payload":{"a":`+strings.Repeat("[", 9999)+strings.Repeat("]", 9999)+`}}`,
		`{"payload":`+strings.Repeat("{\"a\":", 9999)+"1"+strings.Repeat("}", 9999)+`}`,
		`{"payload":`+strings.Repeat("{\"a\":", 10000)+"1"+strings.Repeat("}", 10000)+`}`,
		strings.Repeat("[", 10001),
		// Top level and trailing data.
		envWith("")+"}", envWith("")+"]", envWith("")+" }}}", envWith("")+" x", envWith("")+"{}", envWith("")+"\v",
		"null", "null}", "null x", "nullx", "nul", "true", "false", "5", "5x", "-", "1.", "0 1", `"x"`, `"x`, "[1,2]", "[1,", "[",
		"{", "{ ", `{"a"`, `{"a":`, `{"a":1`, `{"a":1,`, `{"a":1,}`, `{,}`, `{"a" 1}`, `{"a":1 "b":2}`, `{"a":tx}`, `{"a":-x}`,
		`{"a":1.x}`, `{"a":1ex}`, `{"a":01}`, `{"a":"\u12`, `{"a":"\`, `{}`, "", " ", "\v", "\x00", "\xff", "}", "]", "'",
	)
	return seeds
}

// frameSeeds are inputs for SplitFrame.
func frameSeeds() []string {
	e := envWith("")
	return []string{
		"[]", " [ ] ", "[" + e + "]", "[" + e + "," + e + "]", " [\n" + e + " ,\t" + e + "\n] \n",
		"[1 2]", "[1,]", "[,1]", "[" + e + "] x", "[" + e + "] [", "[" + e, "[" + e + ",", `[{"a":x}]`,
		`[{"a":1}{"b":2}]`, `[{"a":[}]`, `[{"a":"]"}]`, `["\"]",1]`, "[1.", "[-", "[1e", "[tru", `["\`, `["\u1`, `["a`,
		"[null,true,false,-0.5e+10,\"x\",[],{}]", "[" + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + "]",
		"[" + strings.Repeat("[", 9999) + strings.Repeat("]", 9999) + "]",
		"{", " {", "{]", "x", "", "\t", `"x"`,
	}
}

// FuzzDecodeDifferential holds the hand-written decoder to the
// encoding/json one it replaced: for any input, SplitFrame and
// ParseEnvelope/DecodeEnvelope return exactly what the reference returns,
// errors and partial envelopes included (Payload byte for byte, which is
// stricter than after compaction), and AppendCompact writes what
// json.Compact writes.
func FuzzDecodeDifferential(f *testing.F) {
	files, _ := filepath.Glob("testdata/envelopes/*.json")
	for _, in := range files {
		data, err := os.ReadFile(in)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, s := range trickySeeds() {
		f.Add([]byte(s))
	}
	for _, s := range frameSeeds() {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkSameDecode(t, data)
		checkSameSplit(t, data)
		// Also as the element of an array frame, where the scanner
		// validates it at depth 1.
		checkSameSplit(t, wrap("[", data, ",1]"))
		if json.Valid(data) {
			checkCompact(t, data)
		} else {
			postbox.AppendCompact(nil, data) // must not panic
		}
	})
}

func wrap(prefix string, data []byte, suffix string) []byte {
	b := make([]byte, 0, len(prefix)+len(data)+len(suffix))
	return append(append(append(b, prefix...), data...), suffix...)
}

func TestAppendCompact(t *testing.T) {
	p := []byte(`{"a":[1,{"b":"x y"}]}`)
	if got := postbox.AppendCompact(nil, p); &got[0] != &p[0] {
		t.Errorf("AppendCompact(nil, compact) copied")
	}
	for _, tc := range []struct{ in, want string }{
		{`{"a":[1,{"b":"x y"}]}`, `{"a":[1,{"b":"x y"}]}`},
		{" { \"a\" :\t[ 1 ,\r\n{\"b\":\"x \\\" y\"} ] } ", `{"a":[1,{"b":"x \" y"}]}`},
		{`{"a\\":" b "}`, `{"a\\":" b "}`},
		{`{}`, `{}`},
	} {
		if got := postbox.AppendCompact(nil, []byte(tc.in)); string(got) != tc.want {
			t.Errorf("AppendCompact(%q) = %q, want %q", tc.in, got, tc.want)
		}
		checkCompact(t, []byte(tc.in))
	}
}

func TestSplitFrameAliases(t *testing.T) {
	frame := []byte(`[{"a":1}, {"b":2}]`)
	envs, err := postbox.SplitFrame(frame)
	if err != nil || len(envs) != 2 {
		t.Fatalf("got %q, %v", envs, err)
	}
	if &envs[0][0] != &frame[1] || cap(envs[0]) != len(envs[0]) {
		t.Errorf("element 0 is not a capped sub-slice of the frame")
	}
}

func ExampleAppendCompact() {
	env, err := postbox.DecodeEnvelope([]byte(`{"schema_version":1,"event_id":"evt_1","type":"light.switched",
		"ts":"2026-02-16T23:10:21Z","session_id":"s1","device_id":"pi-hall","payload": { "room": "hall", "on": true }}`), postbox.Limits{})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%s\n", postbox.AppendCompact(nil, env.Payload))
	// Output: {"room":"hall","on":true}
}

// benchFrame returns an array frame of n envelopes of about 450 bytes,
// each with a payload object of about 300 bytes.
func benchFrame(n int) []byte {
	const payload = `{"intent":"server.log_summary","confidence":0.84,"user_text":"summarise the nginx error log for the last hour and flag anything unusual","source":{"app":"voice","locale":"en-GB","mic":2},"tags":["ops","logs","nightly"],"window_s":3600,"dry_run":false,"trace":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`
	var b bytes.Buffer
	b.WriteByte('[')
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"schema_version":1,"event_id":"evt_01JZ4J1NZ0A1G8R4J8X3P4H%03d","type":"proposal.task","ts":"2026-02-16T23:10:21.123456Z","session_id":"sess_01JZ4J1NZ0","device_id":"pi-livingroom-01","seq":%d,"payload":%s}`, i, 1000+i, payload)
	}
	b.WriteByte(']')
	return b.Bytes()
}

// BenchmarkDecodeFrame decodes a frame of 64 envelopes as ingress does:
// SplitFrame, then DecodeEnvelope of each, and with "+compact" also the
// payload compaction of ingress's toEvent. encoding_json is the reference
// implementation, the baseline; ns/envelope is the figure to compare.
func BenchmarkDecodeFrame(b *testing.B) {
	const n = 64
	frame := benchFrame(n)
	type impl struct {
		split   func([]byte) ([]json.RawMessage, error)
		decode  func([]byte, postbox.Limits) (postbox.Envelope, error)
		compact func(json.RawMessage) []byte
	}
	refCompact := func(p json.RawMessage) []byte {
		var buf bytes.Buffer
		buf.Grow(len(p))
		if json.Compact(&buf, p) != nil {
			buf.Write(p)
		}
		return buf.Bytes()
	}
	newCompact := func(p json.RawMessage) []byte { return postbox.AppendCompact(nil, p) }
	for _, bm := range []struct {
		name string
		impl impl
	}{
		{"encoding_json", impl{refSplitFrame, refDecodeEnvelope, nil}},
		{"postbox", impl{postbox.SplitFrame, postbox.DecodeEnvelope, nil}},
		{"encoding_json+compact", impl{refSplitFrame, refDecodeEnvelope, refCompact}},
		{"postbox+compact", impl{postbox.SplitFrame, postbox.DecodeEnvelope, newCompact}},
	} {
		b.Run(bm.name, func(b *testing.B) {
			b.SetBytes(int64(len(frame)))
			b.ReportAllocs()
			var sink int
			for b.Loop() {
				raws, err := bm.impl.split(frame)
				if err != nil || len(raws) != n {
					b.Fatalf("split: %d envelopes, %v", len(raws), err)
				}
				for _, raw := range raws {
					env, err := bm.impl.decode(raw, postbox.Limits{})
					if err != nil {
						b.Fatal(err)
					}
					if bm.impl.compact != nil {
						sink += len(bm.impl.compact(env.Payload))
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/envelope")
			_ = sink
		})
	}
}

// refDepth is the deepest nesting of arrays and objects in the JSON value
// raw, counted outside its strings.
func refDepth(raw []byte) int {
	depth, deepest, inString := 0, 0, false
	for i := 0; i < len(raw); i++ {
		switch c := raw[i]; {
		case inString && c == '\\':
			i++
		case c == '"':
			inString = !inString
		case inString:
		case c == '{' || c == '[':
			depth++
			deepest = max(deepest, depth)
		case c == '}' || c == ']':
			depth--
		}
	}
	return deepest
}
