package feed

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/postbox-events/postbox/internal/redirect"
	"github.com/postbox-events/postbox/internal/replyto"
)

// Settings are the settings of a source of kind feed, as its JSON
// settings hold them: the remote stream to follow and how to authenticate.
type Settings struct {
	// URL is the remote stream: http(s)://HOST:PORT/v1/streams/NAME, with
	// no query, fragment or credentials (Token authenticates).
	URL string `json:"url"`
	// Token is the remote API token, or "env:NAME" to read it from the
	// environment variable NAME at each connection (the token then stays
	// out of the stored settings). Empty: none.
	Token string `json:"token,omitempty"`
	// Redirects says which redirects the follower follows: "same-origin"
	// (the default, "") only to the URL's scheme, host and port, "none"
	// none. The token never goes to another origin.
	Redirects string `json:"redirects,omitempty"`
	// Reply holds what a reply to the source's events carries.
	Reply *replyto.Settings `json:"reply,omitempty"`
}

// ErrRequired is in the error of Validate for a setting that is missing.
var ErrRequired = errors.New("required")

// Validate names the setting that is wrong.
func (s Settings) Validate() error {
	if s.URL == "" {
		return fmt.Errorf("settings.url: %w: the remote stream, http(s)://HOST:PORT/v1/streams/NAME", ErrRequired)
	}
	u, err := url.Parse(s.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || s.StreamName() == "" {
		return fmt.Errorf("settings.url %.200q: want http(s)://HOST:PORT/v1/streams/NAME", s.URL)
	}
	if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		return fmt.Errorf("settings.url %.200q: no query or fragment: the follower asks for ?after= itself", s.URL)
	}
	if u.User != nil {
		return errors.New("settings.url: no credentials in the URL (they would be shown wherever it is): give the remote API's token in settings.token")
	}
	if name, ok := strings.CutPrefix(s.Token, "env:"); ok && name == "" {
		return errors.New("settings.token: env: names no variable")
	}
	if s.Reply != nil {
		if err := s.Reply.Validate("settings.reply"); err != nil {
			return err
		}
	}
	return redirect.Validate("settings.redirects", s.Redirects)
}

// StreamName returns the NAME of the URL's /v1/streams/NAME (or
// /v1/streams/NAME/events), "" when its path is not one.
func (s Settings) StreamName() string {
	u, err := url.Parse(s.URL)
	if err != nil {
		return ""
	}
	name, ok := strings.CutPrefix(strings.TrimSuffix(strings.TrimSuffix(u.Path, "/"), "/events"), "/v1/streams/")
	if !ok || strings.Contains(name, "/") {
		return ""
	}
	return name
}

// resolveToken returns token, or the value of the environment variable
// NAME for "env:NAME".
func resolveToken(token string) (string, error) {
	name, ok := strings.CutPrefix(token, "env:")
	if !ok {
		return token, nil
	}
	tok, set := os.LookupEnv(name)
	if !set {
		return "", fmt.Errorf("feed token: the environment variable %s is not set", name)
	}
	return tok, nil
}
