package forwarded

import "testing"

func TestClientAddr(t *testing.T) {
	ps, err := ParseProxies([]string{"127.0.0.2", "10.0.0.0/8"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		remote string
		xff    []string
		want   string
	}{
		{"127.0.0.1:5000", []string{"6.6.6.6"}, "127.0.0.1:5000"},                         // an untrusted peer names no one
		{"127.0.0.2:5000", nil, "127.0.0.2:5000"},                                         // a proxy without the header
		{"127.0.0.2:5000", []string{"203.0.113.9"}, "203.0.113.9:0"},                      // the proxy's client
		{"127.0.0.2:5000", []string{"6.6.6.6, 203.0.113.9"}, "203.0.113.9:0"},             // what the client claimed is left of it
		{"127.0.0.2:5000", []string{"6.6.6.6", "203.0.113.9, 10.1.2.3"}, "203.0.113.9:0"}, // through two trusted proxies
		{"127.0.0.2:5000", []string{"junk"}, "127.0.0.2:5000"},
		{"[::ffff:127.0.0.2]:5000", []string{"2001:db8::1"}, "[2001:db8::1]:0"},
	} {
		if got := ps.ClientAddr(c.remote, c.xff); got != c.want {
			t.Errorf("ClientAddr(%s, %q) = %s, want %s", c.remote, c.xff, got, c.want)
		}
	}
	if _, err := ParseProxies([]string{"10.0.0.0/8", "nginx"}); err == nil || err.Error() != `"nginx" is not an IP address or a CIDR prefix such as 10.0.0.0/8` {
		t.Fatalf("a name: %v", err)
	}
	if got := Proxies(nil).ClientAddr("127.0.0.2:1", []string{"1.2.3.4"}); got != "127.0.0.2:1" {
		t.Fatalf("no proxies trusted: %s", got)
	}
}
