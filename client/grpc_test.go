package client_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/client"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/servertest"
)

// TestGRPCS: with a certificate the gRPC ingress speaks TLS: a client that
// trusts it gets ACKs over grpcs://, one that does not, or that speaks
// plain grpc://, does not get through.
func TestGRPCS(t *testing.T) {
	certPath, keyPath, cert := servertest.SelfSignedCert(t, t.TempDir())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	servertest.Start(t, server.Config{TLSCert: certPath, TLSKey: keyPath, GRPCListener: ln}, nil)
	addr := ln.Addr().String()
	roots := x509.NewCertPool()
	roots.AddCert(cert)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	c, err := client.Dial(ctx, "grpcs://"+addr, client.Options{TLSConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}})
	if err != nil {
		t.Fatalf("dial grpcs: %v", err)
	}
	defer c.Close()
	rs, err := c.Send(ctx, []client.Message{message(t, "tls-1", true), message(t, "tls-2", true)})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if !r.OK() {
			t.Errorf("over grpcs: %+v, want an ACK", r)
		}
	}

	for _, url := range []string{"grpcs://" + addr, "grpc://" + addr} { // untrusted; plain text
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if c, err := client.Dial(dctx, url, client.Options{}); err == nil {
			c.Close()
			t.Errorf("%s without trusting the certificate: dialled", url)
		}
		cancel()
	}
}

// TestGRPCServerShutdown: a server that stops with a gRPC connection open
// ends it as a shutdown (the client's Send then fails with ErrClosed),
// promptly, after answering what it had.
func TestGRPCServerShutdown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := servertest.Start(t, server.Config{GRPCListener: ln}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, "grpc://"+ln.Addr().String(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if rs, err := c.Send(ctx, []client.Message{message(t, "shut-1", true)}); err != nil || !rs[0].OK() {
		t.Fatalf("Send: %v %+v", err, rs)
	}
	stopped := time.Now()
	s.Stop()
	if d := time.Since(stopped); d >= server.ShutdownTimeout {
		t.Errorf("the server took %v to stop, its whole shutdown timeout: the gRPC connection was not drained", d)
	}
	_, err = c.Send(ctx, []client.Message{message(t, "shut-2", true)})
	var refused *client.APIError
	if !errors.Is(err, client.ErrClosed) || !errors.As(err, &refused) || refused.Code != api.CodeUnavailable {
		t.Errorf("Send after the server stopped: %v, want ErrClosed by the code unavailable", err)
	}
}
