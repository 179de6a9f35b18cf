package delivery

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// setCloudEvent makes a delivery a CloudEvent in binary mode (CloudEvents
// 1.0 HTTP binding) for an endpoint of FormatCloudEvents: ce-id is the
// id a CloudEvent webhook gave, else the event's id, ce-type its type, ce-time when it occurred, ce-source the
// source a CloudEvent webhook gave, else /sources/{stream} (for a device
// event /sources/{stream}/{device_id}, whose ids are unique per device),
// and the other attributes a CloudEvent webhook came with (subject,
// dataschema, extensions) as ce-* headers. The body is the payload, as
// for every delivery (content-type application/json).
func setCloudEvent(h http.Header, it *Item) {
	var meta struct {
		DeviceID string         `json:"device_id"`
		CE       map[string]any `json:"cloudevents"`
	}
	json.Unmarshal(it.Metadata, &meta)
	for name, v := range meta.CE {
		switch name {
		case "id", "source", "type", "specversion", "time", "datacontenttype", "traceparent", "tracestate":
			continue // set below, or the HTTP headers' own
		}
		if s := ceHeaderValue(v); s != "" && validAttributeName(name) {
			h.Set("ce-"+name, s)
		}
	}
	source, _ := meta.CE["source"].(string)
	if source == "" {
		source = "/sources/" + url.PathEscape(it.Stream)
		if meta.DeviceID != "" {
			source += "/" + url.PathEscape(meta.DeviceID)
		}
	}
	id, _ := meta.CE["id"].(string) // a CloudEvent webhook's own: its EventID is the key of its source and id
	if id == "" {
		id = it.EventID
	}
	h.Set("ce-specversion", "1.0")
	h.Set("ce-id", id)
	h.Set("ce-source", source)
	h.Set("ce-type", it.Type)
	h.Set("ce-time", it.OccurredAt.UTC().Format(time.RFC3339Nano))
	h.Set("Content-Type", "application/json")
}

// ceHeaderValue is an attribute's value as a header: strings
// percent-encode what a header may not hold (CloudEvents HTTP binding
// 3.1.3.2), numbers and booleans as JSON writes them.
func ceHeaderValue(v any) string {
	switch v := v.(type) {
	case string:
		var b strings.Builder
		for i := 0; i < len(v); i++ {
			c := v[i]
			if c < 0x20 || c > 0x7e || c == '"' || c == '%' {
				fmt.Fprintf(&b, "%%%02X", c)
			} else {
				b.WriteByte(c)
			}
		}
		return b.String()
	case float64, bool, json.Number:
		return fmt.Sprint(v)
	}
	return ""
}

// validAttributeName reports whether name is a CloudEvents attribute
// name: lower-case letters and digits, at most 20 (as the specification
// recommends).
func validAttributeName(name string) bool {
	if name == "" || len(name) > 20 {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9') {
			return false
		}
	}
	return true
}
