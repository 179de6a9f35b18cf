package poll

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzFind checks the scanner against encoding/json: for any valid JSON
// object without duplicate keys, Find of each top-level member gives the
// value json.Unmarshal gives, and the page decoder never panics.
func FuzzFind(f *testing.F) {
	for _, s := range []string{`{"a":1,"b":[1,{"c":"x\"]}"}],"d\u0041":null}`, `{"events":[{"id":1,"type":"t"}],"next":"2"}`,
		`[1,2,3]`, `"str"`, `{"a/b":{"~":true}}`, `{}`, `{"e":[]}`} {
		f.Add([]byte(s))
	}
	items := "/events"
	p, _ := New(Config{Name: "f", Sink: nopSink{}, Settings: Settings{URL: "http://x/", Items: &items, ID: "/id", Type: "/type",
		Time: "/at", CursorParam: "c", Next: "/next"}})
	f.Fuzz(func(t *testing.T, doc []byte) {
		p.decode(doc) // must not panic
		if !json.Valid(doc) {
			return
		}
		var obj map[string]json.RawMessage
		if json.Unmarshal(doc, &obj) != nil {
			return
		}
		n := 0
		eachMember(doc, func(key, val []byte) bool { n++; return true })
		if n != len(obj) {
			return // duplicate keys: json takes the last, Find the first
		}
		for k, want := range obj {
			ptr := Pointer{tokens: []string{k}}
			got, ok, err := ptr.Find(doc)
			if err != nil || !ok || !bytes.Equal(bytes.TrimSpace(got), bytes.TrimSpace(want)) {
				t.Fatalf("%s: Find(%q) = %s, %v, %v; json says %s", doc, k, got, ok, err, want)
			}
		}
	})
}
