package feed

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Events, Errors and Lag read one series of the metrics, for tests.
func (m *Metrics) Events(source, result string) float64 {
	return value(m.stored.WithLabelValues(source, result))
}

func (m *Metrics) Errors(source, reason string) float64 {
	return value(m.errors.WithLabelValues(source, reason))
}

func (m *Metrics) Lag(source string) float64 { return value(m.lag.WithLabelValues(source)) }

func value(c prometheus.Metric) float64 {
	var d dto.Metric
	if err := c.Write(&d); err != nil {
		panic(err)
	}
	if d.Counter != nil {
		return d.Counter.GetValue()
	}
	return d.Gauge.GetValue()
}

// ResolveToken is resolveToken, for tests.
var ResolveToken = resolveToken
