//go:build !race

package testenv

// Race reports whether the race detector is on: timing tests size their
// work by it, since it slows some code several times over.
const Race = false
