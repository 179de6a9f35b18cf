package agent

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/postbox-events/postbox/internal/relaymetrics"
	"github.com/postbox-events/postbox/outbox/outboxsqlite"
)

// metrics are the agent's Prometheus collectors, served on the intake's
// /metrics: its intake, and its outbox and relay (relaymetrics).
type metrics struct {
	reg    *prometheus.Registry
	intake *prometheus.CounterVec
	relay  *relaymetrics.Metrics
}

func newMetrics(store *outboxsqlite.Store) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		intake: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postbox_agent_intake_events_total",
			Help: "Events handed to the agent's intake, by result (queued, duplicate, conflict, rejected, invalid).",
		}, []string{"result"}),
	}
	m.reg.MustRegister(m.intake)
	m.relay = relaymetrics.Register(m.reg, store)
	return m
}
