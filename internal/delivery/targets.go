package delivery

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"syscall"
	"time"
)

// ErrTargetRefused is the kind of a target address the policy of Config
// (AllowLinkLocalTargets, DenyPrivateTargets) refuses.
var ErrTargetRefused = errors.New("target address refused")

// refusedError names the address the policy refused and the flag that
// would allow it.
type refusedError struct {
	addr  netip.Addr
	class string // "link-local", "private", "loopback", ...
	flag  string // what allows it
}

func (e *refusedError) Error() string {
	return fmt.Sprintf("target address %s is %s: refused (%s)", e.addr, e.class, e.flag)
}

func (e *refusedError) Unwrap() error { return ErrTargetRefused }

// Address ranges of the target policy.
var (
	// cloudMetadata are metadata services outside the link-local ranges,
	// refused with them (AWS's IPv6 instance metadata).
	cloudMetadata = []netip.Addr{netip.MustParseAddr("fd00:ec2::254")}
	// cgnat is the shared address space of carrier-grade NAT (RFC 6598).
	cgnat = netip.MustParsePrefix("100.64.0.0/10")
	// thisNetwork (0.0.0.0/8) reaches the host itself on Linux.
	thisNetwork = netip.MustParsePrefix("0.0.0.0/8")
	// reserved: benchmarking (RFC 2544), IETF protocol assignments, 240/4
	// (with the broadcast address) and IPv6 discard.
	reserved = []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15"), netip.MustParsePrefix("192.0.0.0/24"),
		netip.MustParsePrefix("240.0.0.0/4"), netip.MustParsePrefix("100::/64")}
	// nat64 and sixToFour embed an IPv4 address, which is checked instead.
	nat64     = []netip.Prefix{netip.MustParsePrefix("64:ff9b::/96"), netip.MustParsePrefix("64:ff9b:1::/48")}
	sixToFour = netip.MustParsePrefix("2002::/16")
)

// targetPolicy is the part of Config that says which addresses the
// workers may connect to.
type targetPolicy struct{ allowLinkLocal, denyPrivate bool }

func (cfg *Config) targetPolicy() targetPolicy {
	return targetPolicy{allowLinkLocal: cfg.AllowLinkLocalTargets, denyPrivate: cfg.DenyPrivateTargets}
}

// checkAddr returns a *refusedError when p refuses ip as the address of a
// target: link-local addresses (169.254.0.0/16, with the cloud metadata
// address 169.254.169.254, and fe80::/10) unless allowLinkLocal; with
// denyPrivate, also loopback, private, unspecified, carrier-grade NAT,
// multicast and reserved addresses. An IPv4 address inside an IPv6 one
// (mapped, NAT64, 6to4) is checked as itself.
func (p targetPolicy) checkAddr(ip netip.Addr) error {
	ip = ip.WithZone("").Unmap()
	if ip.Is6() {
		for _, prefix := range nat64 {
			if prefix.Contains(ip) {
				b := ip.As16()
				return p.checkAddr(netip.AddrFrom4([4]byte(b[12:16])))
			}
		}
		if sixToFour.Contains(ip) {
			b := ip.As16()
			return p.checkAddr(netip.AddrFrom4([4]byte(b[2:6])))
		}
	}
	if !p.allowLinkLocal {
		switch {
		case ip.IsLinkLocalUnicast(), ip.IsLinkLocalMulticast():
			return &refusedError{ip, "link-local", "--allow-link-local-targets"}
		case slices.Contains(cloudMetadata, ip):
			return &refusedError{ip, "a cloud metadata address", "--allow-link-local-targets"}
		}
	}
	if !p.denyPrivate {
		return nil
	}
	class := ""
	switch {
	case ip.IsLoopback():
		class = "loopback"
	case ip.IsPrivate():
		class = "private"
	case ip.IsUnspecified(), thisNetwork.Contains(ip):
		class = "unspecified"
	case cgnat.Contains(ip):
		class = "carrier-grade NAT (shared address space)"
	case ip.IsMulticast():
		class = "multicast"
	case inAny(ip, reserved):
		class = "reserved"
	}
	if class != "" {
		return &refusedError{ip, class, "--deny-private-targets"}
	}
	return nil
}

func inAny(ip netip.Addr, prefixes []netip.Prefix) bool {
	for _, prefix := range prefixes {
		if prefix.Contains(ip) {
			return true
		}
	}
	return false
}

// checkTarget refuses a target URL whose host is an IP address p refuses
// (ErrInvalid). A host name is checked when the workers connect: what it
// resolves to may change.
func (p targetPolicy) checkTarget(target string) error {
	if target == "" {
		return nil
	}
	return p.checkURL("target", target)
}

// checkURL refuses, as ErrInvalid naming field, a URL whose host is an IP
// address p refuses. One that does not parse passes: its caller says what
// is wrong with it.
func (p targetPolicy) checkURL(field, rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil
	}
	ip, err := netip.ParseAddr(u.Hostname())
	if err != nil {
		return nil
	}
	if err := p.checkAddr(ip); err != nil {
		return errorf(ErrInvalid, "%s %q: %v", field, rawURL, err)
	}
	return nil
}

// control is a net.Dialer Control function: it refuses a connection to an
// address the policy refuses, after the name was resolved, so that no
// answer of DNS can lead the workers elsewhere.
func (p targetPolicy) control(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("target address %q: %w", address, err)
	}
	return p.checkAddr(ap.Addr())
}

// DialControl is a net.Dialer Control function that refuses the
// addresses the target policy of Config (AllowLinkLocalTargets,
// DenyPrivateTargets) refuses, for the server's other connections to URLs
// an operator gives: poll and feed sources.
func (d *Delivery) DialControl() func(network, address string, c syscall.RawConn) error {
	return d.cfg.targetPolicy().control
}

// CheckURL refuses, as ErrInvalid naming field, a URL whose host is an IP
// address the target policy refuses; a host name is checked when
// connecting (DialControl).
func (d *Delivery) CheckURL(field, rawURL string) error {
	return d.cfg.targetPolicy().checkURL(field, rawURL)
}

// newHTTPClient returns the default Config.HTTPClient: keep-alive
// connections for Workers, and a dialer that applies the target policy to
// every address it connects to.
func newHTTPClient(cfg *Config) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = cfg.Workers
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Control: cfg.targetPolicy().control}
	t.DialContext = dialer.DialContext
	return &http.Client{Transport: t}
}
