package postbox

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// This file holds the hand-written decoder of the wire format: SplitFrame's
// scanner, ParseEnvelope's single-pass decoder and AppendCompact.
//
// It answers as the encoding/json code it replaced did, errors and their
// messages included, but for three refusals encoding/json does not make
// (FuzzDecodeDifferential holds it to that):
//
//   - syntax is checked as encoding/json's scanner checks it, with the same
//     error text, the same byte offsets and the same nesting limit;
//   - a syntax error anywhere in the value beats every other error, and
//     leaves the envelope zero, as json.Decoder.Decode does;
//   - otherwise the first field error in document order is reported, and
//     the fields around it are still decoded: a wrong type, an unknown
//     field, and (not in encoding/json) a field given twice, a string field
//     that is not valid UTF-8 text, or a payload that is not valid UTF-8;
//   - keys match exactly, else case-insensitively (bytes.EqualFold); of
//     duplicate keys (refused) the last wins;
//   - strings are unescaped as encoding/json does: \uXXXX with surrogate
//     pairs; where encoding/json turns invalid UTF-8 or a lone surrogate
//     into U+FFFD, a string field is refused and left empty (a key becomes
//     U+FFFD: it is an unknown field anyway), so that two ids never merge;
//     the event_id of an envelope that gives it twice is left empty too;
//   - "seq": null clears Seq, null leaves any other field as it was;
//   - after the object, ']' or '}' are tolerated where json.Decoder.More
//     tolerates them, and anything else is trailing data.

// maxNestingDepth is encoding/json's limit on nested arrays and objects.
const maxNestingDepth = 10000

// Byte classes.
const (
	// plainASCII marks bytes that stand for themselves inside a JSON
	// string and need no UTF-8 check: printable ASCII but '"' and '\\'.
	plainASCII = 1 << iota
	// stringSafe marks bytes a JSON string may hold unescaped, UTF-8 left
	// unchecked: all but '"', '\\' and control characters.
	stringSafe
	// space marks JSON whitespace.
	space
)

var byteClass = func() (t [256]uint8) {
	for c := 0x20; c < 256; c++ {
		if c != '"' && c != '\\' {
			t[c] |= stringSafe
			if c < utf8.RuneSelf {
				t[c] |= plainASCII
			}
		}
	}
	for _, c := range []byte{' ', '\t', '\r', '\n'} {
		t[c] |= space
	}
	return t
}()

func skipSpace(data []byte, i int) int {
	for i < len(data) && data[i] <= ' ' && byteClass[data[i]]&space != 0 {
		i++
	}
	return i
}

// Eight bytes at a time: a word's bytes that are zero, or below a bound,
// are found with the "has zero byte" trick. Its lowest flag is exact;
// flags above it may be false, so only the lowest is used.
const (
	lsbs = 0x0101010101010101
	msbs = 0x8080808080808080
)

// stringEnd returns the index of the first byte from data[i] on that is
// '"', '\\' or a control character, or len(data).
func stringEnd(data []byte, i int) int {
	for ; i+8 <= len(data); i += 8 {
		if m := stringStops(binary.LittleEndian.Uint64(data[i:])); m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
	}
	for i < len(data) && byteClass[data[i]]&stringSafe != 0 {
		i++
	}
	return i
}

// plainEnd is stringEnd that stops at non-ASCII bytes too.
func plainEnd(data []byte, i int) int {
	for ; i+8 <= len(data); i += 8 {
		x := binary.LittleEndian.Uint64(data[i:])
		if m := stringStops(x) | x&msbs; m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
	}
	for i < len(data) && byteClass[data[i]]&plainASCII != 0 {
		i++
	}
	return i
}

// stringStops flags the bytes of x that are '"', '\\' or below 0x20.
func stringStops(x uint64) uint64 {
	q := x ^ (lsbs * '"')
	b := x ^ (lsbs * '\\')
	return ((q-lsbs)&^q | (b-lsbs)&^b | (x-lsbs*0x20)&^x) & msbs
}

