package poll

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the pollers' Prometheus metrics, labelled by source. A nil
// *Metrics records nothing.
type Metrics struct {
	pages     *prometheus.CounterVec
	items     *prometheus.CounterVec
	errors    *prometheus.CounterVec
	saturated *prometheus.CounterVec
	same      *prometheus.CounterVec
	paused    *prometheus.GaugeVec
}

// NewMetrics creates the metrics and registers them on reg (when not nil).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		pages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postbox_poll_pages_total",
			Help: "Pages a poller read and stored, with their checkpoint.",
		}, []string{"source"}),
		items: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postbox_poll_items_total",
			Help: "Items of the pages a poller stored, by result (stored, duplicate: already stored; conflict: its id is stored with another type or body, which stays; refused: over the limits every intake stores events under, not stored).",
		}, []string{"source", "result"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postbox_poll_errors_total",
			Help: "Poller failures, by reason (request, status, throttled: 429 or 503, too_large: an answer over the page limit, decode, header, store); the page is asked for again.",
		}, []string{"source", "reason"}),
		same: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postbox_poll_unchanged_total",
			Help: "Answers that were the page stored last at their cursor, byte for byte: not decoded again.",
		}, []string{"source"}),
		saturated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postbox_poll_saturated_seconds_total",
			Help: "Seconds a poller waited because the writer's queue had no room for a page.",
		}, []string{"source"}),
		paused: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "postbox_poll_saturated",
			Help: "1 while a poller waits for room in the writer's queue.",
		}, []string{"source"}),
	}
	if reg != nil {
		reg.MustRegister(m.pages, m.items, m.errors, m.same, m.saturated, m.paused)
	}
	return m
}

// start makes the source's series exist from its first poll (a rule on
// pages that never grew sees a 0).
func (m *Metrics) start(source string) {
	if m != nil {
		m.pages.WithLabelValues(source)
		for _, result := range []string{"stored", "duplicate", "conflict", "refused"} {
			m.items.WithLabelValues(source, result)
		}
		m.same.WithLabelValues(source)
		m.saturated.WithLabelValues(source)
		m.paused.WithLabelValues(source).Set(0)
	}
}

func (m *Metrics) fail(source, reason string) {
	if m != nil {
		m.errors.WithLabelValues(source, reason).Inc()
	}
}

func (m *Metrics) page(source string, stored, dups, conflicts, refused int) {
	if m != nil {
		m.pages.WithLabelValues(source).Inc()
		m.items.WithLabelValues(source, "stored").Add(float64(stored))
		m.items.WithLabelValues(source, "duplicate").Add(float64(dups))
		m.items.WithLabelValues(source, "conflict").Add(float64(conflicts))
		m.items.WithLabelValues(source, "refused").Add(float64(refused))
	}
}

func (m *Metrics) unchanged(source string) {
	if m != nil {
		m.same.WithLabelValues(source).Inc()
	}
}

func (m *Metrics) saturation(source string, on bool, waited float64) {
	if m != nil {
		v := 0.0
		if on {
			v = 1
		}
		m.paused.WithLabelValues(source).Set(v)
		if waited > 0 {
			m.saturated.WithLabelValues(source).Add(waited)
		}
	}
}
