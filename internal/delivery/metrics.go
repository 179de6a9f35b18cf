package delivery

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are delivery's Prometheus metrics. A nil *Metrics records
// nothing.
type Metrics struct {
	events  *prometheus.CounterVec
	items   *prometheus.CounterVec
	leases  prometheus.Counter
	settles *prometheus.CounterVec
}

// NewMetrics registers delivery's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postbox_subscription_events_total",
			Help: "Stream events a subscription read and committed past.",
		}, []string{"subscription"}),
		items: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postbox_subscription_items_total",
			Help: "Inbox items a subscription materialised (events that matched).",
		}, []string{"subscription"}),
		leases: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "postbox_inbox_leased_total",
			Help: "Inbox items handed to runtimes by lease (each lease is an attempt).",
		}),
		settles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postbox_inbox_settled_total",
			Help: "Inbox items acked (completed) or nacked (pending), by result.",
		}, []string{"state"}),
	}
	reg.MustRegister(m.events, m.items, m.leases, m.settles)
	return m
}

func (m *Metrics) materialised(sub string, events, items int) {
	if m == nil {
		return
	}
	m.events.WithLabelValues(sub).Add(float64(events))
	m.items.WithLabelValues(sub).Add(float64(items))
}

func (m *Metrics) leased(n int) {
	if m == nil {
		return
	}
	m.leases.Add(float64(n))
}

func (m *Metrics) settled(state string, n int) {
	if m == nil {
		return
	}
	m.settles.WithLabelValues(state).Add(float64(n))
}

// LagCollector returns a collector of every subscription's lag, read at
// each scrape (one lookup per subscription).
func (d *Delivery) LagCollector() prometheus.Collector { return lagCollector{d} }

var lagDesc = prometheus.NewDesc("postbox_subscription_lag_events",
	"Events of its stream a subscription has not consumed yet.", []string{"subscription", "stream"}, nil)

type lagCollector struct{ d *Delivery }

func (c lagCollector) Describe(ch chan<- *prometheus.Desc) { ch <- lagDesc }

func (c lagCollector) Collect(ch chan<- prometheus.Metric) {
	ctx := context.Background()
	subs, err := c.d.Subscriptions(ctx)
	if err != nil {
		return
	}
	for _, s := range subs {
		if lag, err := c.d.b.Lag(ctx, s.Name); err == nil {
			ch <- prometheus.MustNewConstMetric(lagDesc, prometheus.GaugeValue, float64(lag.Events), s.Name, lag.StreamID)
		}
	}
}
