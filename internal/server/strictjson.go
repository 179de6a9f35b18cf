package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync"

	"github.com/postbox-events/postbox/api"
)

// decodeStrict decodes the JSON value data into v as the API takes a body:
// no unknown field, no field named in another case than its own (which
// encoding/json would take: {"NAME": …} for "name"), no name twice in one
// object (where encoding/json keeps the last), and one value. It returns
// the code and a message naming what is wrong, never a Go type.
func decodeStrict(data []byte, v any) (api.Code, string, bool) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		code, msg := jsonError(err)
		return code, msg, false
	}
	if dec.More() {
		return api.CodeInvalidJSON, "the body holds more than one JSON value", false
	}
	if err := checkNames(json.NewDecoder(bytes.NewReader(data)), reflect.TypeOf(v), ""); err != nil {
		if ce, ok := errors.AsType[*codedError](err); ok {
			return ce.code, ce.msg, false
		}
		return api.CodeInvalidJSON, "invalid JSON in the body", false // decoded above: not reached
	}
	return api.Code(""), "", true
}

// codedError is an error of the API with its code: a name checkNames
// refuses, or settings decodeSettings does.
type codedError struct {
	code api.Code
	msg  string
}

func (e *codedError) Error() string { return e.msg }

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

// checkNames reads the next JSON value from dec as it decodes into t, and
// refuses an object's name that is not exactly one of t's fields and a
// name given twice in one object. A value that is not of t's shape is
// read past: the decoder has accepted it already.
func checkNames(dec *json.Decoder, t reflect.Type, path string) error {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if !hasNames(t) {
		return skipValue(dec) // no field names in it (ids, strings), its own decoding, or any value (a payload)
	}
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	delim, ok := tok.(json.Delim)
	if !ok {
		return nil
	}
	switch delim {
	case '[':
		var elem reflect.Type
		if t.Kind() == reflect.Slice || t.Kind() == reflect.Array {
			elem = t.Elem()
		}
		for dec.More() {
			if err := checkNames(dec, elem, path+"[]"); err != nil {
				return err
			}
		}
	case '{':
		var fields map[string]reflect.Type
		var elem reflect.Type
		switch t.Kind() {
		case reflect.Struct:
			fields = jsonFields(t)
		case reflect.Map:
			elem = t.Elem()
		}
		seen := map[string]bool{}
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return err
			}
			name, _ := tok.(string)
			field := name
			if path != "" {
				field = path + "." + name
			}
			if seen[name] {
				return &codedError{api.CodeInvalidJSON, fmt.Sprintf("field %q appears twice", field)}
			}
			seen[name] = true
			next := elem
			if fields != nil {
				ft, ok := fields[name]
				if !ok {
					for known := range fields {
						if strings.EqualFold(known, name) {
							return &codedError{api.CodeUnknownField, fmt.Sprintf("unknown field %q (names are case-sensitive: %q)", field, known)}
						}
					}
				}
				next = ft
			}
			if err := checkNames(dec, next, field); err != nil {
				return err
			}
		}
	}
	_, err = dec.Token() // the closing delimiter
	return err
}

// hasNames reports whether a value decoded into t (pointers followed) has
// names to check: a struct or a map, or a slice of them; not what decodes
// itself or takes any value.
func hasNames(t reflect.Type) bool {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.Kind() == reflect.Interface || reflect.PointerTo(t).Implements(unmarshalerType) {
		return false
	}
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
		return true
	case reflect.Slice, reflect.Array:
		return hasNames(t.Elem())
	}
	return false
}

// skipValue reads past the next JSON value of dec in one piece (the
// thousand ids of an ack are not read token by token).
func skipValue(dec *json.Decoder) error {
	var raw json.RawMessage
	return dec.Decode(&raw)
}

// jsonFieldsCache holds jsonFields by type.
var jsonFieldsCache sync.Map

// jsonFields returns the names encoding/json gives the fields of the
// struct type t, embedded structs' included, with their types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	if f, ok := jsonFieldsCache.Load(t); ok {
		return f.(map[string]reflect.Type)
	}
	fields := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" || !f.IsExported() && !f.Anonymous {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		ft := f.Type
		if f.Anonymous && name == "" {
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				for n, t := range jsonFields(ft) {
					if _, ok := fields[n]; !ok {
						fields[n] = t
					}
				}
				continue
			}
		}
		if name == "" {
			name = f.Name
		}
		fields[name] = ft
	}
	jsonFieldsCache.Store(t, fields)
	return fields
}

// decodeSettings decodes a source's settings as decodeStrict does; its
// error is a *codedError whose message begins "settings: ".
func decodeSettings(raw []byte, v any) error {
	if code, msg, ok := decodeStrict(raw, v); !ok {
		return &codedError{code, "settings: " + strings.Replace(msg, "the body", "settings", 1)}
	}
	return nil
}

// writeInvalid answers err: with its code when it is a *codedError, else
// as invalid_field.
func writeInvalid(w http.ResponseWriter, err error) {
	code := api.CodeInvalidField
	if ce, ok := errors.AsType[*codedError](err); ok {
		code = ce.code
	}
	writeError(w, code, "%v", err)
}
