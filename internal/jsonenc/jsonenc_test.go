package jsonenc

import (
	"encoding/json"
	"testing"
)

func FuzzAppendString(f *testing.F) {
	for _, s := range []string{
		"", "plain", "wh_bench_1", "Tom & Jerry <shop>", "a&b", "a>b", `quote " and \ backslash`, "tab\there", "nl\n cr\r",
		"\x00\x01\x1f\x7f", "é ü 中文", "\u2028\u2029", "invalid \xff\xfe utf-8", "trunc \xe2\x82",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, _ := json.Marshal(s)
		if got := AppendString([]byte("x"), s); string(got) != "x"+string(want) {
			t.Fatalf("AppendString(%q) = %s, want x%s", s, got, want)
		}
	})
}

// Plain holds only for bytes encoding/json copies into a string as they
// are (it leaves out DEL, which encoding/json copies too: AppendString
// then goes through encoding/json, to the same bytes).
func TestPlain(t *testing.T) {
	for c := range 256 {
		s := string([]byte{byte(c)})
		q, _ := json.Marshal(s)
		if Plain(byte(c)) && string(q) != `"`+s+`"` {
			t.Errorf("Plain(%#x), but encoding/json writes %q", c, q)
		}
	}
}
