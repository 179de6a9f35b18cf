package delivery

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultLeaseTTL is how long a lease of a shared store lasts unless it
// is renewed: a subscription's loop moves to another process within about
// this long after its process dies.
const DefaultLeaseTTL = 5 * time.Second

// notifyChannel is the channel processes of a shared store wake each other
// on. Payloads: "inbox:NAME" (the inbox has new items), "subs" (a
// subscription was created, deleted or changed) and "reset:NAME" (the
// subscription's position was moved).
const notifyChannel = "postbox_delivery"

// Names of leases: one per subscription's loop, one for the leader (it
// runs retention and reports the gauges of shared state), and one per
// live process, by which each knows how many share the work. Subscription
// names hold no ':'.
const (
	subLease    = "sub:"
	nodeLease   = "node:"
	leaderLease = "leader"
)

// cluster runs the subscriptions' loops of a shared store in one process
// at a time. Each process renews its leases every LeaseTTL/5, in the
// store and by the store's clock, and takes leases that ran out, up to its
// fair share of the subscriptions (their number over the live processes,
// rounded up); one that holds more than its share hands one back per
// round, so loops spread over the processes. A process that cannot renew
// stops its loops before its leases end. Should two loops of one
// subscription ever run at once, nothing is doubled: a batch is written
// only if the position is where its loop read it (see consume), and items
// are unique per subscription and event.
type cluster struct {
	d      *Delivery
	node   string // Config.Node
	holder string // node/<random>: this process, never a restarted one
	ttl    time.Duration
	wake   chan struct{} // capacity 1: claim now
	leader atomic.Bool
	up     atomic.Bool     // the last round reached the store
	owned  map[string]bool // subscriptions whose loop lease this process holds; d.mu guards it
	// renewed is when the last round that renewed this process's leases
	// was sent (monotonic); live is how many processes' node leases were
	// live then.
	renewed atomic.Pointer[time.Time]
	live    atomic.Int64
}

func newCluster(d *Delivery) *cluster {
	var b [4]byte
	rand.Read(b[:])
	return &cluster{d: d, node: d.cfg.Node, holder: d.cfg.Node + "/" + hex.EncodeToString(b[:]), ttl: d.cfg.LeaseTTL,
		wake: make(chan struct{}, 1), owned: map[string]bool{}}
}

