package streamnats

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// ParseURL reads a Config from a URL:
//
//	nats://[user:password@]host:4222[,host2:4222...][?option=value&...]
//	tls://...   (the same, with TLS required)
//
// Options:
//
//	replicas=1|3             Config.Replicas
//	prefix=NAME              Config.Prefix
//	duplicate_window=2m      Config.DuplicateWindow (a Go duration)
//	ack_timeout=30s          Config.AckTimeout
//	creds=FILE               a NATS credentials (JWT + nkey) file
//	nkey=FILE                an nkey seed file
//	token=TOKEN              an authentication token
//	tls_ca=FILE              CA certificates to verify the servers with
//	tls_cert=FILE,tls_key=FILE  a client certificate
//
// An unknown option, or one with a bad value, is an error naming it.
func ParseURL(raw string) (Config, error) {
	var cfg Config
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok || (scheme != "nats" && scheme != "tls") {
		return cfg, fmt.Errorf("streamnats: URL %q: want nats://host:port or tls://host:port", redact(raw))
	}
	rest, query, _ := strings.Cut(rest, "?")
	var user *url.Userinfo
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		u, err := url.Parse("nats://" + rest[:at+1] + "x")
		if err != nil {
			return cfg, fmt.Errorf("streamnats: URL credentials: %w", err)
		}
		user, rest = u.User, rest[at+1:]
	}
	var servers []string
	for _, h := range strings.Split(rest, ",") {
		h = strings.TrimPrefix(strings.TrimPrefix(h, "nats://"), "tls://")
		if h == "" {
			return cfg, fmt.Errorf("streamnats: URL %q: empty server address", redact(raw))
		}
		servers = append(servers, scheme+"://"+h)
	}
	cfg.URL = strings.Join(servers, ",")
	if user != nil {
		pass, _ := user.Password()
		cfg.Options = append(cfg.Options, nats.UserInfo(user.Username(), pass))
	}
	if scheme == "tls" {
		cfg.Options = append(cfg.Options, nats.Secure())
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return cfg, fmt.Errorf("streamnats: URL query: %w", err)
	}
	var cert, key string
	for name, vals := range q {
		v := vals[len(vals)-1]
		bad := func(err error) error {
			return fmt.Errorf("streamnats: URL option %s=%q: %w", name, v, err)
		}
		switch name {
		case "replicas":
			n, err := strconv.Atoi(v)
			if err != nil || (n != 1 && n != 3) {
				return cfg, bad(fmt.Errorf("want 1 or 3"))
			}
			cfg.Replicas = n
		case "prefix":
			if v == "" {
				return cfg, bad(fmt.Errorf("empty"))
			}
			cfg.Prefix = v
		case "duplicate_window", "ack_timeout":
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return cfg, bad(fmt.Errorf("want a positive duration such as 2m"))
			}
			if name == "ack_timeout" {
				cfg.AckTimeout = d
			} else {
				cfg.DuplicateWindow = d
			}
		case "creds":
			cfg.Options = append(cfg.Options, nats.UserCredentials(v))
		case "nkey":
			opt, err := nats.NkeyOptionFromSeed(v)
			if err != nil {
				return cfg, bad(err)
			}
			cfg.Options = append(cfg.Options, opt)
		case "token":
			cfg.Options = append(cfg.Options, nats.Token(v))
		case "tls_ca":
			cfg.Options = append(cfg.Options, nats.RootCAs(v))
		case "tls_cert":
			cert = v
		case "tls_key":
			key = v
		default:
			return cfg, fmt.Errorf("streamnats: unknown URL option %q", name)
		}
	}
	if (cert == "") != (key == "") {
		return cfg, fmt.Errorf("streamnats: URL options tls_cert and tls_key go together")
	}
	if cert != "" {
		cfg.Options = append(cfg.Options, nats.ClientCert(cert, key))
	}
	return cfg, nil
}

// redact hides a URL's password and token.
func redact(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return raw
	}
	rest, query, hasQuery := strings.Cut(rest, "?")
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		user, _, _ := strings.Cut(rest[:at], ":")
		rest = user + ":xxxxx@" + rest[at+1:]
	}
	out := scheme + "://" + rest
	if hasQuery {
		if q, err := url.ParseQuery(query); err == nil && q.Has("token") {
			q.Set("token", "xxxxx")
			query = q.Encode()
		}
		out += "?" + query
	}
	return out
}
