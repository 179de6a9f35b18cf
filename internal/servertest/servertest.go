// Package servertest runs a real postbox control plane in-process for
// tests: a loopback listener, a fresh SQLite database (or the stream
// backend the test gives), and a Stop that checks Run ended cleanly.
package servertest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/ingress"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/stream/streamsqlite"
)

// Server is a server.Server running for one test.
type Server struct {
	Srv    *server.Server
	DBPath string
	Addr   string // host:port
	Base   string // http(s)://host:port
	WS     string // ws(s)://host:port/v1/ws
	HTTP   *http.Client
	sqlite *streamsqlite.Backend
	stop   func()
}

// Store returns the SQLite file Start opened at DBPath (the server's
// streams and delivery state, or its delivery state alone beside the
// test's cfg.Streams), or nil when the test gave both Streams and Store.
// Its ReadDB reads the tables; the server runs its writer and closes it.
func (s *Server) Store() *streamsqlite.Backend { return s.sqlite }

// Start runs a server for cfg until the test ends (or Stop), and returns
// once /ready answers 200. A nil cfg.Streams means the SQLite default as
// postbox serve has it, at cfg.DBPath (a nil cfg.Store alone: the SQLite
// file holds delivery state); an empty cfg.DBPath means a new file under
// t.TempDir(), a nil cfg.Listener a new loopback port. hc (nil: a plain
// client, trusting cfg.TLSCert if set) is used for the readiness probe.
func Start(t testing.TB, cfg server.Config, hc *http.Client) *Server {
	t.Helper()
	if cfg.DBPath == "" {
		cfg.DBPath = filepath.Join(t.TempDir(), "postbox.db")
	}
	if cfg.Listener == nil {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		cfg.Listener = ln
	}
	if hc == nil {
		hc = &http.Client{}
		if cfg.TLSCert != "" {
			hc = trusting(t, cfg.TLSCert)
		}
	}
	var sqlite *streamsqlite.Backend
	if cfg.Streams == nil || cfg.Store == nil {
		db, err := server.OpenSQLite(cfg)
		if err != nil {
			cfg.Listener.Close()
			t.Fatal(err)
		}
		sqlite = db
		if cfg.Streams == nil {
			cfg.Streams = db
		}
		if cfg.Store == nil {
			cfg.Store = db
		}
	}
	srv, err := server.New(cfg)
	if err != nil {
		cfg.Listener.Close()
		if sqlite != nil {
			sqlite.Close()
		}
		t.Fatalf("server.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- srv.Run(ctx) }()
	var once sync.Once
	scheme := "http"
	if cfg.TLSCert != "" {
		scheme = "https"
	}
	s := &Server{Srv: srv, DBPath: cfg.DBPath, Addr: cfg.Listener.Addr().String(), HTTP: hc, sqlite: sqlite}
	s.Base = scheme + "://" + s.Addr
	s.WS = strings.Replace(s.Base, "http", "ws", 1) + ingress.WSPath
	s.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-errc:
				if err != nil {
					t.Errorf("server Run: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("server Run did not return 30s after its context ended")
			}
		})
	}
	t.Cleanup(s.stop)
	testenv.Eventually(t, 10*time.Second, "/ready to answer 200", func() bool {
		resp, err := hc.Get(s.Base + "/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return s
}

// Stop stops the server and waits for Run to return.
func (s *Server) Stop() { s.stop() }

// SelfSignedCert writes a certificate and key for 127.0.0.1 into dir and
// returns their paths and the certificate.
func SelfSignedCert(t testing.TB, dir string) (certPath, keyPath string, cert *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "postbox test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err = x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPath, keyPath = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certPath, keyPath, cert
}

// trusting returns an HTTP client that trusts the certificate in certPath.
func trusting(t testing.TB, certPath string) *http.Client {
	t.Helper()
	pemBytes, err := os.ReadFile(certPath)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pemBytes) {
		t.Fatalf("%s: no certificate", certPath)
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
}
