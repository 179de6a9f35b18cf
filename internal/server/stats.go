package server

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// The operator's numbers over the last minutes (GET /v1/stats,
// docs/API.md#stats): a sampler reads the server's own Prometheus counters
// every StatsInterval and keeps the last statsKeep samples in memory, so
// that the console draws its charts without a Prometheus and without a
// query that grows with the events stored.

// DefaultStatsInterval is how often the sampler behind GET /v1/stats
// takes a sample when Config.StatsInterval is zero.
const DefaultStatsInterval = 5 * time.Second

// statsKeep is how many samples GET /v1/stats answers: ten minutes at
// the default interval.
const statsKeep = 120

// statsMaxLag bounds the subscriptions whose lag a sample records, so
// that a sample costs the same however many there are.
const statsMaxLag = 100

// statsSample is one point of GET /v1/stats: rates over the interval
// that ends at At, and gauges read at At.
type statsSample struct {
	At              time.Time        `json:"at"`
	Seconds         float64          `json:"seconds"`           // length of the interval
	IngestRate      float64          `json:"ingest_rate"`       // events stored per second (WebSocket, gRPC, webhooks, feeds)
	RefusedRate     float64          `json:"refused_rate"`      // events refused per second (rejected, conflict, throttled, unavailable, unauthorized)
	QueueDepth      int              `json:"queue_depth"`       // events waiting for the writer
	QueueCapacity   int              `json:"queue_capacity"`    // the writer queue's bound
	CommitRate      float64          `json:"commit_rate"`       // group commits per second
	CommitLatencyMS float64          `json:"commit_latency_ms"` // mean time of a group commit over the interval; 0 without one
	DeliveryRate    float64          `json:"delivery_rate"`     // items completed per second
	FailureRate     float64          `json:"failure_rate"`      // attempts that failed per second (retried or dead-lettered)
	DeadLetterRate  float64          `json:"dead_letter_rate"`  // items dead-lettered per second
	Lag             map[string]int64 `json:"lag"`               // events each subscription has not consumed, at At
}

// statsCounters are the cumulative counters a sample is the difference of.
type statsCounters struct {
	at                                  time.Time
	stored, refused                     float64
	commits, commitSeconds              float64
	completed, retried, failed, settled float64
}

// statsSampler keeps the samples of GET /v1/stats.
type statsSampler struct {
	gather   prometheus.Gatherer // only the collectors it reads
	queue    func() (depth, capacity int)
	lag      func(ctx context.Context) map[string]int64
	interval time.Duration

	started time.Time // the counters count from here

	mu      sync.Mutex
	running bool
	last    statsCounters // at the last sample
	samples []statsSample // oldest first, at most statsKeep
}

// Run takes a sample every interval until ctx ends.
func (st *statsSampler) Run(ctx context.Context) error {
	c := st.read()
	st.mu.Lock()
	st.running, st.last = true, c
	st.mu.Unlock()
	t := time.NewTicker(st.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		c := st.read()
		lag := st.lag(ctx)
		st.mu.Lock()
		s := st.between(st.last, c)
		s.Lag = lag
		st.last = c
		st.samples = append(st.samples, s)
		if len(st.samples) > statsKeep {
			st.samples = append(st.samples[:0], st.samples[len(st.samples)-statsKeep:]...)
		}
		st.mu.Unlock()
	}
}

