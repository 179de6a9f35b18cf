package ingress

import "testing"

// TestClientAddr: IPv4 clients count by address, IPv6 clients by /64 (one
// client usually holds the whole /64), IPv4 in IPv6 as IPv4.
func TestClientAddr(t *testing.T) {
	for _, tc := range []struct{ remote, want string }{
		{"192.0.2.7:51000", "192.0.2.7"},
		{"[::ffff:192.0.2.7]:51000", "192.0.2.7"},
		{"[2001:db8:1:2:aaaa::1]:443", "2001:db8:1:2::/64"},
		{"[2001:db8:1:2:bbbb::9]:80", "2001:db8:1:2::/64"},
		{"pipe", "pipe"},
	} {
		if got := clientAddr(tc.remote); got != tc.want {
			t.Errorf("clientAddr(%q) = %q, want %q", tc.remote, got, tc.want)
		}
	}
}
