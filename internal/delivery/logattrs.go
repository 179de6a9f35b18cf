package delivery

import (
	"reflect"
	"time"
)

// setAttrs returns the key-value pairs of kv whose value is set, for a log
// line: it leaves out a nil value or error, an empty string, a zero time
// and an empty list or map (err=<nil>, target="", from=0001-01-01...
// say nothing), whatever handler the embedding program logs with, as the
// binary's own loggers do. Numbers and booleans stay, zero or not.
func setAttrs(kv ...any) []any {
	out := kv[:0:0]
	for i := 0; i+1 < len(kv); i += 2 {
		if !unset(kv[i+1]) {
			out = append(out, kv[i], kv[i+1])
		}
	}
	return out
}

func unset(v any) bool {
	if t, ok := v.(time.Time); ok {
		return t.IsZero()
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Invalid: // nil
		return true
	case reflect.String, reflect.Slice, reflect.Map:
		return rv.Len() == 0
	case reflect.Pointer, reflect.Interface:
		return rv.IsNil()
	}
	return false
}
