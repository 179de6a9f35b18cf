package feed

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the followers' Prometheus metrics, labelled by follower
// name. A nil *Metrics records nothing.
type Metrics struct {
	stored     *prometheus.CounterVec
	errors     *prometheus.CounterVec
	checkpoint *prometheus.GaugeVec
	lag        *prometheus.GaugeVec
}

// NewMetrics creates the metrics and registers them on reg (when not nil).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		stored: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postbox_feed_events_total",
			Help: "Events a feed follower read, by source and result (stored, duplicate; refused: over the limits every intake stores events under, not stored).",
		}, []string{"source", "result"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postbox_feed_errors_total",
			Help: "Feed follower failures, by source and reason (token, connect, status, read, idle, decode, append, checkpoint; refused: an event the local stream would not store).",
		}, []string{"source", "reason"}),
		checkpoint: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "postbox_feed_checkpoint_offset",
			Help: "The last remote offset a feed follower stored.",
		}, []string{"source"}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "postbox_feed_lag_events",
			Help: "Events the remote stream held, when last heard of (its high watermark), after a feed follower's checkpoint.",
		}, []string{"source"}),
	}
	if reg != nil {
		reg.MustRegister(m.stored, m.errors, m.checkpoint, m.lag)
	}
	return m
}

// start makes the source's event series exist from its follower's start
// (a rule on their rate sees a 0).
func (m *Metrics) start(source string) {
	if m != nil {
		for _, result := range []string{"stored", "duplicate", "refused"} {
			m.stored.WithLabelValues(source, result)
		}
	}
}

func (m *Metrics) fail(source, reason string) {
	if m != nil {
		m.errors.WithLabelValues(source, reason).Inc()
	}
}

func (m *Metrics) events(source string, stored, dups int) {
	if m != nil {
		m.stored.WithLabelValues(source, "stored").Add(float64(stored))
		m.stored.WithLabelValues(source, "duplicate").Add(float64(dups))
	}
}

func (m *Metrics) refused(source string) {
	if m != nil {
		m.stored.WithLabelValues(source, "refused").Inc()
	}
}

func (m *Metrics) position(source string, checkpoint, lag int64) {
	if m != nil {
		m.checkpoint.WithLabelValues(source).Set(float64(checkpoint))
		m.lag.WithLabelValues(source).Set(float64(lag))
	}
}
