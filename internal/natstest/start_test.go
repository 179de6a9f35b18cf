package natstest

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// A port taken by someone else fails the start at once and says so, so
// that StartServer and StartCluster can try other ports.
func TestStartOnTakenPort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	s := &Server{t: t, opts: server.Options{
		ServerName: "taken",
		Host:       "127.0.0.1",
		Port:       l.Addr().(*net.TCPAddr).Port,
		JetStream:  true,
		StoreDir:   t.TempDir(),
		NoLog:      true,
		NoSigs:     true,
	}}
	begun := time.Now()
	err = s.start()
	if !errors.Is(err, errListen) {
		t.Fatalf("start on a taken port: %v, want errListen", err)
	}
	if waited := time.Since(begun); waited > 10*time.Second {
		t.Errorf("start took %s to give up on a taken port", waited)
	}
	t.Log(err)
}