// poke makes the next claim round start now.
func (c *cluster) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// run claims and renews leases until ctx ends.
func (c *cluster) run(ctx context.Context) {
	interval := c.ttl / 5
	t := time.NewTicker(interval)
	defer t.Stop()
	var renewed time.Time // when the last round that succeeded was sent
	failing := false
	for {
		sent := time.Now()
		err := c.claim(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err == nil:
			renewed = sent
			c.renewed.Store(&sent)
			c.up.Store(true)
			if failing {
				c.d.log.Info("delivery: the store answers again; leases renewed", "node", c.node)
			}
			failing = false
		default:
			c.up.Store(false)
			if !failing {
				c.d.log.Error("delivery: renewing leases failed; retrying", "node", c.node, "err", err)
			}
			failing = true
			// The leases were renewed until renewed+ttl at the latest: stop
			// the loops a round before, so that they end before another
			// process may take them.
			if time.Since(renewed) > c.ttl-interval {
				c.hold(nil, false)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.wake:
		}
	}
}

// claim runs one round: it renews this process's leases, takes those it
// may, hands back one beyond its share, and runs the loops it holds.
func (c *cluster) claim(ctx context.Context) error {
	d := c.d
	// A Delete or Reset here waits for the round, so that the round
	// starts no loop of a subscription deleted after it read them. (One
	// deleted on another node meanwhile ends at its start: see consume.)
	d.admin.Lock()
	defer d.admin.Unlock()
	subs, err := d.Subscriptions(ctx)
	if err != nil {
		return err
	}
	ttl := c.ttl.Seconds()
	var mine, others []string // leases this process holds; live ones others hold
	var live int
	err = d.update(ctx, func(tx conn) error {
		// This process's heartbeat, then every lease it holds.
		if _, err := tx.ExecContext(ctx, `INSERT INTO delivery_leases (name, holder, node, expires_at, acquired_at)
			VALUES (?1, ?2, ?3, clock_timestamp() + make_interval(secs => ?4), clock_timestamp()) ON CONFLICT (name) DO NOTHING`,
			nodeLease+c.holder, c.holder, c.node, ttl); err != nil {
			return err
		}
		rows, err := tx.QueryContext(ctx, `UPDATE delivery_leases SET expires_at = clock_timestamp() + make_interval(secs => ?2)
			WHERE holder = ?1 RETURNING name`, c.holder, ttl)
		if err != nil {
			return err
		}
		if mine, err = scanNames(rows); err != nil {
			return err
		}
		if rows, err = tx.QueryContext(ctx, `SELECT name FROM delivery_leases WHERE holder <> ? AND expires_at > clock_timestamp()`,
			c.holder); err != nil {
			return err
		}
		if others, err = scanNames(rows); err != nil {
			return err
		}
		return tx.QueryRowContext(ctx, `SELECT count(*) FROM delivery_leases WHERE name LIKE 'node:%' AND expires_at > clock_timestamp()`).Scan(&live)
	})
	if err != nil {
		return err
	}
	c.live.Store(int64(max(live, 1)))
	byName := make(map[string]Subscription, len(subs))
	for _, s := range subs {
		byName[s.Name] = s
	}
	var gone, want []string // leases of deleted subscriptions; leases to take
	held := 0
	for _, n := range mine {
		if name, ok := strings.CutPrefix(n, subLease); ok {
			if _, exists := byName[name]; !exists {
				gone = append(gone, n)
			} else {
				held++
			}
		}
	}
	share := (len(subs) + max(live, 1) - 1) / max(live, 1)
	if !slices.Contains(mine, leaderLease) && !slices.Contains(others, leaderLease) {
		want = append(want, leaderLease)
	}
	for _, s := range subs {
		if held >= share {
			break
		}
		if n := subLease + s.Name; !slices.Contains(mine, n) && !slices.Contains(others, n) {
			want = append(want, n)
			held++
		}
	}
	if len(want) > 0 {
		rows, err := d.db.QueryContext(ctx, `INSERT INTO delivery_leases (name, holder, node, expires_at, acquired_at)
			SELECT n, ?1, ?2, clock_timestamp() + make_interval(secs => ?3), clock_timestamp() FROM unnest(?4::text[]) AS n
			ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, node = excluded.node,
				expires_at = excluded.expires_at, acquired_at = excluded.acquired_at
			WHERE delivery_leases.expires_at < clock_timestamp() OR delivery_leases.holder = excluded.holder
			RETURNING name`, c.holder, c.node, ttl, want)
		if err != nil {
			return err
		}
		taken, err := scanNames(rows)
		if err != nil {
			return err
		}
		mine = append(mine, taken...)
	}
	leader := slices.Contains(mine, leaderLease)
	run := map[string]Subscription{}
	for _, n := range mine {
		if name, ok := strings.CutPrefix(n, subLease); ok {
			if s, exists := byName[name]; exists {
				run[name] = s
			}
		}
	}
	// One beyond the share goes back, its loop stopped first.
	if len(run) > share {
		extra := slices.Max(slices.Collect(maps.Keys(run)))
		delete(run, extra)
		gone = append(gone, subLease+extra)
	}
	c.hold(run, leader)
	if leader {
		gone = append(gone, "") // and the leader clears leases that ended long ago
	}
	if len(gone) > 0 {
		if _, err := d.db.ExecContext(ctx, `DELETE FROM delivery_leases WHERE (holder = ?1 AND name = ANY(?2::text[]))
			OR (?3 AND expires_at < clock_timestamp() - interval '1 minute')`, c.holder, gone, leader); err != nil {
			return err
		}
	}
	if leader { // and the slots of processes whose leases are gone
		if _, err := d.db.ExecContext(ctx, `DELETE FROM endpoint_slots e
			WHERE NOT EXISTS (SELECT 1 FROM delivery_leases l WHERE l.name = 'node:' || e.holder)`); err != nil {
			return err
		}
	}
	c.targets(subs)
	return nil
}

func scanNames(rows *sql.Rows) ([]string, error) {
	defer rows.Close()
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, err
		}
		names = append(names, n)
	}
	return names, rows.Err()
}

// holds reports whether this process's leases surely hold in the store
// (by its own clock): its last renewal was sent less than a TTL less a
// round ago, as run stops the loops. Its endpoints' concurrency slots
// hold as long (see limits.go).
func (c *cluster) holds() bool {
	r := c.renewed.Load()
	return r != nil && time.Since(*r) < c.ttl-c.ttl/5
}

// hold runs the loops of run here and stops the others.
func (c *cluster) hold(run map[string]Subscription, leader bool) {
	d := c.d
	c.leader.Store(leader)
	var stops []*loop
	d.mu.Lock()
	for name := range c.owned {
		if _, ok := run[name]; !ok {
			delete(c.owned, name)
			if l := d.loops[name]; l != nil {
				delete(d.loops, name)
				stops = append(stops, l)
			}
		}
	}
	var started []string
	for name, s := range run {
		c.owned[name] = true
		if l := d.loops[name]; l != nil && (l.ended() || l.uid != s.UID) { // it ended, or its subscription was made again
			delete(d.loops, name)
			stops = append(stops, l)
		}
		if d.loops[name] == nil {
			d.startLocked(s)
			if d.loops[name] != nil {
				started = append(started, name)
			}
		}
	}
	d.mu.Unlock()
	if len(started) > 0 {
		slices.Sort(started)
		d.log.Info("delivery: subscriptions' loops run on this node", "node", c.node, "subscriptions", started)
	}
	for _, l := range stops {
		l.cancel()
		<-l.done
	}
	for _, l := range stops {
		d.log.Info("delivery: subscription's loop handed on", "node", c.node, "subscription", l.name)
	}
}

