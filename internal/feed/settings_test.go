package feed_test

import (
	"errors"
	"testing"

	"github.com/postbox-events/postbox/internal/feed"
	"github.com/postbox-events/postbox/internal/replyto"
)

func TestSettings(t *testing.T) {
	for _, s := range []feed.Settings{
		{URL: "http://edge:8000/v1/streams/devices"},
		{URL: "https://edge/v1/streams/devices/events", Token: "env:EDGE_TOKEN"},
		{URL: "https://edge/v1/streams/devices", Reply: &replyto.Settings{Headers: map[string]string{"Authorization": "env:TOKEN"}}},
	} {
		if err := s.Validate(); err != nil {
			t.Errorf("%+v: %v", s, err)
		}
	}
	for _, s := range []feed.Settings{
		{}, {URL: "ftp://edge/v1/streams/devices"}, {URL: "http://edge:8000/"}, {URL: "http:///v1/streams/x"},
		{URL: "http://edge/v1/streams/devices", Token: "env:"},
		{URL: "http://edge/v1/streams/devices?after=5"}, {URL: "http://edge/v1/streams/devices#x"},
		{URL: "http://edge/v1/streams/devices?"}, {URL: "http://me:pw@edge/v1/streams/devices"},
		{URL: "http://edge/v1/streams/x/y"}, {URL: "http://edge/v1/streams/"},
		{URL: "http://edge/v1/streams/devices", Reply: &replyto.Settings{Headers: map[string]string{"Content-Length": "1"}}},
	} {
		if err := s.Validate(); err == nil {
			t.Errorf("%+v: taken", s)
		}
	}
	if err := (feed.Settings{}).Validate(); !errors.Is(err, feed.ErrRequired) {
		t.Errorf("no url: %v, want %v", err, feed.ErrRequired)
	}
	for url, want := range map[string]string{
		"http://edge/v1/streams/devices": "devices", "http://edge/v1/streams/devices/events/": "devices",
		"http://edge/v1/streams/a%2Fb": "", "http://edge/v2/streams/devices": "",
	} {
		if got := (feed.Settings{URL: url}).StreamName(); got != want {
			t.Errorf("StreamName of %s = %q, want %q", url, got, want)
		}
	}
	t.Setenv("FEED_TEST_TOKEN", "s3cret")
	if tok, err := feed.ResolveToken("env:FEED_TEST_TOKEN"); err != nil || tok != "s3cret" {
		t.Errorf("env token: %q %v", tok, err)
	}
	if _, err := feed.ResolveToken("env:FEED_TEST_UNSET"); err == nil {
		t.Error("an unset variable resolved")
	}
	if tok, _ := feed.ResolveToken("plain"); tok != "plain" {
		t.Errorf("plain token: %q", tok)
	}
}