// scanner validates JSON as encoding/json's scanner does. Its methods take
// the index where a token starts and return the index after it, or -1 after
// recording the first syntax error in off and ctx.
type scanner struct {
	data []byte
	// off is the index of the byte at fault, len(data) when the input
	// ended inside a value.
	off int
	// ctx is encoding/json's description of where the bad byte is
	// ("after object key"). At the end of input it is what a space there
	// would have earned, "" when a space would have been fine.
	ctx string
	// notUTF8 is set when a string scanned held invalid UTF-8, which is
	// not a syntax error (encoding/json makes it U+FFFD).
	notUTF8 bool
	// deepest is the deepest nesting of arrays and objects scanned.
	deepest int
}

func (s *scanner) fail(i int, ctx string) int {
	s.off, s.ctx = i, ctx
	return -1
}

// atEOF reports whether the recorded syntax error is the end of input.
func (s *scanner) atEOF() bool { return s.off >= len(s.data) }

// decoderMessage is the FieldError message json.Decoder's error earned
// in the old ParseEnvelope.
func (s *scanner) decoderMessage() string {
	if s.atEOF() {
		return "envelope is not valid JSON: unexpected EOF"
	}
	return fmt.Sprintf("envelope is not valid JSON at byte %d: invalid character %s %s", s.off+1, quoteChar(s.data[s.off]), s.ctx)
}

// unmarshalMessage is the text of json.Unmarshal's syntax error.
func (s *scanner) unmarshalMessage() string {
	switch {
	case !s.atEOF():
		return "invalid character " + quoteChar(s.data[s.off]) + " " + s.ctx
	case s.ctx != "":
		return "invalid character ' ' " + s.ctx
	}
	return "unexpected end of JSON input"
}

// quoteChar formats c as encoding/json's syntax errors do.
func quoteChar(c byte) string {
	switch c {
	case '\'':
		return `'\''`
	case '"':
		return `'"'`
	}
	q := strconv.Quote(string(rune(c)))
	return "'" + q[1:len(q)-1] + "'"
}

// value validates the JSON value starting at data[i] (not whitespace),
// nested in depth open arrays and objects.
func (s *scanner) value(i, depth int) int {
	data := s.data
	// open holds one entry per array or object opened here: true for an
	// object.
	var buf [32]bool
	open := buf[:0]
	for {
		// A value starts at data[i].
		if i >= len(data) {
			return s.fail(i, "")
		}
		switch c := data[i]; c {
		case '"':
			if i = s.str(i); i < 0 {
				return -1
			}
		case '{', '[':
			if depth+len(open)+1 > maxNestingDepth {
				return s.fail(i, "exceeded max depth")
			}
			open = append(open, c == '{')
			s.deepest = max(s.deepest, depth+len(open))
			i = skipSpace(data, i+1)
			if i < len(data) && data[i] == c+2 { // '}' or ']'
				open = open[:len(open)-1]
				i++
				break
			}
			if c == '{' {
				if i = s.key(i); i < 0 {
					return -1
				}
			}
			continue
		case 't':
			i = s.literal(i, "true")
		case 'f':
			i = s.literal(i, "false")
		case 'n':
			i = s.literal(i, "null")
		default:
			if c != '-' && (c < '0' || c > '9') {
				return s.fail(i, "looking for beginning of value")
			}
			i = s.number(i)
		}
		if i < 0 {
			return -1
		}
		// A value ended before data[i]: close what it ends.
		for {
			if len(open) == 0 {
				return i
			}
			i = skipSpace(data, i)
			if i >= len(data) {
				return s.fail(i, "")
			}
			obj := open[len(open)-1]
			c := data[i]
			if c == ',' {
				i = skipSpace(data, i+1)
				if obj {
					if i = s.key(i); i < 0 {
						return -1
					}
				}
				break
			}
			switch {
			case obj && c == '}', !obj && c == ']':
				open = open[:len(open)-1]
				i++
			case obj:
				return s.fail(i, "after object key:value pair")
			default:
				return s.fail(i, "after array element")
			}
		}
	}
}

