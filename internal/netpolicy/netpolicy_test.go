package netpolicy_test

import (
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/postbox-events/postbox/internal/netpolicy"
)

// TestCheckURL: a URL holding an IP address the policy refuses is
// refused, naming the field, the address, its class and the flag that
// allows it, as ErrRefused; a host name, and a URL that does not parse,
// are left to the check when connecting and to the caller.
func TestCheckURL(t *testing.T) {
	const linkLocal, private = "refused (--allow-link-local-targets)", "refused (--deny-private-targets)"
	for _, c := range []struct {
		name    string
		policy  netpolicy.Policy
		refused map[string]string // host → what the error says
		allowed []string
	}{
		{"default", netpolicy.Policy{}, map[string]string{
			"169.254.169.254":          "target address 169.254.169.254 is link-local: " + linkLocal,
			"169.254.1.1:8080":         "169.254.1.1 is link-local",
			"[fe80::1]":                "fe80::1 is link-local",
			"[fe80::1%25eth0]":         "fe80::1 is link-local",
			"[::ffff:169.254.169.254]": "169.254.169.254 is link-local",
			"[64:ff9b::a9fe:a9fe]":     "169.254.169.254 is link-local", // NAT64
			"[fd00:ec2::254]":          "fd00:ec2::254 is a cloud metadata address: " + linkLocal,
		}, []string{"127.0.0.1", "[::1]", "10.1.2.3", "192.168.1.10", "100.64.0.1", "localhost", "example.com", "8.8.8.8", "%zz"}},
		{"deny private", netpolicy.Policy{DenyPrivate: true}, map[string]string{
			"169.254.169.254":   linkLocal,
			"127.0.0.1":         "127.0.0.1 is loopback: " + private,
			"127.1.2.3:9000":    "127.1.2.3 is loopback",
			"[::1]":             "::1 is loopback",
			"[::ffff:10.0.0.1]": "10.0.0.1 is private",
			"10.1.2.3":          "10.1.2.3 is private",
			"172.16.5.4":        "172.16.5.4 is private",
			"192.168.1.10":      "192.168.1.10 is private",
			"[fc00::1]":         "fc00::1 is private",
			"0.0.0.0":           "0.0.0.0 is unspecified",
			"[::]":              ":: is unspecified",
			"100.64.0.1":        "100.64.0.1 is carrier-grade NAT",
			"198.18.0.1":        "198.18.0.1 is reserved",
			"255.255.255.255":   "is reserved",
			"239.1.2.3":         "239.1.2.3 is multicast",
			"[2002:a00:1::]":    "10.0.0.1 is private", // 6to4
		}, []string{"8.8.8.8", "[2001:4860:4860::8888]", "localhost", "example.com"}},
		{"allow link-local", netpolicy.Policy{AllowLinkLocal: true}, nil,
			[]string{"169.254.169.254", "[fe80::1]", "[fd00:ec2::254]", "127.0.0.1"}},
		{"allow link-local, deny private", netpolicy.Policy{AllowLinkLocal: true, DenyPrivate: true},
			map[string]string{"10.0.0.1": private}, []string{"169.254.169.254"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			for host, want := range c.refused {
				u := "http://" + host + "/in"
				err := c.policy.CheckURL("settings.url", u)
				if !errors.Is(err, netpolicy.ErrRefused) || !strings.Contains(err.Error(), want) ||
					!strings.HasPrefix(err.Error(), `settings.url "`+u+`": target address `) {
					t.Errorf("CheckURL(%s): %v, want refused: %q", u, err, want)
				}
				if _, ok := errors.AsType[*netpolicy.RefusedError](err); !ok {
					t.Errorf("CheckURL(%s): %v, not a *RefusedError", u, err)
				}
			}
			for _, host := range c.allowed {
				if err := c.policy.CheckURL("settings.url", "http://"+host+"/in"); err != nil {
					t.Errorf("CheckURL(%s): %v", host, err)
				}
			}
		})
	}
}

// TestControl: a dialer with the policy's Control connects to what the
// policy allows and to nothing it refuses, naming the address it
// resolved to.
func TestControl(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	for _, c := range []struct {
		policy netpolicy.Policy
		want   string // "": connects
	}{
		{netpolicy.Policy{}, ""},
		{netpolicy.Policy{DenyPrivate: true}, "target address 127.0.0.1 is loopback: refused (--deny-private-targets)"},
	} {
		d := net.Dialer{Control: c.policy.Control}
		conn, err := d.Dial("tcp", net.JoinHostPort("localhost", port))
		if conn != nil {
			conn.Close()
		}
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v: dial: %v", c.policy, err)
		case c.want != "" && (!errors.Is(err, netpolicy.ErrRefused) || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%+v: dial: %v, want %q", c.policy, err, c.want)
		}
	}
	if err := (netpolicy.Policy{}).Control("tcp", "not an address", nil); err == nil {
		t.Error("Control of an address that does not parse: no error")
	}
}
