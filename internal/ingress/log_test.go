package ingress_test

import (
	"fmt"
	"testing"

	"github.com/postbox-events/postbox/internal/ingress"
	"github.com/postbox-events/postbox/internal/testenv"
)

// TestEventLogs: the ingress logs each event it stores, each duplicate
// and each conflict with the event's identity (source, device, event id;
// the offset when stored), as JSON lines, at most 10 lines of each message
// a second.
func TestEventLogs(t *testing.T) {
	var log testenv.JSONLog
	in := newIngress(t, sqliteStore(t), ingress.Config{Logger: log.Logger()})
	_, dial := transports[0].serve(t, in)
	c := dialOK(t, dial, "")
	send(t, c, frame(env("e-1", "pi-7", "t", `{"n":1}`)))
	replies(t, c, 1)
	send(t, c, frame(env("e-1", "pi-7", "t", `{"n":1}`), env("e-1", "pi-7", "t", `{"n":2}`)))
	replies(t, c, 2)
	envs := make([]string, 30)
	for i := range envs {
		envs[i] = env(fmt.Sprintf("many-%d", i), "pi-8", "t", `{}`)
	}
	send(t, c, frame(envs...))
	replies(t, c, 30)

	byMsg := map[string][]map[string]any{}
	for _, l := range log.Lines(t, "") {
		byMsg[l["msg"].(string)] = append(byMsg[l["msg"].(string)], l)
	}
	want := map[string]map[string]any{
		"ingress: event stored":                                              {"level": "INFO", "source": "devices", "device": "pi-7", "event_id": "e-1", "type": "t", "offset": 1.0},
		"ingress: duplicate event ACKed, stored before":                      {"level": "INFO", "source": "devices", "device": "pi-7", "event_id": "e-1", "offset": 1.0},
		"ingress: event refused: stored before with another type or payload": {"level": "WARN", "source": "devices", "device": "pi-7", "event_id": "e-1"},
	}
	for msg, attrs := range want {
		ls := byMsg[msg]
		if len(ls) == 0 {
			t.Errorf("no line %q in %v", msg, byMsg)
			continue
		}
		for k, v := range attrs {
			if ls[0][k] != v {
				t.Errorf("%q: %s is %v, want %v (%v)", msg, k, ls[0][k], v, ls[0])
			}
		}
	}
	if n := len(byMsg["ingress: event stored"]); n > 10 {
		t.Errorf("%d lines of stored events within a second, want at most 10", n)
	}
}