// key validates an object key and its colon starting at data[i], and
// returns where the value starts.
func (s *scanner) key(i int) int {
	data := s.data
	if i >= len(data) {
		return s.fail(i, "")
	}
	if data[i] != '"' {
		return s.fail(i, "looking for beginning of object key string")
	}
	if i = s.str(i); i < 0 {
		return -1
	}
	return s.colon(i)
}

// colon validates the colon after an object key ending before data[i],
// and returns where the value starts.
func (s *scanner) colon(i int) int {
	data := s.data
	i = skipSpace(data, i)
	if i >= len(data) {
		return s.fail(i, "")
	}
	if data[i] != ':' {
		return s.fail(i, "after object key")
	}
	return skipSpace(data, i+1)
}

// str validates the string whose opening quote is data[i], and sets
// s.notUTF8 when it holds invalid UTF-8.
func (s *scanner) str(i int) int {
	data := s.data
	i++
	for {
		i = plainEnd(data, i)
		if i >= len(data) {
			return s.fail(i, "")
		}
		switch c := data[i]; c {
		case '"':
			return i + 1
		case '\\':
			i++
			if i >= len(data) {
				return s.fail(i, "in string escape code")
			}
			switch data[i] {
			case 'b', 'f', 'n', 'r', 't', '\\', '/', '"':
				i++
			case 'u':
				i++
				for range 4 {
					if i >= len(data) {
						return s.fail(i, `in \u hexadecimal character escape`)
					}
					if unhex(data[i]) < 0 {
						return s.fail(i, `in \u hexadecimal character escape`)
					}
					i++
				}
			default:
				return s.fail(i, "in string escape code")
			}
		default:
			if c < utf8.RuneSelf {
				return s.fail(i, "in string literal")
			}
			r, size := utf8.DecodeRune(data[i:])
			if r == utf8.RuneError && size == 1 {
				s.notUTF8 = true
			}
			i += size
		}
	}
}

// number validates the number starting at data[i]. It ends at the first
// byte that cannot continue it, which the caller judges.
func (s *scanner) number(i int) int {
	data := s.data
	if data[i] == '-' {
		i++
		if i >= len(data) {
			return s.fail(i, "in numeric literal")
		}
		if c := data[i]; c < '0' || c > '9' {
			return s.fail(i, "in numeric literal")
		}
	}
	if data[i] == '0' {
		i++
	} else {
		i = digits(data, i+1)
	}
	if i < len(data) && data[i] == '.' {
		i++
		if i >= len(data) {
			return s.fail(i, "after decimal point in numeric literal")
		}
		if c := data[i]; c < '0' || c > '9' {
			return s.fail(i, "after decimal point in numeric literal")
		}
		i = digits(data, i+1)
	}
	if i < len(data) && (data[i] == 'e' || data[i] == 'E') {
		i++
		if i < len(data) && (data[i] == '+' || data[i] == '-') {
			i++
		}
		if i >= len(data) {
			return s.fail(i, "in exponent of numeric literal")
		}
		if c := data[i]; c < '0' || c > '9' {
			return s.fail(i, "in exponent of numeric literal")
		}
		i = digits(data, i+1)
	}
	return i
}

func digits(data []byte, i int) int {
	for i < len(data) && data[i] >= '0' && data[i] <= '9' {
		i++
	}
	return i
}

// literal validates the literal lit (true, false or null) at data[i].
func (s *scanner) literal(i int, lit string) int {
	data := s.data
	for k := 1; k < len(lit); k++ {
		j := i + k
		if j >= len(data) || data[j] != lit[k] {
			return s.fail(j, "in literal "+lit+" (expecting "+quoteChar(lit[k])+")")
		}
	}
	return i + len(lit)
}

func unhex(c byte) rune {
	switch {
	case '0' <= c && c <= '9':
		return rune(c - '0')
	case 'a' <= c && c <= 'f':
		return rune(c - 'a' + 10)
	case 'A' <= c && c <= 'F':
		return rune(c - 'A' + 10)
	}
	return -1
}