// targets gives the inboxes the targets their subscriptions have now:
// another process may have set them.
func (c *cluster) targets(subs []Subscription) {
	d := c.d
	want := map[string]string{}
	for _, s := range subs {
		if s.Target != "" {
			want[s.Inbox] = s.Target
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for inbox, target := range want {
		d.setTargetLocked(inbox, target)
	}
	for inbox := range d.targets {
		if _, ok := want[inbox]; !ok {
			d.setTargetLocked(inbox, "")
		}
	}
}

// notified acts on a notification from a process of the store.
func (c *cluster) notified(payload string) {
	switch kind, name, _ := strings.Cut(payload, ":"); kind {
	case "inbox":
		c.d.inboxes.notify(name)
	case "subs", "": // "": the listener connected again after missing some
		c.poke()
	case "reset":
		// Stop the loop; the next round starts it at the new position.
		d := c.d
		d.mu.Lock()
		l := d.loops[name]
		if l != nil && !d.held[name] {
			delete(d.loops, name)
		} else {
			l = nil
		}
		d.mu.Unlock()
		if l != nil {
			go func() {
				l.cancel()
				<-l.done
				c.poke()
			}()
		}
	}
}

// release gives up every lease of this process, once its loops stopped.
func (c *cluster) release() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.d.db.ExecContext(ctx, `DELETE FROM endpoint_slots WHERE holder = ?`, c.holder); err != nil {
		c.d.log.Warn("delivery: giving back endpoints' concurrency slots failed; they come back with the lease's end", "node", c.node,
			"err", err, "within", c.ttl)
	}
	if _, err := c.d.db.ExecContext(ctx, `DELETE FROM delivery_leases WHERE holder = ?`, c.holder); err != nil {
		c.d.log.Warn("delivery: releasing leases failed; they end on their own", "node", c.node, "err", err, "within", c.ttl)
		return
	}
	c.d.log.Info("delivery: leases released", "node", c.node)
}

// notifyIn sends payload to every process of the shared store when tx
// commits.
func notifyIn(ctx context.Context, tx conn, payload string) error {
	_, err := tx.ExecContext(ctx, `SELECT pg_notify(?, ?)`, notifyChannel, payload)
	return err
}

// broadcast tells every process of a shared store about a change; nothing
// on SQLite. Those that miss it find out within a claim round.
func (d *Delivery) broadcast(ctx context.Context, payload string) {
	if d.shared == nil {
		return
	}
	if err := d.update(ctx, func(tx conn) error { return notifyIn(ctx, tx, payload) }); err != nil {
		d.log.Warn("delivery: notifying the other processes failed; they see the change within a second", "payload", payload, "err", err)
	}
}

// Node returns the name of this process (Config.Node).
func (d *Delivery) Node() string { return d.cfg.Node }

// runsHere reports whether the loop of subscription name runs in this
// process; always true without a shared store.
func (d *Delivery) runsHere(name string) bool {
	if d.cluster == nil {
		return true
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.loops[name] != nil
}

// leads reports whether this process reports the shared state and runs
// retention: the leader of a shared store, or the only process.
func (d *Delivery) leads() bool { return d.cluster == nil || d.cluster.leader.Load() }

// Leads reports whether this process runs the work one process of a
// shared store runs (retention, the sources that read upstream): the
// leader of a shared store, or the only process.
func (d *Delivery) Leads() bool { return d.leads() }

// NodeCollector returns a collector of which subscriptions' loops run in
// this process (postbox_subscription_loop_running, 1 each) and whether it
// leads (postbox_node_leader): summed over the processes of a shared
// store, each loop and the leader count once.
func (d *Delivery) NodeCollector() prometheus.Collector { return nodeCollector{d} }

var (
	loopRunningDesc = prometheus.NewDesc("postbox_subscription_loop_running",
		"1 for each subscription whose consumption loop runs in this process.", []string{"subscription"}, nil)
	leaderDesc = prometheus.NewDesc("postbox_node_leader",
		"1 when this process runs retention and reports the inbox gauges (the leader of a shared store, or the only process).", nil, nil)
	storeUpDesc = prometheus.NewDesc("postbox_node_store_up",
		"1 when this node's last round of leases reached the shared store; 0 while it cannot (its loops stop and it takes no items). Only with a shared store.", nil, nil)
)

type nodeCollector struct{ d *Delivery }

func (c nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- loopRunningDesc
	ch <- leaderDesc
	ch <- storeUpDesc
}

func (c nodeCollector) Collect(ch chan<- prometheus.Metric) {
	c.d.mu.Lock()
	names := make([]string, 0, len(c.d.loops))
	for name, l := range c.d.loops {
		if !l.ended() {
			names = append(names, name)
		}
	}
	c.d.mu.Unlock()
	for _, name := range names {
		ch <- prometheus.MustNewConstMetric(loopRunningDesc, prometheus.GaugeValue, 1, name)
	}
	leader := 0.0
	if c.d.leads() {
		leader = 1
	}
	ch <- prometheus.MustNewConstMetric(leaderDesc, prometheus.GaugeValue, leader)
	if c.d.cluster != nil {
		up := 0.0
		if c.d.cluster.up.Load() {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(storeUpDesc, prometheus.GaugeValue, up)
	}
}
