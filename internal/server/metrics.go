package server

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/postbox-events/postbox/internal/appendq"
)

// registries are the server's two Prometheus registries, with the
// writer's collectors: New makes them first, and every part it builds
// after (ingress, delivery, the connection limit, the sources' runner)
// registers its own collectors in them.
type registries struct {
	reg   *prometheus.Registry // every collector: GET /metrics
	stats *prometheus.Registry // the counters GET /v1/stats samples, also in reg

	batch, commit, syncs prometheus.Histogram
	failures, retries    prometheus.Counter
	health               *storeHealth
	log                  *slog.Logger
}

// newRegistries registers the Go runtime's and the process's collectors,
// the writer's group commits (postbox_writer_*) and the store's health
// (postbox_store_writable); the sampler's registry gets the commit times.
func newRegistries(health *storeHealth, log *slog.Logger) *registries {
	m := &registries{reg: prometheus.NewRegistry(), stats: prometheus.NewRegistry(), health: health, log: log}
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.batch = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "postbox_writer_batch_events",
		Help:    "Events written per group commit.",
		Buckets: prometheus.ExponentialBuckets(1, 4, 8),
	})
	m.commit = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "postbox_writer_commit_seconds",
		Help:    "Time to write and commit one group commit.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 12),
	})
	m.failures = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "postbox_writer_failures_total",
		Help: "Group commits that failed; their events were NACKed as retryable.",
	})
	m.retries = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "postbox_writer_retries_total",
		Help: "Group commits tried again after failing for a transient reason (an I/O error); one that fails five times is counted in postbox_writer_failures_total.",
	})
	m.syncs = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "postbox_writer_sync_seconds",
		Help:    "Time to make group commits durable: one sync of the SQLite write-ahead log, covering every commit since the last.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 12),
	})
	m.reg.MustRegister(m.batch, m.commit, m.failures)
	m.stats.MustRegister(m.commit)
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "postbox_store_writable",
		Help: "1 while the store commits; 0 from a failed group commit until a probe write commits again.",
	}, func() float64 {
		if err, _ := health.failure(); err != nil {
			return 0
		}
		return 1
	}))
	return m
}

// observeCommit counts a group commit of n events; a failed one marks the
// store unwritable.
func (m *registries) observeCommit(n int, took time.Duration, err error) {
	m.batch.Observe(float64(n))
	m.commit.Observe(took.Seconds())
	if err != nil {
		m.failures.Inc()
		m.health.fail(err)
		m.log.Error("writer: group commit failed; its events are NACKed as retryable", "events", n, "err", err)
	}
}

// writer returns the writer of cfg.Streams, observed: the backend's own
// when it is a Writer, its commits (and its syncs, postbox_writer_sync_seconds,
// when it reports them) counted; else an appendq.Queue with cfg's bounds
// that reports its commits.
func (m *registries) writer(cfg Config) Writer {
	writer, native := cfg.Streams.(Writer)
	if !native {
		return appendq.New(cfg.Streams, appendq.Config{MaxBatch: cfg.MaxBatch, QueueSize: cfg.QueueSize,
			QueueBytes: cfg.QueueBytes, Observe: m.observeCommit})
	}
	if o, ok := writer.(observer); ok {
		o.Observe(m.observeCommit)
	}
	if o, ok := writer.(retryObserver); ok {
		m.reg.MustRegister(m.retries)
		o.ObserveRetry(func(events, attempt int, wait time.Duration, err error) {
			m.retries.Inc()
			m.log.Warn("writer: group commit failed for a transient reason; trying it again",
				"events", events, "attempt", attempt, "after", wait, "err", err)
		})
	}
	if o, ok := writer.(syncObserver); ok {
		m.reg.MustRegister(m.syncs)
		o.ObserveSync(func(commits int, took time.Duration, err error) {
			m.syncs.Observe(took.Seconds())
			if err != nil {
				m.failures.Inc()
				m.health.fail(err)
				m.log.Error("writer: sync of the write-ahead log failed; the events of its commits are NACKed as retryable",
					"commits", commits, "err", err)
			}
		})
	}
	return writer
}

// registerQueue registers the gauges of writer's queue
// (postbox_writer_queue_*).
func (m *registries) registerQueue(writer Writer) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "postbox_writer_queue_depth",
		Help: "Events waiting for the writer.",
	}, func() float64 { return float64(writer.QueueLen()) }))
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "postbox_writer_queue_bytes",
		Help: "Payload and metadata bytes of the events waiting for the writer.",
	}, func() float64 { return float64(writer.QueueBytes()) }))
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "postbox_writer_queue_capacity",
		Help: "Bound of the writer queue (QUEUE_MAXSIZE).",
	}, func() float64 { return float64(writer.QueueCap()) }))
}