// splitFrame is SplitFrame. An array is validated whole, as json.Unmarshal
// validated it, so that a frame is refused or split exactly as before.
func splitFrame(frame []byte) ([]json.RawMessage, error) {
	i := skipSpace(frame, 0)
	if i < len(frame) && frame[i] == '[' {
		s := scanner{data: frame}
		envs, ok := s.array(i)
		if !ok {
			return nil, &FieldError{Code: CodeInvalidJSON, Message: "frame is not a valid JSON array of envelopes: " + s.unmarshalMessage()}
		}
		return envs, nil
	}
	if i == len(frame) || frame[i] != '{' {
		return nil, &FieldError{Code: CodeInvalidJSON, Message: "frame must be an envelope object or an array of envelopes"}
	}
	return []json.RawMessage{frame}, nil
}

// array splits the top-level array starting at data[i] into its elements,
// and reports false after a syntax error.
func (s *scanner) array(i int) ([]json.RawMessage, bool) {
	data := s.data
	envs := make([]json.RawMessage, 0, 16)
	i = skipSpace(data, i+1)
	if i < len(data) && data[i] == ']' {
		i++
	} else {
		for {
			end := s.value(i, 1)
			if end < 0 {
				return nil, false
			}
			envs = append(envs, data[i:end:end])
			i = skipSpace(data, end)
			if i >= len(data) {
				s.fail(i, "")
				return nil, false
			}
			if data[i] == ']' {
				i++
				break
			}
			if data[i] != ',' {
				s.fail(i, "after array element")
				return nil, false
			}
			i = skipSpace(data, i+1)
		}
	}
	if i = skipSpace(data, i); i < len(data) {
		s.fail(i, "after top-level value")
		return nil, false
	}
	return envs, true
}

// The envelope's fields.
const (
	fieldUnknown = iota
	fieldSchemaVersion
	fieldEventID
	fieldType
	fieldTS
	fieldSessionID
	fieldDeviceID
	fieldTraceParent
	fieldTraceState
	fieldDeliverAt
	fieldSeq
	fieldPayload
)

var fieldNames = [...]string{
	fieldSchemaVersion: "schema_version",
	fieldEventID:       "event_id",
	fieldType:          "type",
	fieldTS:            "ts",
	fieldSessionID:     "session_id",
	fieldDeviceID:      "device_id",
	fieldTraceParent:   "traceparent",
	fieldTraceState:    "tracestate",
	fieldDeliverAt:     "deliver_at",
	fieldSeq:           "seq",
	fieldPayload:       "payload",
}

// lookupField returns the field an (unescaped) key names: the field of
// that exact name, else one whose name equals the key under Unicode case
// folding ("Event_ID", "ſeq"), as encoding/json matches struct fields.
func lookupField(key []byte) int {
	switch string(key) {
	case "schema_version":
		return fieldSchemaVersion
	case "event_id":
		return fieldEventID
	case "type":
		return fieldType
	case "ts":
		return fieldTS
	case "session_id":
		return fieldSessionID
	case "device_id":
		return fieldDeviceID
	case "traceparent":
		return fieldTraceParent
	case "tracestate":
		return fieldTraceState
	case "deliver_at":
		return fieldDeliverAt
	case "seq":
		return fieldSeq
	case "payload":
		return fieldPayload
	}
	for f := fieldSchemaVersion; f < len(fieldNames); f++ {
		if bytes.EqualFold(key, []byte(fieldNames[f])) {
			return f
		}
	}
	return fieldUnknown
}

// decodeEnvelope decodes data into env, which must be zero. It returns
// the error the old json.Decoder-based ParseEnvelope returned, and leaves
// env as that left it.
func decodeEnvelope(data []byte, env *Envelope) *FieldError {
	s := scanner{data: data}
	i := skipSpace(data, 0)
	if i == len(data) {
		return &FieldError{Code: CodeInvalidJSON, Message: "envelope is empty"}
	}
	var fe *FieldError
	if data[i] == '{' {
		i, fe = s.envelope(i, env)
	} else {
		i, fe = s.notObject(i)
	}
	if i < 0 {
		*env = Envelope{}
		return &FieldError{Code: CodeInvalidJSON, Message: s.decoderMessage()}
	}
	if fe != nil {
		return fe
	}
	// json.Decoder.More reports no more data at the end and before ']'
	// or '}'.
	if i = skipSpace(data, i); i < len(data) && data[i] != ']' && data[i] != '}' {
		return &FieldError{Code: CodeInvalidJSON, Message: "envelope: unexpected data after the JSON object"}
	}
	return nil
}

