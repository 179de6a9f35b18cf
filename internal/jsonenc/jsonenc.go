// Package jsonenc appends JSON by hand, byte for byte as encoding/json
// writes it, for the paths where encoding/json's reflection shows in the
// profile.
//
// The root package postbox, which imports the standard library only,
// writes an envelope's strings with its own appendString, this
// package's AppendString: change both together.
package jsonenc

import "encoding/json"

// AppendString appends s as encoding/json writes a string: the same bytes,
// escapes included (HTML characters, invalid UTF-8, U+2028 and U+2029).
// Plain ASCII is copied as it is; anything else goes through
// encoding/json.
func AppendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if !Plain(s[i]) {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// Plain reports whether encoding/json writes c, in a string, as it is.
func Plain(c byte) bool {
	return c >= 0x20 && c < 0x7f && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
}