// read reads the counters now.
func (st *statsSampler) read() statsCounters {
	c := statsCounters{at: time.Now().UTC()}
	families, _ := st.gather.Gather() // a family that fails to gather is left out: its rates read 0
	for _, f := range families {
		for _, m := range f.GetMetric() {
			switch f.GetName() {
			case "postbox_ingress_events_total":
				switch label(m, "result") {
				case "stored":
					c.stored += m.GetCounter().GetValue()
				case "duplicate":
				default:
					c.refused += m.GetCounter().GetValue()
				}
			case "postbox_writer_commit_seconds":
				c.commits += float64(m.GetHistogram().GetSampleCount())
				c.commitSeconds += m.GetHistogram().GetSampleSum()
			case "postbox_inbox_settled_total":
				v := m.GetCounter().GetValue()
				c.settled += v
				switch label(m, "state") {
				case "completed":
					c.completed += v
				case "pending":
					c.retried += v
				case "failed":
					c.failed += v
				}
			}
		}
	}
	return c
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// between is the sample of the interval from a to b.
func (st *statsSampler) between(a, b statsCounters) statsSample {
	secs := b.at.Sub(a.at).Seconds()
	s := statsSample{At: b.at, Seconds: secs}
	s.QueueDepth, s.QueueCapacity = st.queue()
	if secs <= 0 {
		return s
	}
	rate := func(x, y float64) float64 { return max(y-x, 0) / secs }
	s.IngestRate = rate(a.stored, b.stored)
	s.RefusedRate = rate(a.refused, b.refused)
	s.CommitRate = rate(a.commits, b.commits)
	if n := b.commits - a.commits; n > 0 {
		s.CommitLatencyMS = (b.commitSeconds - a.commitSeconds) / n * 1000
	}
	s.DeliveryRate = rate(a.completed, b.completed)
	s.FailureRate = rate(a.retried+a.failed, b.retried+b.failed)
	s.DeadLetterRate = rate(a.failed, b.failed)
	return s
}

// statsJSON is the answer of GET /v1/stats.
type statsJSON struct {
	Interval string        `json:"interval"`
	Since    time.Time     `json:"since"` // when the server started: the totals count from there
	Samples  []statsSample `json:"samples"`
	Totals   struct {
		Stored       float64 `json:"stored"`
		Refused      float64 `json:"refused"`
		Commits      float64 `json:"commits"`
		Completed    float64 `json:"completed"`
		Failed       float64 `json:"failed_attempts"`
		DeadLettered float64 `json:"dead_lettered"`
	} `json:"totals"`
}

// snapshot is the stored samples and, when the last is over a second old,
// one more from it to now, so that a page opened between two samples
// shows the present.
func (st *statsSampler) snapshot(ctx context.Context) statsJSON {
	out := statsJSON{Interval: st.interval.String(), Samples: []statsSample{}}
	out.Since = st.started
	st.mu.Lock()
	running, last := st.running, st.last
	out.Samples = append(out.Samples, st.samples...)
	st.mu.Unlock()
	now := st.read()
	if running && now.at.Sub(last.at) >= time.Second {
		s := st.between(last, now)
		s.Lag = st.lag(ctx)
		out.Samples = append(out.Samples, s)
	}
	out.Totals.Stored = now.stored
	out.Totals.Refused = now.refused
	out.Totals.Commits = now.commits
	out.Totals.Completed = now.completed
	out.Totals.Failed = now.retried + now.failed
	out.Totals.DeadLettered = now.failed
	return out
}

// subscriptionLags is the lag of the first statsMaxLag subscriptions by
// name; one whose lag cannot be read is left out.
func (s *Server) subscriptionLags(ctx context.Context) map[string]int64 {
	out := map[string]int64{}
	subs, err := s.subs.Subscriptions(ctx)
	if err != nil {
		return out
	}
	for i, sub := range subs {
		if i == statsMaxLag {
			break
		}
		if lag, err := s.subs.Lag(ctx, sub.Name); err == nil {
			out[sub.Name] = lag.Events
		}
	}
	return out
}

func (s *Server) getStats(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.stats.snapshot(r.Context()))
}

// teeRegisterer registers each collector with the server's registry and
// with the sampler's, which gathers only the counters it reads (the
// server's registry also holds collectors that query the store).
type teeRegisterer struct {
	prometheus.Registerer
	also prometheus.Registerer
}

func (t teeRegisterer) Register(c prometheus.Collector) error {
	if err := t.Registerer.Register(c); err != nil {
		return err
	}
	return t.also.Register(c)
}

func (t teeRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := t.Register(c); err != nil {
			panic(err)
		}
	}
}

func (t teeRegisterer) Unregister(c prometheus.Collector) bool {
	t.also.Unregister(c)
	return t.Registerer.Unregister(c)
}
