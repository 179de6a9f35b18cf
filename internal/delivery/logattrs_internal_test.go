package delivery

import (
	"errors"
	"reflect"
	"testing"
	"time"
)

func TestSetAttrs(t *testing.T) {
	var nilErr error
	var nilPtr *time.Time
	type state string
	at := time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC)
	got := setAttrs("err", nilErr, "ptr", nilPtr, "target", "", "since", time.Time{}, "types", []string{}, "was", state(""),
		"meta", map[string]string{}, "pending", 0, "shared", false, "inbox", "a", "at", at, "state", state("open"),
		"cause", errors.New("boom"), "types2", []string{"t"})
	want := []any{"pending", 0, "shared", false, "inbox", "a", "at", at, "state", state("open"),
		"cause", errors.New("boom"), "types2", []string{"t"}}
	if len(got) != len(want) {
		t.Fatalf("setAttrs: %v, want %v", got, want)
	}
	for i := range want {
		if e, ok := want[i].(error); ok {
			if g, ok := got[i].(error); !ok || g.Error() != e.Error() {
				t.Errorf("pair %d: %v, want %v", i/2, got[i], want[i])
			}
			continue
		}
		if !reflect.DeepEqual(got[i], want[i]) {
			t.Errorf("pair %d: %v, want %v", i/2, got[i], want[i])
		}
	}
}
