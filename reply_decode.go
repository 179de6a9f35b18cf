package postbox

import (
	"errors"
	"fmt"
	"strings"
)

// DecodeReplies decodes one reply frame: a Reply object or an array of
// them. It is the client's hot path, so it scans the frame once instead of
// going through reflection; unknown keys are skipped (a newer server may
// add some).
func DecodeReplies(frame []byte) ([]Reply, error) {
	s := scanner{data: frame}
	i := skipSpace(frame, 0)
	if i < len(frame) && frame[i] == '[' {
		elems, ok := s.array(i)
		if !ok {
			return nil, fmt.Errorf("reply frame is not valid JSON: %s", s.unmarshalMessage())
		}
		out := make([]Reply, len(elems))
		for k, e := range elems {
			if err := decodeReply(e, &out[k]); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	if end := s.value(i, 0); end < 0 || skipSpace(frame, end) != len(frame) {
		return nil, errors.New("reply frame is not valid JSON")
	}
	out := make([]Reply, 1)
	return out, decodeReply(frame[i:], &out[0])
}

// decodeReply decodes one reply object, already validated as JSON.
func decodeReply(data []byte, r *Reply) error {
	s := scanner{data: data}
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return errors.New("reply is not a JSON object")
	}
	i = skipSpace(data, i+1)
	for i < len(data) && data[i] != '}' {
		key, j := s.stringValue(i)
		if j < 0 {
			return errors.New("reply: bad key")
		}
		i = s.colon(j)
		if i < 0 || i >= len(data) {
			return errors.New("reply: bad value")
		}
		var str *string
		var flag *bool
		switch foldKey(key) {
		case "event_id":
			str = &r.EventID
		case "status":
			str = &r.Status
		case "ack_ts":
			str = &r.AckTS
		case "code":
			str = (*string)(&r.Code)
		case "field":
			str = &r.Field
		case "message":
			str = &r.Message
		case "duplicate":
			flag = &r.Duplicate
		case "retryable":
			flag = &r.Retryable
		}
		start := i
		c := data[i]
		switch {
		case str != nil && c == '"':
			var v []byte
			v, i = s.stringValue(i)
			*str = string(v)
		case flag != nil && (c == 't' || c == 'f'):
			*flag = c == 't'
			i = s.value(i, 1)
		case (str != nil || flag != nil) && c != 'n':
			return fmt.Errorf("reply: %s has the wrong type: %.20s", key, data[start:])
		default:
			i = s.value(i, 1)
		}
		if i < 0 {
			return errors.New("reply: bad value")
		}
		i = skipSpace(data, i)
		if i < len(data) && data[i] == ',' {
			i = skipSpace(data, i+1)
		}
	}
	return nil
}

var replyKeys = []string{"event_id", "status", "ack_ts", "code", "field", "message", "duplicate", "retryable"}

// foldKey returns the reply key that key names, matched without regard to
// case as encoding/json matches it; an exact match is the fast path.
func foldKey(key []byte) string {
	for _, k := range replyKeys {
		if string(key) == k {
			return k
		}
	}
	for _, k := range replyKeys {
		if strings.EqualFold(string(key), k) {
			return k
		}
	}
	return ""
}