// notObject validates a top-level value that is not an object. null
// decodes to the zero envelope; anything else is the wrong type.
func (s *scanner) notObject(i int) (int, *FieldError) {
	c := s.data[i]
	end := s.value(i, 0)
	if end < 0 || c == 'n' {
		return end, nil
	}
	return end, &FieldError{Code: CodeInvalidJSON, Message: "envelope must be a JSON object, not " + kindOf(c)}
}

// payloadTooDeep is the refusal of a payload nested depth levels deep.
func payloadTooDeep(depth int) *FieldError {
	return &FieldError{Field: "payload", Code: CodeInvalidField,
		Message: fmt.Sprintf("payload: arrays and objects nested %d deep, at most %d", depth, MaxPayloadDepth)}
}

// kindOf names the kind of JSON value that starts with c as encoding/json's
// type errors do.
func kindOf(c byte) string {
	switch c {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "bool"
	case 'n':
		return "null"
	}
	return "number"
}

// envelope decodes the object starting at data[i] into env. It returns the
// index after the object, or -1 after a syntax error, and the first type
// or unknown-field error.
func (s *scanner) envelope(i int, env *Envelope) (int, *FieldError) {
	data := s.data
	var fe *FieldError
	var keyBuf []byte
	// strs holds the string fields' values until the end, to make them
	// strings at once.
	var strs [fieldDeliverAt + 1][]byte
	// seen has bit f set once field f was given.
	var seen uint32
	idTwice := false
	i = skipSpace(data, i+1)
	if i < len(data) && data[i] == '}' {
		return i + 1, nil
	}
	for {
		// The key.
		if i >= len(data) {
			return s.fail(i, ""), nil
		}
		if data[i] != '"' {
			return s.fail(i, "looking for beginning of object key string"), nil
		}
		start := i + 1
		j := plainEnd(data, start)
		var key []byte
		if j < len(data) && data[j] == '"' {
			key, i = data[start:j], j+1
		} else {
			if i = s.str(i); i < 0 {
				return -1, nil
			}
			keyBuf, _ = appendUnquote(keyBuf[:0], data[start:i-1])
			key = keyBuf
		}
		if i = s.colon(i); i < 0 {
			return -1, nil
		}
		if i >= len(data) {
			return s.fail(i, ""), nil
		}

		// The value, starting at data[i].
		f := lookupField(key)
		if f != fieldUnknown {
			if seen&(1<<f) != 0 {
				idTwice = idTwice || f == fieldEventID
				if fe == nil {
					fe = &FieldError{Field: fieldNames[f], Code: CodeInvalidField, Message: fieldNames[f] + ": given more than once"}
				}
			}
			seen |= 1 << f
		}
		c := data[i]
		switch f {
		case fieldEventID, fieldType, fieldTS, fieldSessionID, fieldDeviceID, fieldTraceParent, fieldTraceState, fieldDeliverAt:
			if c == '"' {
				var ok bool
				if strs[f], i, ok = s.textValue(i); !ok && i >= 0 {
					strs[f] = nil
					if fe == nil {
						fe = notText(fieldNames[f])
					}
				}
				break
			}
			if i = s.value(i, 1); c != 'n' && fe == nil {
				fe = typeError(fieldNames[f], "a string", kindOf(c))
			}
		case fieldSchemaVersion, fieldSeq:
			if f == fieldSeq {
				if c == 'n' {
					env.Seq = nil
				} else if env.Seq == nil {
					// encoding/json allocates before it looks at the value.
					env.Seq = new(int64)
				}
			}
			start := i
			if i = s.value(i, 1); i < 0 || c == 'n' {
				break
			}
			if c != '-' && (c < '0' || c > '9') {
				if fe == nil {
					fe = typeError(fieldNames[f], "an integer", kindOf(c))
				}
				break
			}
			n, ok := parseInt(data[start:i])
			if f == fieldSchemaVersion && ok && int64(int(n)) != n {
				ok = false
			}
			switch {
			case !ok:
				if fe == nil {
					fe = typeError(fieldNames[f], "an integer", "number "+string(data[start:i]))
				}
			case f == fieldSeq:
				*env.Seq = n
			default:
				env.SchemaVersion = int(n)
			}
		case fieldPayload:
			start := i
			s.notUTF8, s.deepest = false, 1
			if i = s.value(i, 1); i >= 0 {
				env.Payload = data[start:i:i]
				// Outside its strings valid JSON is ASCII.
				if fe == nil && s.notUTF8 {
					fe = &FieldError{Field: "payload", Code: CodeInvalidField, Message: "payload: not valid UTF-8"}
				}
				if fe == nil && s.deepest-1 > MaxPayloadDepth {
					fe = payloadTooDeep(s.deepest - 1)
				}
			}
		default:
			if fe == nil {
				fe = unknownField(key)
			}
			i = s.value(i, 1)
		}
		if i < 0 {
			return -1, nil
		}

		// A comma and the next key, or the end of the object.
		i = skipSpace(data, i)
		if i >= len(data) {
			return s.fail(i, ""), nil
		}
		switch data[i] {
		case ',':
			i = skipSpace(data, i+1)
		case '}':
			if idTwice {
				strs[fieldEventID] = nil // which one would a NACK name?
			}
			setStrings(env, &strs)
			return i + 1, fe
		default:
			return s.fail(i, "after object key:value pair"), nil
		}
	}
}

