package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

// The loggers of the commands leave out attributes that say nothing (a
// nil error, an empty string, a zero time, an empty list) and keep the
// rest, zero numbers and false included.
func TestLoggerDropsEmptyAttributes(t *testing.T) {
	for _, format := range []string{"pretty", "json"} {
		var buf bytes.Buffer
		log, err := newLogger(&buf, "info", format)
		if err != nil {
			t.Fatal(err)
		}
		var nilErr error
		var nilPtr *int
		log.Info("stopped", "err", nilErr, "target", "", "from", time.Time{}, "types", []string{}, "m", map[string]int{}, "p", nilPtr,
			"pending", 0, "ok", false, "name", "x", "failed", errors.New("boom"), "at", time.Unix(0, 0).UTC())
		out := buf.String()
		for _, gone := range []string{"err", "target", "from", "types", "m", "p"} {
			if strings.Contains(out, " "+gone+"=") || strings.Contains(out, `"`+gone+`":`) {
				t.Errorf("%s: %s is logged: %s", format, gone, out)
			}
		}
		for _, kept := range []string{"pending", "ok", "name", "failed", "at", "stopped"} {
			if !strings.Contains(out, kept) {
				t.Errorf("%s: %q is missing from %s", format, kept, out)
			}
		}
		if strings.Contains(out, "<nil>") || strings.Contains(out, "0001-01-01") || strings.Contains(out, `""`) {
			t.Errorf("%s: an empty value is logged: %s", format, out)
		}
	}
}
