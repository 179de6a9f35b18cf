package delivery_test

import (
	"context"
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/postbox-events/postbox/internal/delivery"
)

// TestTargetPolicyRefusesAddresses: a target URL holding an IP address
// the policy refuses is refused when it is set (create and SetTarget),
// naming the address, its kind and the flag that allows it; a host name
// is left to the check when connecting.
func TestTargetPolicyRefusesAddresses(t *testing.T) {
	const linkLocal, private = "refused (--allow-link-local-targets)", "refused (--deny-private-targets)"
	for _, c := range []struct {
		name    string
		cfg     delivery.Config
		refused map[string]string // target host → what the error says
		allowed []string
	}{
		{"default", delivery.Config{}, map[string]string{
			"169.254.169.254":          "target address 169.254.169.254 is link-local: " + linkLocal,
			"169.254.1.1:8080":         "169.254.1.1 is link-local",
			"[fe80::1]":                "fe80::1 is link-local",
			"[fe80::1%25eth0]":         "fe80::1 is link-local",
			"[::ffff:169.254.169.254]": "169.254.169.254 is link-local",
			"[64:ff9b::a9fe:a9fe]":     "169.254.169.254 is link-local", // NAT64
			"[fd00:ec2::254]":          "fd00:ec2::254 is a cloud metadata address: " + linkLocal,
		}, []string{"127.0.0.1", "[::1]", "10.1.2.3", "192.168.1.10", "100.64.0.1", "localhost", "example.com", "8.8.8.8"}},
		{"deny private", delivery.Config{DenyPrivateTargets: true}, map[string]string{
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
			"[2002:a00:1::]":    "10.0.0.1 is private", // 6to4
		}, []string{"8.8.8.8", "[2001:4860:4860::8888]", "localhost", "example.com"}},
		{"allow link-local", delivery.Config{AllowLinkLocalTargets: true}, nil,
			[]string{"169.254.169.254", "[fe80::1]", "[fd00:ec2::254]", "127.0.0.1"}},
		{"allow link-local, deny private", delivery.Config{AllowLinkLocalTargets: true, DenyPrivateTargets: true},
			map[string]string{"10.0.0.1": private}, []string{"169.254.169.254"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := setup(t, sqliteStore, c.cfg)
			e.create(t, delivery.Subscription{Name: "hook", Source: "devices", Target: "http://8.8.8.8/in"})
			for host, want := range c.refused {
				target := "http://" + host + "/in"
				_, _, err := e.d.Create(context.Background(), delivery.Subscription{Name: "other", Source: "devices", Target: target})
				if !errors.Is(err, delivery.ErrInvalid) || !strings.Contains(err.Error(), want) {
					t.Errorf("create with target %s: %v, want invalid: %q", target, err, want)
				}
				err = e.d.SetTarget(context.Background(), "hook", target)
				if !errors.Is(err, delivery.ErrInvalid) || !strings.Contains(err.Error(), want) {
					t.Errorf("set target %s: %v, want invalid: %q", target, err, want)
				}
			}
			for _, host := range c.allowed {
				if err := e.d.SetTarget(context.Background(), "hook", "http://"+host+"/in"); err != nil {
					t.Errorf("set target %s: %v", host, err)
				}
			}
			if s, err := e.d.Subscription(context.Background(), "hook"); err != nil || s.Target != "http://"+c.allowed[len(c.allowed)-1]+"/in" {
				t.Errorf("the subscription's target is %q (%v): a refused target changed it", s.Target, err)
			}
		})
	}
}

// TestTargetPolicyAtConnect: a host name is checked when a worker
// connects, after DNS: with DenyPrivateTargets a target named localhost is
// accepted when set, but every attempt fails without reaching it, naming
// the address it resolved to.
func TestTargetPolicyAtConnect(t *testing.T) {
	e := setup(t, sqliteStore, delivery.Config{DenyPrivateTargets: true})
	tg := newTarget(t, 200)
	target := strings.Replace(tg.URL, "127.0.0.1", "localhost", 1) + "/in"
	e.create(t, delivery.Subscription{Name: "hook", Source: "devices", Target: target})
	e.appendEvents(t, "h", "order.paid", 1)
	it := e.waitItem(t, "hook", delivery.StatePending, 1)
	if it.LastError == nil || !strings.HasPrefix(*it.LastError, "localhost: target address ") ||
		!strings.Contains(*it.LastError, "is loopback: refused (--deny-private-targets)") {
		t.Fatalf("last error %s, want the refused loopback address", lastError(it))
	}
	if tg.calls() != 0 {
		t.Fatalf("the target was reached %d times", tg.calls())
	}
}

// TestLinkLocalRefusedAtConnect: a subscription whose target was set
// while link-local targets were allowed is not delivered to once they are
// not: each attempt fails, naming the metadata address and the flag.
func TestLinkLocalRefusedAtConnect(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.db")
	e := open(t, sqliteStore, openOptions{streams: path, cfg: delivery.Config{AllowLinkLocalTargets: true}})
	e.create(t, delivery.Subscription{Name: "metadata", Source: "devices", Target: "http://169.254.169.254/latest/meta-data/"})
	e.stop()

	e = open(t, sqliteStore, openOptions{streams: path})
	e.appendEvents(t, "m", "t", 1)
	it := e.waitItem(t, "metadata", delivery.StatePending, 1)
	const want = "target address 169.254.169.254 is link-local: refused (--allow-link-local-targets)"
	if it.LastError == nil || *it.LastError != want {
		t.Fatalf("last error %s, want %q", lastError(it), want)
	}
}

func lastError(it delivery.Item) string {
	if it.LastError == nil {
		return "none"
	}
	return strconv.Quote(*it.LastError)
}