// stringValue returns the value of the string whose opening quote is
// data[i], and the index after it.
func (s *scanner) stringValue(i int) ([]byte, int) {
	v, i, _ := s.textValue(i)
	return v, i
}

// textValue is stringValue that also reports false when the string is not
// valid UTF-8 text: invalid UTF-8, or a \u escape of a lone surrogate.
func (s *scanner) textValue(i int) ([]byte, int, bool) {
	data := s.data
	start := i + 1
	j := plainEnd(data, start)
	if j < len(data) && data[j] == '"' {
		return data[start:j], j + 1, true
	}
	if i = s.str(i); i < 0 {
		return nil, -1, true
	}
	v, ok := appendUnquote(nil, data[start:i-1])
	return v, i, ok
}

// notText is the refusal of a string field that is not valid UTF-8 text,
// which encoding/json would have rewritten.
func notText(field string) *FieldError {
	return &FieldError{Field: field, Code: CodeInvalidField,
		Message: field + ": not valid UTF-8 text (an invalid byte sequence or an unpaired \\u surrogate escape)"}
}

// setStrings sets env's string fields to strs, in one allocation.
func setStrings(env *Envelope, strs *[fieldDeliverAt + 1][]byte) {
	n := 0
	for _, b := range strs {
		n += len(b)
	}
	if n == 0 {
		return
	}
	var sb strings.Builder
	sb.Grow(n)
	for _, b := range strs {
		sb.Write(b)
	}
	all := sb.String()
	for f, dst := range [...]*string{fieldEventID: &env.EventID, fieldType: &env.Type, fieldTS: &env.TS, fieldSessionID: &env.SessionID, fieldDeviceID: &env.DeviceID,
		fieldTraceParent: &env.TraceParent, fieldTraceState: &env.TraceState, fieldDeliverAt: &env.DeliverAt} {
		if dst != nil {
			*dst, all = all[:len(strs[f])], all[len(strs[f]):]
		}
	}
}

func typeError(field, want, got string) *FieldError {
	return &FieldError{Field: field, Code: CodeInvalidField, Message: field + ": must be " + want + ", not " + got}
}

