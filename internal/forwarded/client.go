package forwarded

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// Proxies are the addresses of reverse proxies trusted to say who their
// client was (serve's --trusted-proxies). The zero value trusts none:
// every request's client is the peer of its connection, whatever headers
// it sends.
type Proxies []netip.Prefix

// ParseProxies reads a list of addresses and CIDR prefixes
// (127.0.0.1, 10.0.0.0/8, fd00::/8); its error names the one at fault.
func ParseProxies(items []string) (Proxies, error) {
	var ps Proxies
	for _, it := range items {
		p, err := netip.ParsePrefix(it)
		if err != nil {
			a, aerr := netip.ParseAddr(it)
			if aerr != nil {
				return nil, fmt.Errorf("%q is not an IP address or a CIDR prefix such as 10.0.0.0/8", it)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		ps = append(ps, p.Masked())
	}
	return ps, nil
}

// trusts reports whether a is one of ps.
func (ps Proxies) trusts(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// ClientAddr returns the address (host:port) of the client of a request
// that came from remote (its connection's peer, host:port) with
// X-Forwarded-For xff. Only a peer among ps is believed: from it, the
// client is the last address of X-Forwarded-For that is not itself a
// trusted proxy (read from the right, as each proxy appends the address
// it saw), with port 0. From any other peer, or without a usable header,
// it is remote: a client cannot name itself another address.
func (ps Proxies) ClientAddr(remote string, xff []string) string {
	if len(ps) == 0 || len(xff) == 0 {
		return remote
	}
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		return remote
	}
	peer, err := netip.ParseAddr(host)
	if err != nil || !ps.trusts(peer) {
		return remote
	}
	hops := strings.Split(strings.Join(xff, ","), ",")
	client := netip.Addr{}
	for i := len(hops) - 1; i >= 0; i-- {
		a, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
		if err != nil {
			break // a hop that is not an address: believe no further
		}
		client = a.Unmap()
		if !ps.trusts(client) {
			break
		}
	}
	if !client.IsValid() {
		return remote
	}
	return netip.AddrPortFrom(client, 0).String()
}
