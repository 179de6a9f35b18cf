// Package natstest runs in-process NATS servers with JetStream for tests:
// one server, or a cluster of several on loopback, each with its own store
// under the test's temporary directory. Servers stop when the test ends;
// a test can stop one and start it again on the same store and port, to
// check what survives a restart or the loss of a cluster node.
package natstest

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Server is one in-process NATS server with JetStream.
type Server struct {
	t    testing.TB
	opts server.Options
	srv  *server.Server
}

// Options configure StartServer. Zero fields take their defaults.
type Options struct {
	// Dir is the JetStream store. Defaults to a new t.TempDir().
	Dir string
	// Port is the client port. Defaults to a free port on loopback.
	Port int
	// Name is the server's name. Defaults to "natstest".
	Name string
}

// Start starts a JetStream server on a free loopback port with a store in
// t.TempDir(), stops it when the test ends, and returns its URL.
func Start(t testing.TB) string {
	t.Helper()
	return StartServer(t, Options{}).URL()
}

// StartServer starts a JetStream server with opts and stops it when the
// test ends.
func StartServer(t testing.TB, opts Options) *Server {
	t.Helper()
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	if opts.Port == 0 {
		opts.Port = FreePort(t)
	}
	if opts.Name == "" {
		opts.Name = "natstest"
	}
	s := &Server{t: t, opts: server.Options{
		ServerName: opts.Name,
		Host:       "127.0.0.1",
		Port:       opts.Port,
		JetStream:  true,
		StoreDir:   opts.Dir,
		NoLog:      true,
		NoSigs:     true,
	}}
	s.Restart()
	t.Cleanup(s.Shutdown)
	return s
}

// URL returns the server's client URL; it stays the same across restarts.
func (s *Server) URL() string {
	return fmt.Sprintf("nats://127.0.0.1:%d", s.opts.Port)
}

// Server returns the running server, or nil while it is shut down.
func (s *Server) Server() *server.Server { return s.srv }

// Shutdown stops the server and waits until it is down. Its store stays.
func (s *Server) Shutdown() {
	if s.srv == nil {
		return
	}
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
	s.srv = nil
}

// Restart starts the server again (or for the first time) on the same
// store and port. A running server is shut down first.
func (s *Server) Restart() {
	s.t.Helper()
	s.Shutdown()
	opts := s.opts // the server keeps and changes what it is given
	srv, err := server.NewServer(&opts)
	if err != nil {
		s.t.Fatalf("natstest: new server: %v", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(20 * time.Second) {
		srv.Shutdown()
		s.t.Fatalf("natstest: server %s not ready within 20s", s.opts.ServerName)
	}
	s.srv = srv
}

// Cluster is a JetStream cluster of in-process servers on loopback.
type Cluster struct {
	Nodes []*Server
}

// StartCluster starts a JetStream cluster of n servers, routed to each
// other on loopback, each with its own store, and stops them when the
// test ends. It returns once the cluster has a JetStream meta leader.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	name := fmt.Sprintf("natstest-%d", time.Now().UnixNano())
	routes := make([]string, n)
	clusterPorts := make([]int, n)
	for i := range n {
		clusterPorts[i] = FreePort(t)
		routes[i] = fmt.Sprintf("nats-route://127.0.0.1:%d", clusterPorts[i])
	}
	c := &Cluster{}
	for i := range n {
		s := &Server{t: t, opts: server.Options{
			ServerName: fmt.Sprintf("n%d", i+1),
			Host:       "127.0.0.1",
			Port:       FreePort(t),
			JetStream:  true,
			StoreDir:   t.TempDir(),
			NoLog:      true,
			NoSigs:     true,
			Cluster: server.ClusterOpts{
				Name: name,
				Host: "127.0.0.1",
				Port: clusterPorts[i],
			},
			Routes: server.RoutesFromStr(strings.Join(routes, ",")),
		}}
		c.Nodes = append(c.Nodes, s)
	}
	for _, s := range c.Nodes {
		s.Restart()
		t.Cleanup(s.Shutdown)
	}
	c.WaitLeader(t)
	return c
}

// URLs returns every node's client URL.
func (c *Cluster) URLs() []string {
	urls := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		urls[i] = s.URL()
	}
	return urls
}

// URL returns every node's client URL, comma-separated, as NATS clients
// take a server list.
func (c *Cluster) URL() string { return strings.Join(c.URLs(), ",") }

// WaitLeader waits until a running node is the JetStream meta leader and
// sees every running node as a peer.
func (c *Cluster) WaitLeader(t testing.TB) {
	t.Helper()
	running := 0
	for _, s := range c.Nodes {
		if s.srv != nil {
			running++
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for _, s := range c.Nodes {
			if s.srv != nil && s.srv.JetStreamIsLeader() && len(s.srv.JetStreamClusterPeers()) >= running {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("natstest: the cluster elected no JetStream meta leader within 30s")
}

// FreePort returns a TCP port that was free on loopback a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("natstest: free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