// unknownField is the error for an unknown key, naming it as the old code
// did: quoted as Go quotes strings, without the quotes.
func unknownField(key []byte) *FieldError {
	q := strconv.Quote(string(key))
	f := q[1 : len(q)-1]
	return &FieldError{Field: f, Code: CodeUnknownField, Message: f + ": unknown field"}
}

// parseInt parses a valid JSON number as an int64, and reports false for a
// fraction, an exponent or an overflow, as strconv.ParseInt would.
func parseInt(lit []byte) (int64, bool) {
	neg := lit[0] == '-'
	d := lit
	if neg {
		d = lit[1:]
	}
	if len(d) > 18 { // may overflow: leave it to strconv
		n, err := strconv.ParseInt(string(lit), 10, 64)
		return n, err == nil
	}
	var n int64
	for _, c := range d {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	return n, true
}

// appendUnquote appends the contents of a valid JSON string, quotes
// removed, unescaped as encoding/json unescapes them: invalid UTF-8 and
// lone surrogates become U+FFFD. It reports false when it replaced
// anything so.
func appendUnquote(dst, s []byte) ([]byte, bool) {
	ok := true
	for r := 0; r < len(s); {
		c := s[r]
		switch {
		case c == '\\':
			switch s[r+1] {
			case 'b':
				dst = append(dst, '\b')
			case 'f':
				dst = append(dst, '\f')
			case 'n':
				dst = append(dst, '\n')
			case 'r':
				dst = append(dst, '\r')
			case 't':
				dst = append(dst, '\t')
			case 'u':
				rr := getu4(s[r:])
				r += 6
				if utf16.IsSurrogate(rr) {
					if dec := utf16.DecodeRune(rr, getu4(s[r:])); dec != unicode.ReplacementChar {
						r += 6
						dst = utf8.AppendRune(dst, dec)
						continue
					}
					rr, ok = unicode.ReplacementChar, false
				}
				dst = utf8.AppendRune(dst, rr)
				continue
			default: // '"', '\\', '/'
				dst = append(dst, s[r+1])
			}
			r += 2
		case c < utf8.RuneSelf:
			dst = append(dst, c)
			r++
		default:
			rr, size := utf8.DecodeRune(s[r:])
			if rr == utf8.RuneError && size == 1 {
				ok = false
			}
			dst = utf8.AppendRune(dst, rr)
			r += size
		}
	}
	return dst, ok
}

// getu4 decodes \uXXXX at the start of s, or returns -1.
func getu4(s []byte) rune {
	if len(s) < 6 || s[0] != '\\' || s[1] != 'u' {
		return -1
	}
	var r rune
	for _, c := range s[2:6] {
		h := unhex(c)
		if h < 0 {
			return -1
		}
		r = r<<4 | h
	}
	return r
}

// AppendCompact appends src, a valid JSON value such as the Payload of a
// decoded Envelope, to dst without its insignificant whitespace: the bytes
// json.Compact would write. When src has no such whitespace (what most
// producers send), AppendCompact(nil, src) returns src itself, without
// copying it. AppendCompact does not validate src.
func AppendCompact(dst, src []byte) []byte {
	i := 0
	for i < len(src) {
		c := src[i]
		if c == '"' {
			i = skipString(src, i)
			continue
		}
		if byteClass[c]&space != 0 {
			break
		}
		i++
	}
	if i == len(src) {
		if dst == nil {
			return src
		}
		return append(dst, src...)
	}
	dst = append(dst, src[:i]...)
	for i < len(src) {
		c := src[i]
		switch {
		case c == '"':
			end := skipString(src, i)
			dst = append(dst, src[i:end]...)
			i = end
		case byteClass[c]&space != 0:
			i++
		default:
			dst = append(dst, c)
			i++
		}
	}
	return dst
}

// skipString returns the index after the valid string starting at src[i],
// or len(src) if it does not end.
func skipString(src []byte, i int) int {
	for i++; ; i++ {
		if i = stringEnd(src, i); i >= len(src) {
			return len(src)
		}
		switch src[i] {
		case '"':
			return i + 1
		case '\\':
			i++
		}
	}
}
