package kafkaopt_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/kafkaopt"
)

func TestBrokers(t *testing.T) {
	got, err := kafkaopt.Brokers("a,b:9093")
	if err != nil || !slices.Equal(got, []string{"a:9092", "b:9093"}) {
		t.Errorf("Brokers(a,b:9093) = %v, %v", got, err)
	}
	for _, bad := range []string{"", "a,,b", "a,"} {
		if _, err := kafkaopt.Brokers(bad); err == nil {
			t.Errorf("Brokers(%q): no error", bad)
		}
	}
}

func TestOptions(t *testing.T) {
	ca := writeCA(t)
	cases := []struct {
		url     string
		opts    int    // options returned
		wantErr string // in the error; "" for none
	}{
		{"kafka://h:9092", 0, ""},
		{"kafka://h:9092?tls=1", 1, ""},
		{"kafka://h:9092?tls_ca=" + ca, 1, ""},
		{"kafka://u:p@h:9092", 1, ""},
		{"kafka://u:p@h:9092?sasl_mechanism=SCRAM-SHA-512&tls=true", 2, ""},
		{"kafka://h:9092?tls=yes", 0, `tls="yes"`},
		{"kafka://h:9092?tls_ca=" + filepath.Join(t.TempDir(), "missing.pem"), 0, "tls_ca"},
		{"kafka://h:9092?tls_ca=" + writeFile(t, "not a certificate"), 0, "holds no PEM certificate"},
		{"kafka://h:9092?tls_cert=c.pem", 0, "tls_cert and tls_key go together"},
		{"kafka://h:9092?sasl_mechanism=plain", 0, "needs a user"},
		{"kafka://u:s3cret@h:9092?sasl_mechanism=gssapi", 0, `sasl_mechanism="gssapi"`},
	}
	for _, c := range cases {
		u, err := url.Parse(c.url)
		if err != nil {
			t.Fatal(err)
		}
		opts, err := kafkaopt.Options(u, u.Query())
		switch {
		case c.wantErr == "" && err != nil:
			t.Errorf("%s: %v", c.url, err)
		case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
			t.Errorf("%s: error %v, want one naming %q", c.url, err, c.wantErr)
		case err != nil && strings.Contains(err.Error(), "s3cret"):
			t.Errorf("%s: the error shows the password: %v", c.url, err)
		case err == nil && len(opts) != c.opts:
			t.Errorf("%s: %d options, want %d", c.url, len(opts), c.opts)
		}
	}
}

func writeFile(t *testing.T, content string) string {
	p := filepath.Join(t.TempDir(), "f.pem")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// writeCA writes a self-signed CA certificate and returns its path.
func writeCA(t *testing.T) string {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return writeFile(t, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
}
