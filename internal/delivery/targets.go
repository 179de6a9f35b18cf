package delivery

import (
	"net"
	"net/http"
	"time"

	"github.com/postbox-events/postbox/internal/netpolicy"
)

// Policy is the outbound address policy of Config
// (AllowLinkLocalTargets, DenyPrivateTargets): which addresses the
// workers may connect to.
func (cfg *Config) Policy() netpolicy.Policy {
	return netpolicy.Policy{AllowLinkLocal: cfg.AllowLinkLocalTargets, DenyPrivate: cfg.DenyPrivateTargets}
}

// checkTarget refuses a target URL whose host is an IP address the
// policy refuses (ErrInvalid). A host name is checked when the workers
// connect: what it resolves to may change.
func (cfg *Config) checkTarget(target string) error {
	if target == "" {
		return nil
	}
	if err := cfg.Policy().CheckURL("target", target); err != nil {
		return &Error{Kind: ErrInvalid, Msg: err.Error()}
	}
	return nil
}

// newHTTPClient returns the default Config.HTTPClient: keep-alive
// connections for Workers, and a dialer that applies the target policy to
// every address it connects to.
func newHTTPClient(cfg *Config) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = cfg.Workers
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Control: cfg.Policy().Control}
	t.DialContext = dialer.DialContext
	return &http.Client{Transport: t}
}
