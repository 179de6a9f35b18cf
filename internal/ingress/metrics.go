package ingress

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the ingress's Prometheus collectors.
type Metrics struct {
	events      *prometheus.CounterVec
	connections prometheus.Gauge
	frames      prometheus.Counter
	refused     prometheus.Counter
	replaced    prometheus.Counter
	buffered    prometheus.Gauge
	saturated   prometheus.Gauge
	waited      prometheus.Counter
	limited     *prometheus.CounterVec
	limitWait   prometheus.Counter
}

// NewMetrics creates the ingress collectors and registers them with reg
// (when not nil).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postbox_ingress_events_total",
			Help: "Events answered by the ingress and the webhook intake, by source and result (stored, duplicate, conflict, rejected, unavailable; webhooks also throttled, unauthorized).",
		}, []string{"source", "result"}),
		connections: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "postbox_ingress_connections",
			Help: "Open ingress connections (WebSockets and gRPC streams).",
		}),
		frames: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "postbox_ingress_frames_total",
			Help: "Frames read by the ingress (WebSocket messages and gRPC frames).",
		}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "postbox_ingress_connections_refused_total",
			Help: "Ingress connections (WebSockets and gRPC streams) refused at the connection limit, or at the limit of one address.",
		}),
		replaced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "postbox_ingress_connections_replaced_total",
			Help: "Ingress connections (WebSockets and gRPC streams) closed because their device opened a new one.",
		}),
		buffered: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "postbox_ingress_buffered_bytes",
			Help: "Bytes of frames being read and of envelopes read but not yet committed (bounded by the buffer limit).",
		}),
		saturated: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "postbox_ingress_saturated",
			Help: "Ingress connections (WebSockets and gRPC streams) waiting now for room in the writer's queue, which is full.",
		}),
		waited: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "postbox_ingress_saturated_seconds_total",
			Help: "Seconds ingress connections waited for room in the writer's full queue, summed over the connections.",
		}),
		limited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postbox_ingress_rate_limited_total",
			Help: "Requests and events held to an intake rate limit, by source and limit: webhooks answered 429 over their source's rate_limit (limit=source), device events that waited for their token's budget (limit=token).",
		}, []string{"source", "limit"}),
		limitWait: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "postbox_ingress_rate_limited_seconds_total",
			Help: "Seconds ingress connections waited for their device token's rate limit (--token-rate-limit), summed over the connections.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.events, m.connections, m.frames, m.refused, m.replaced, m.buffered, m.saturated, m.waited, m.limited, m.limitWait)
	}
	return m
}

// Results of postbox_ingress_events_total: those of every source, and
// those only webhooks have.
var (
	results        = []string{"stored", "duplicate", "conflict", "rejected", "unavailable"}
	webhookResults = []string{"throttled", "unauthorized"}
)

// Source makes the series of source exist at 0, when it is created or
// found at the start: a rule on their rate() or absent() sees no gap
// before its first event. webhook adds the results only webhooks have.
func (m *Metrics) Source(source string, webhook bool) {
	if m == nil {
		return
	}
	for _, r := range results {
		m.events.WithLabelValues(source, r)
	}
	if webhook {
		for _, r := range webhookResults {
			m.events.WithLabelValues(source, r)
		}
	}
}

// Forget removes the series of source, once deleted.
func (m *Metrics) Forget(source string) {
	if m != nil {
		m.events.DeletePartialMatch(prometheus.Labels{"source": source})
		m.limited.DeletePartialMatch(prometheus.Labels{"source": source})
	}
}

// Count adds n to the events of source with result (stored, duplicate,
// conflict, rejected, unavailable), for intakes other than the ingress.
func (m *Metrics) Count(source, result string, n int) {
	m.events.WithLabelValues(source, result).Add(float64(n))
}

// Limited counts n requests or events of source held to an intake rate
// limit (limit: "source" or "token").
func (m *Metrics) Limited(source, limit string, n int) {
	m.limited.WithLabelValues(source, limit).Add(float64(n))
}
