// Package kafkatest runs in-process Kafka clusters for tests, on franz-go's
// kfake broker: no Kafka installed, real listeners on loopback ports, so a
// subprocess (the postbox binary) can reach them too. A cluster stops when
// the test ends; a test can stop it and start it again on the same ports
// and the same data directory, to check what an outage does.
package kafkatest

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Cluster is one in-process Kafka cluster.
type Cluster struct {
	t     testing.TB
	dir   string
	ports []int
	conns conns
	*kfake.Cluster
}

// Start starts a cluster of brokers (at least 1) on free loopback ports,
// persisting to a directory under t.TempDir(), with the topics given
// created with one partition each, and closes it when the test ends.
func Start(t testing.TB, brokers int, topics ...string) *Cluster {
	t.Helper()
	c := &Cluster{t: t, dir: t.TempDir()}
	opts := []kfake.Opt{kfake.NumBrokers(max(brokers, 1)), kfake.DataDir(c.dir), kfake.ListenFn(c.conns.listen)}
	if len(topics) > 0 {
		opts = append(opts, kfake.SeedTopics(1, topics...))
	}
	kc, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatalf("kafkatest: start a cluster: %v", err)
	}
	c.Cluster = kc
	for _, a := range kc.ListenAddrs() {
		var port int
		if _, err := fmt.Sscanf(a[strings.LastIndexByte(a, ':')+1:], "%d", &port); err != nil {
			kc.Close()
			t.Fatalf("kafkatest: listen address %s: %v", a, err)
		}
		c.ports = append(c.ports, port)
	}
	t.Cleanup(func() { c.Cluster.Close() })
	return c
}

// Brokers returns the cluster's host:port addresses.
func (c *Cluster) Brokers() []string {
	addrs := make([]string, len(c.ports))
	for i, p := range c.ports {
		addrs[i] = fmt.Sprintf("127.0.0.1:%d", p)
	}
	return addrs
}

// URL returns kafka://host:port[,host:port...], without a query.
func (c *Cluster) URL() string { return "kafka://" + strings.Join(c.Brokers(), ",") }

// Stop closes every broker: clients see connections refused until
// Restart. The data is kept.
func (c *Cluster) Stop() { c.Cluster.Close() }

// Restart starts the cluster again on the same ports with the data it
// had when it stopped.
func (c *Cluster) Restart() {
	c.t.Helper()
	kc, err := kfake.NewCluster(kfake.NumBrokers(len(c.ports)), kfake.Ports(c.ports...), kfake.DataDir(c.dir), kfake.ListenFn(c.conns.listen))
	if err != nil {
		c.t.Fatalf("kafkatest: restart the cluster: %v", err)
	}
	c.Cluster = kc
}

// CreateTopic creates a topic with partitions (at least 1) and configs
// (nil for none), failing the test if it cannot.
func (c *Cluster) CreateTopic(topic string, partitions int32, configs map[string]string) {
	c.t.Helper()
	if err := c.Cluster.CreateTopic(topic, max(partitions, 1), configs); err != nil {
		c.t.Fatalf("kafkatest: create topic %s: %v", topic, err)
	}
}

// Read returns the first n records of topic, from the start of every
// partition, failing the test if they are not there within a minute.
func (c *Cluster) Read(topic string, n int) []*kgo.Record {
	c.t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		c.t.Fatalf("kafkatest: consumer: %v", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var recs []*kgo.Record
	for len(recs) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			c.t.Fatalf("kafkatest: read %d records of %s, want %d", len(recs), topic, n)
		}
		fs.EachError(func(t string, p int32, err error) { c.t.Logf("kafkatest: fetch %s/%d: %v", t, p, err) })
		recs = append(recs, fs.Records()...)
	}
	return recs
}

// Count returns how many records topic holds now, summed over its
// partitions.
func (c *Cluster) Count(topic string) int64 {
	c.t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers()...))
	if err != nil {
		c.t.Fatalf("kafkatest: client: %v", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var n int64
	for _, end := range listOffsets(ctx, c.t, cl, topic) {
		n += end
	}
	return n
}

// RemoveBroker takes broker node (0 to brokers-1) out of the cluster, as
// if it stopped: its listener and every connection to it close, and the
// partitions it led get new leaders among the others. The data stays
// with the cluster. (kfake's RemoveNode alone leaves open connections
// served by the removed broker, which answers NOT_LEADER for ever.)
func (c *Cluster) RemoveBroker(node int32) {
	c.t.Helper()
	if err := c.Cluster.RemoveNode(node); err != nil {
		c.t.Fatalf("kafkatest: remove broker %d: %v", node, err)
	}
	c.conns.closePort(c.ports[node])
}

// AddBroker brings broker node back on the port it had, after
// RemoveBroker; partitions get new leaders across the brokers.
func (c *Cluster) AddBroker(node int32) {
	c.t.Helper()
	if _, _, err := c.Cluster.AddNode(node, c.ports[node]); err != nil {
		c.t.Fatalf("kafkatest: add broker %d on port %d: %v", node, c.ports[node], err)
	}
}

// conns tracks the connections the brokers accepted, by the port they
// listen on, so that RemoveBroker can close them.
type conns struct {
	mu     sync.Mutex
	byPort map[int]map[net.Conn]bool
}

// listen is kfake's ListenFn: a TCP listener whose connections are
// tracked.
func (cs *conns) listen(network, address string) (net.Listener, error) {
	ln, err := net.Listen(network, address)
	if err != nil {
		return nil, err
	}
	return &trackedListener{Listener: ln, cs: cs, port: ln.Addr().(*net.TCPAddr).Port}, nil
}

func (cs *conns) closePort(port int) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for conn := range cs.byPort[port] {
		conn.Close()
	}
	delete(cs.byPort, port)
}

type trackedListener struct {
	net.Listener
	cs   *conns
	port int
}

func (l *trackedListener) Accept() (net.Conn, error) {
	conn, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.cs.mu.Lock()
	if l.cs.byPort == nil {
		l.cs.byPort = map[int]map[net.Conn]bool{}
	}
	if l.cs.byPort[l.port] == nil {
		l.cs.byPort[l.port] = map[net.Conn]bool{}
	}
	l.cs.byPort[l.port][conn] = true
	l.cs.mu.Unlock()
	return &trackedConn{Conn: conn, l: l}, nil
}

type trackedConn struct {
	net.Conn
	l *trackedListener
}

func (c *trackedConn) Close() error {
	c.l.cs.mu.Lock()
	delete(c.l.cs.byPort[c.l.port], c.Conn)
	c.l.cs.mu.Unlock()
	return c.Conn.Close()
}
