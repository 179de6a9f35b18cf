// Package tlsca makes the TLS client configuration of a program that
// trusts one CA, or one self-signed certificate, from a PEM file: the
// agent's and the operator commands' --ca-cert.
package tlsca

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// Config returns a TLS client configuration whose roots are the
// certificates of the PEM file at path, instead of the system's. A file
// without a PEM certificate is an error.
func Config(path string) (*tls.Config, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no PEM certificate in the file", path)
	}
	return &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}, nil
}
