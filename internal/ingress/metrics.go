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
	}
	if reg != nil {
		reg.MustRegister(m.events, m.connections, m.frames, m.refused, m.replaced, m.buffered)
	}
	return m
}

// Count adds n to the events of source with result (stored, duplicate,
// conflict, rejected, unavailable), for intakes other than the ingress.
func (m *Metrics) Count(source, result string, n int) {
	m.events.WithLabelValues(source, result).Add(float64(n))
}
