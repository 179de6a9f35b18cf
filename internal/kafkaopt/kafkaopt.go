// Package kafkaopt reads what a kafka:// URL says about reaching the
// brokers (their addresses, TLS, SASL) into franz-go options, for every
// postbox command that talks to Kafka.
//
//	kafka://[USER:PASSWORD@]HOST[:9092][,HOST[:9092]...][?OPTIONS]
//
// The options it reads (Names):
//
//	tls=1                     TLS with the system's roots
//	tls_ca=FILE               CA certificates to verify the brokers with (turns TLS on)
//	tls_cert=FILE,tls_key=FILE  a client certificate (turns TLS on)
//	sasl_mechanism=plain|scram-sha-256|scram-sha-512
//	                          with the URL's user and password; plain when a user is given alone
//
// Errors name the option at fault and never the password.
package kafkaopt

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// Names are the query options Options reads.
var Names = []string{"tls", "tls_ca", "tls_cert", "tls_key", "sasl_mechanism"}

// DefaultPort is the port of a broker address that names none.
const DefaultPort = "9092"

// Brokers returns the broker addresses of a URL's host part,
// "h1[:port],h2[:port]", each with DefaultPort when it names none.
func Brokers(hosts string) ([]string, error) {
	var out []string
	for b := range strings.SplitSeq(hosts, ",") {
		if b == "" {
			return nil, errors.New("an empty broker address: use HOST:9092[,HOST:9092...]")
		}
		if !strings.Contains(b, ":") {
			b += ":" + DefaultPort
		}
		out = append(out, b)
	}
	if len(out) == 0 {
		return nil, errors.New("name the brokers: kafka://HOST:9092[,HOST:9092...]")
	}
	return out, nil
}

// Options returns the franz-go options for the TLS and SASL settings of a
// kafka:// URL u with query q: none when it has neither.
func Options(u *url.URL, q url.Values) ([]kgo.Opt, error) {
	var opts []kgo.Opt
	tlsCfg, err := tlsConfig(q)
	if err != nil {
		return nil, err
	}
	if tlsCfg != nil {
		opts = append(opts, kgo.DialTLSConfig(tlsCfg))
	}
	mech := q.Get("sasl_mechanism")
	if u.User == nil {
		if mech != "" {
			return nil, fmt.Errorf("sasl_mechanism=%s needs a user: kafka://USER:PASSWORD@HOST:9092", mech)
		}
		return opts, nil
	}
	user := u.User.Username()
	pass, _ := u.User.Password()
	switch strings.ToLower(mech) {
	case "", "plain":
		opts = append(opts, kgo.SASL(plain.Auth{User: user, Pass: pass}.AsMechanism()))
	case "scram-sha-256":
		opts = append(opts, kgo.SASL(scram.Auth{User: user, Pass: pass}.AsSha256Mechanism()))
	case "scram-sha-512":
		opts = append(opts, kgo.SASL(scram.Auth{User: user, Pass: pass}.AsSha512Mechanism()))
	default:
		return nil, fmt.Errorf("sasl_mechanism=%q: use plain, scram-sha-256 or scram-sha-512", mech)
	}
	return opts, nil
}

// tlsConfig reads the tls options: tls=1 for the system's roots, tls_ca
// for a CA file, tls_cert and tls_key for a client certificate. Any of
// them turns TLS on.
func tlsConfig(q url.Values) (*tls.Config, error) {
	on := q.Get("tls")
	switch on {
	case "", "0", "1", "true", "false":
	default:
		return nil, fmt.Errorf("tls=%q: use 1 or 0", on)
	}
	ca, cert, key := q.Get("tls_ca"), q.Get("tls_cert"), q.Get("tls_key")
	if on != "1" && on != "true" && ca == "" && cert == "" && key == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("tls_ca: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls_ca=%s holds no PEM certificate", ca)
		}
	}
	if (cert == "") != (key == "") {
		return nil, errors.New("tls_cert and tls_key go together")
	}
	if cert != "" {
		c, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("tls_cert/tls_key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{c}
	}
	return cfg, nil
}
