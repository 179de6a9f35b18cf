package poll

import (
	"encoding/json"
)

// Scanning valid JSON without decoding it: a page is validated once
// (json.Valid), then its items and their members are found by these
// helpers, which copy nothing and allocate nothing.

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

func skipSpace(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

// skipValue returns the index just after the value starting at b[i]
// (b valid JSON, i at the value's first byte).
func skipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = skipString(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return i
	}
	for i < len(b) && b[i] != ',' && b[i] != '}' && b[i] != ']' && !isSpace(b[i]) {
		i++
	}
	return i
}

// skipString returns the index just after the string starting at b[i].
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return i
}

// eachMember calls fn with each member of the object obj (valid JSON,
// leading space allowed) until fn returns false: its key as written
// (quoted, escapes kept) and its value.
func eachMember(obj []byte, fn func(key, val []byte) bool) {
	i := skipSpace(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return
	}
	i = skipSpace(obj, i+1)
	for i < len(obj) && obj[i] == '"' {
		end := skipString(obj, i)
		key := obj[i:end]
		i = skipSpace(obj, end)
		i = skipSpace(obj, i+1) // the colon
		vend := skipValue(obj, i)
		if !fn(key, obj[i:vend]) {
			return
		}
		i = skipSpace(obj, vend)
		if i < len(obj) && obj[i] == ',' {
			i = skipSpace(obj, i+1)
		}
	}
}

// eachElement calls fn with each element of the array arr (valid JSON).
func eachElement(arr []byte, fn func(val []byte)) {
	i := skipSpace(arr, 0)
	if i >= len(arr) || arr[i] != '[' {
		return
	}
	i = skipSpace(arr, i+1)
	for i < len(arr) && arr[i] != ']' {
		end := skipValue(arr, i)
		fn(arr[i:end])
		i = skipSpace(arr, end)
		if i < len(arr) && arr[i] == ',' {
			i = skipSpace(arr, i+1)
		}
	}
}

// keyIs reports whether the quoted key (as written) is name.
func keyIs(key []byte, name string) bool {
	if plain(key) {
		return len(key) == len(name)+2 && string(key[1:len(key)-1]) == name
	}
	var s string
	return json.Unmarshal(key, &s) == nil && s == name
}

// unquote returns the text of a JSON string (valid JSON); ok is false
// for another value.
func unquote(v []byte) (string, bool) {
	if len(v) < 2 || v[0] != '"' {
		return "", false
	}
	if plain(v) {
		return string(v[1 : len(v)-1]), true
	}
	var s string
	err := json.Unmarshal(v, &s)
	return s, err == nil
}

// plain reports whether a JSON string holds no escapes and only ASCII:
// its text is its bytes between the quotes (otherwise encoding/json
// decodes it, as it would, invalid UTF-8 included).
func plain(v []byte) bool {
	for _, c := range v {
		if c == '\\' || c >= 0x80 {
			return false
		}
	}
	return true
}
