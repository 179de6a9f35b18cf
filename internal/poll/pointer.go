package poll

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Pointer is a parsed JSON Pointer (RFC 6901): the reference tokens of
// "/a/b~1c/0" are a, b/c and 0. The empty pointer ("") is the whole
// document.
type Pointer struct {
	text   string
	tokens []string
}

// ParsePointer parses a JSON Pointer: "" or a string of "/"-prefixed
// reference tokens, in which "~0" stands for "~" and "~1" for "/".
func ParsePointer(s string) (Pointer, error) {
	if s == "" {
		return Pointer{}, nil
	}
	if !strings.HasPrefix(s, "/") {
		return Pointer{}, fmt.Errorf("JSON pointer %q: starts with /, e.g. /events (or is empty for the whole document)", s)
	}
	parts := strings.Split(s[1:], "/")
	for i, p := range parts {
		for j := 0; j < len(p); j++ {
			if p[j] == '~' && (j+1 == len(p) || (p[j+1] != '0' && p[j+1] != '1')) {
				return Pointer{}, fmt.Errorf("JSON pointer %q: ~ must be followed by 0 (for ~) or 1 (for /)", s)
			}
		}
		parts[i] = strings.ReplaceAll(strings.ReplaceAll(p, "~1", "/"), "~0", "~")
	}
	return Pointer{text: s, tokens: parts}, nil
}

// String returns the pointer as written.
func (p Pointer) String() string { return p.text }

// Find returns the value doc holds at p, as its raw JSON, and whether
// there is one. Array elements are reached by decimal index ("0", "12";
// no leading zeros, and "-" reaches nothing). doc must be valid JSON.
func (p Pointer) Find(doc json.RawMessage) (json.RawMessage, bool, error) {
	cur := []byte(doc)
	for _, tok := range p.tokens {
		i := skipSpace(cur, 0)
		if i >= len(cur) {
			return nil, false, nil
		}
		var found []byte
		switch cur[i] {
		case '{':
			eachMember(cur, func(key, val []byte) bool {
				if keyIs(key, tok) {
					found = val
					return false
				}
				return true
			})
		case '[':
			if tok == "" || (len(tok) > 1 && tok[0] == '0') {
				return nil, false, nil
			}
			n, err := strconv.Atoi(tok)
			if err != nil || n < 0 {
				return nil, false, nil
			}
			k := 0
			eachElement(cur, func(val []byte) {
				if k == n {
					found = val
				}
				k++
			})
		}
		if found == nil {
			return nil, false, nil // no such member or element; a scalar has none
		}
		cur = found
	}
	return cur, true, nil
}
