//go:build !unix

package agent

// lockOutbox does nothing where flock is not available.
func lockOutbox(path string) (release func(), err error) { return func() {}, nil }
