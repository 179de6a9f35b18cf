// Package natstest runs in-process NATS servers with JetStream for tests:
// one server, or a cluster of several on loopback, each with its own store
// under the test's temporary directory. Servers stop when the test ends;
// a test can stop one and start it again on the same store and port, to
// check what survives a restart or the loss of a cluster node.
package natstest

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
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

// attempts is how often StartServer and StartCluster try fresh ports when
// one they picked was taken before the server could listen on it.
const attempts = 5

// StartServer starts a JetStream server with opts and stops it when the
// test ends.
func StartServer(t testing.TB, opts Options) *Server {
	t.Helper()
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	if opts.Name == "" {
		opts.Name = "natstest"
	}
	var err error
	for range attempts {
		port := opts.Port
		if port == 0 {
			port = FreePort(t)
		}
		s := &Server{t: t, opts: server.Options{
			ServerName: opts.Name,
			Host:       "127.0.0.1",
			Port:       port,
			JetStream:  true,
			StoreDir:   opts.Dir,
			NoLog:      true,
			NoSigs:     true,
		}}
		if err = s.start(); err == nil {
			t.Cleanup(s.Shutdown)
			return s
		}
		if !errors.Is(err, errListen) || opts.Port != 0 {
			break
		}
	}
	t.Fatalf("natstest: %v", err)
	return nil
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
	if err := s.start(); err != nil {
		s.t.Fatalf("natstest: %v", err)
	}
}

// errListen marks a server that could not listen on one of its ports.
var errListen = errors.New("cannot listen")

// readyTimeout bounds how long a server may take to listen; a loaded test
// machine can take seconds to start a JetStream server.
const readyTimeout = 60 * time.Second

// start shuts the server down if it runs and starts it on its store and
// ports. It fails at once, wrapping errListen, when a port is taken.
func (s *Server) start() error {
	s.Shutdown()
	opts := s.opts // the server keeps and changes what it is given
	srv, err := server.NewServer(&opts)
	if err != nil {
		return fmt.Errorf("new server %s: %w", s.opts.ServerName, err)
	}
	log := &errorLog{}
	srv.SetLogger(log, false, false)
	go srv.Start()
	for deadline := time.Now().Add(readyTimeout); ; {
		if srv.ReadyForConnections(50 * time.Millisecond) {
			s.srv = srv
			return nil
		}
		if fatal := log.fatal(); fatal != "" {
			srv.Shutdown()
			return fmt.Errorf("server %s: %w: %s", s.opts.ServerName, errListen, fatal)
		}
		if time.Now().After(deadline) {
			srv.Shutdown()
			return fmt.Errorf("server %s not ready within %s; its errors: %s", s.opts.ServerName, readyTimeout, log.errors())
		}
	}
}

// errorLog keeps what a server logs as an error, so that a server that
// does not start can say why; everything else is dropped.
type errorLog struct {
	mu     sync.Mutex
	lines  []string
	fatals []string
}

func (l *errorLog) add(fatal bool, format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	line := fmt.Sprintf(format, v...)
	if fatal {
		l.fatals = append(l.fatals, line)
	}
	if len(l.lines) < 20 {
		l.lines = append(l.lines, line)
	}
}

func (l *errorLog) fatal() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.fatals, "; ")
}

func (l *errorLog) errors() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.lines) == 0 {
		return "none"
	}
	return strings.Join(l.lines, "; ")
}

func (l *errorLog) Noticef(string, ...any)         {}
func (l *errorLog) Debugf(string, ...any)          {}
func (l *errorLog) Tracef(string, ...any)          {}
func (l *errorLog) Warnf(format string, v ...any)  { l.add(false, format, v...) }
func (l *errorLog) Errorf(format string, v ...any) { l.add(false, format, v...) }
func (l *errorLog) Fatalf(format string, v ...any) { l.add(true, format, v...) }

// Cluster is a JetStream cluster of in-process servers on loopback.
type Cluster struct {
	Nodes []*Server
}

// StartCluster starts a JetStream cluster of n servers, routed to each
// other on loopback, each with its own store, and stops them when the
// test ends. It returns once the cluster has a JetStream meta leader.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	var err error
	for range attempts {
		var c *Cluster
		if c, err = startCluster(t, n); err == nil {
			c.WaitLeader(t)
			return c
		}
		if !errors.Is(err, errListen) {
			break
		}
	}
	t.Fatalf("natstest: %v", err)
	return nil
}

// startCluster starts n routed servers on fresh ports. On an error it
// shuts down the servers it started.
func startCluster(t testing.TB, n int) (*Cluster, error) {
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
		if err := s.start(); err != nil {
			for _, s := range c.Nodes {
				s.Shutdown()
			}
			return nil, err
		}
		t.Cleanup(s.Shutdown)
	}
	return c, nil
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
