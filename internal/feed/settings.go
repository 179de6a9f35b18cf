package feed

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
)

// Settings are the settings of a source of kind feed, as its JSON
// settings hold them: the remote stream to follow and how to authenticate.
type Settings struct {
	// URL is the remote stream: http(s)://HOST:PORT/v1/streams/NAME.
	URL string `json:"url"`
	// Token is the remote API token, or "env:NAME" to read it from the
	// environment variable NAME when the follower starts (the token then
	// stays out of the stored settings). Empty: none.
	Token string `json:"token,omitempty"`
}

// Validate names the setting that is wrong.
func (s Settings) Validate() error {
	u, err := url.Parse(s.URL)
	if s.URL == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" ||
		!strings.HasPrefix(strings.TrimSuffix(strings.TrimSuffix(u.Path, "/"), "/events"), "/v1/streams/") {
		return fmt.Errorf("settings.url %q: want http(s)://HOST:PORT/v1/streams/NAME", s.URL)
	}
	if name, ok := strings.CutPrefix(s.Token, "env:"); ok && name == "" {
		return errors.New("settings.token: env: names no variable")
	}
	return nil
}

// ResolveToken returns the token, read from the environment for "env:NAME".
func (s Settings) ResolveToken() (string, error) {
	name, ok := strings.CutPrefix(s.Token, "env:")
	if !ok {
		return s.Token, nil
	}
	tok, set := os.LookupEnv(name)
	if !set {
		return "", fmt.Errorf("feed token: the environment variable %s is not set", name)
	}
	return tok, nil
}
