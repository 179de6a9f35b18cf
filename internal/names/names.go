// Package names is the rule for what postbox's users name: subscriptions,
// inboxes, sources and streams. A name is a step of the API's paths and
// of the CLI's arguments, so the rule is one for them all.
package names

import (
	"regexp"
	"strings"
)

var pattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

// Valid reports whether s may name a subscription, inbox, source or
// stream: 1 to 128 of A-Z a-z 0-9 . _ -, and not dots alone ("." and ".."
// would be steps of a path, not a name in it).
func Valid(s string) bool { return pattern.MatchString(s) && strings.Trim(s, ".") != "" }

// Rule says what Valid takes, for messages.
const Rule = "use 1 to 128 of A-Z a-z 0-9 . _ -, not dots alone"
