// Package netpolicy is the server's outbound address policy: which
// addresses its connections to URLs an operator or a caller gives may
// reach. Delivery's HTTP client, poll sources and feed sources apply it.
//
// Link-local addresses (169.254.0.0/16, with the cloud metadata address
// 169.254.169.254, and fe80::/10) are refused unless Policy.AllowLinkLocal;
// Policy.DenyPrivate refuses loopback, private, unspecified,
// carrier-grade NAT, multicast and reserved addresses too. A URL holding
// an IP address is checked when it is given (CheckURL); every connection
// is checked after DNS, on the address it connects to (Control), so that
// no answer of DNS leads elsewhere.
package netpolicy

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"syscall"
)

// ErrRefused is the kind of an address the policy refuses.
var ErrRefused = errors.New("target address refused")

// RefusedError names the address the policy refused, its class and the
// flag that would allow it. Its kind is ErrRefused.
type RefusedError struct {
	Addr  netip.Addr
	Class string // "link-local", "private", "loopback", ...
	Flag  string // what allows it
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("target address %s is %s: refused (%s)", e.Addr, e.Class, e.Flag)
}

func (e *RefusedError) Unwrap() error { return ErrRefused }

// Address ranges of the policy.
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

// Policy says which addresses the server's outbound connections may
// reach. The zero value refuses link-local addresses and allows the
// others.
type Policy struct {
	// AllowLinkLocal allows link-local addresses (169.254.0.0/16, among
	// them the cloud metadata address 169.254.169.254, and fe80::/10),
	// refused by default (--allow-link-local-targets).
	AllowLinkLocal bool
	// DenyPrivate refuses loopback, private, unspecified, carrier-grade
	// NAT, multicast and reserved addresses too, for deployments where
	// whoever gives a URL is not trusted (--deny-private-targets).
	DenyPrivate bool
}

// CheckAddr returns a *RefusedError, naming ip, its class and the flag
// that allows it, when p refuses ip. An IPv4 address inside an
// IPv6 one (mapped, NAT64, 6to4) is checked as itself.
func (p Policy) CheckAddr(ip netip.Addr) error {
	ip = ip.WithZone("").Unmap()
	if ip.Is6() {
		for _, prefix := range nat64 {
			if prefix.Contains(ip) {
				b := ip.As16()
				return p.CheckAddr(netip.AddrFrom4([4]byte(b[12:16])))
			}
		}
		if sixToFour.Contains(ip) {
			b := ip.As16()
			return p.CheckAddr(netip.AddrFrom4([4]byte(b[2:6])))
		}
	}
	if !p.AllowLinkLocal {
		switch {
		case ip.IsLinkLocalUnicast(), ip.IsLinkLocalMulticast():
			return &RefusedError{ip, "link-local", "--allow-link-local-targets"}
		case slices.Contains(cloudMetadata, ip):
			return &RefusedError{ip, "a cloud metadata address", "--allow-link-local-targets"}
		}
	}
	if !p.DenyPrivate {
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
		return &RefusedError{ip, class, "--deny-private-targets"}
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

// CheckURL refuses a URL whose host is an IP address p refuses, with an
// error of kind ErrRefused naming field, the URL and the address. A host
// name passes: it is checked when connecting (Control), since what it
// resolves to may change. A URL that does not parse passes too: its
// caller says what is wrong with it.
func (p Policy) CheckURL(field, rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil
	}
	ip, err := netip.ParseAddr(u.Hostname())
	if err != nil {
		return nil
	}
	if err := p.CheckAddr(ip); err != nil {
		return fmt.Errorf("%s %q: %w", field, rawURL, err)
	}
	return nil
}

// Control is a net.Dialer Control function: it refuses a connection to
// an address p refuses, after the name was resolved, so that no answer
// of DNS can lead a connection elsewhere.
func (p Policy) Control(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("target address %q: %w", address, err)
	}
	return p.CheckAddr(ap.Addr())
}
