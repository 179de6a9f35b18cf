package main

import (
	"bytes"
	"encoding/json"
	"testing"
)

// TestPrintMetadata: metadata prints as sorted "key: value" lines, a
// nested object indented under its key, header names as HTTP writes
// them, numbers as sent and lists joined; never as a Go map.
func TestPrintMetadata(t *testing.T) {
	for _, tc := range []struct{ raw, want string }{
		{``, "metadata: -\n"},
		{`{}`, "metadata: -\n"},
		{`{"remote_addr":"10.0.0.1:5000","headers":{"x-github-event":"push","content-type":"application/json","Idempotency-Key":"k1"}}`,
			"metadata:\n  headers:\n    Content-Type: application/json\n    Idempotency-Key: k1\n    X-Github-Event: push\n  remote_addr: 10.0.0.1:5000\n"},
		{`{"device_id":"pi-1","schema_version":1,"big":12345678901234567890,"ok":true,"none":null,"tags":["a","b"],"deep":[{"x":1}]}`,
			"metadata:\n  big: 12345678901234567890\n  deep: [{\"x\":1}]\n  device_id: pi-1\n  none: null\n  ok: true\n  schema_version: 1\n  tags: a, b\n"},
	} {
		var out bytes.Buffer
		if err := printMetadata(&cmdEnv{stdout: &out}, json.RawMessage(tc.raw)); err != nil {
			t.Fatal(err)
		}
		if out.String() != tc.want {
			t.Errorf("printMetadata(%s):\n%s\nwant:\n%s", tc.raw, out.String(), tc.want)
		}
	}
	if got := pairs(map[string]any{"a": map[string]any{"b": 1.0}, "c": []any{"x"}}); got != `a={"b":1},c=x` {
		t.Errorf("pairs of an object: %s", got)
	}
}
