package main

import (
	"flag"
	"fmt"
	"log/slog"
	"math"
	"runtime/debug"
	"strconv"
	"strings"
)

// memoryLimitBase is what serve's default memory limit allows besides the
// ingress budget, the writer queue and the poll and feed sources' budget: the runtime, the HTTP API, the
// webhooks being read and the workers' deliveries. The limit bounds the Go
// runtime's memory; the process has its code (about 30 MB resident) and
// SQLite's page caches besides.
const memoryLimitBase = 32 << 20

// memoryLimit is a flag.Value for a soft memory limit in GOMEMLIMIT's
// syntax: a whole number of bytes with an optional unit B, KiB, MiB, GiB or
// TiB, or off.
type memoryLimit struct {
	bytes int64 // math.MaxInt64 for off
	set   bool
}

func (m *memoryLimit) String() string {
	switch {
	case !m.set:
		return ""
	case m.bytes == math.MaxInt64:
		return "off"
	}
	return strconv.FormatInt(m.bytes, 10)
}

func (m *memoryLimit) Set(s string) error {
	if strings.TrimSpace(s) == "off" {
		m.bytes, m.set = math.MaxInt64, true
		return nil
	}
	num, unit := s, int64(1)
	for _, u := range []struct {
		suffix string
		n      int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"B", 1}} {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			num, unit = n, u.n
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/unit {
		return fmt.Errorf("%q is not a memory limit: use bytes with an optional unit (B, KiB, MiB, GiB, TiB), e.g. 512MiB, or off", s)
	}
	m.bytes, m.set = n*unit, true
	return nil
}

// setMemoryLimit sets the Go runtime's soft memory limit to the flag's
// value when it is set (from --memory-limit, POSTBOX_MEMORY_LIMIT or
// GOMEMLIMIT), else to def, and logs it with where it came from.
func setMemoryLimit(log *slog.Logger, fs *flag.FlagSet, m memoryLimit, def int64) {
	limit, from := def, "default: --ws-buffer-bytes + --queue-bytes + --source-buffer-bytes + 32 MiB"
	if m.set {
		limit, from = m.bytes, flagSource(fs, "memory-limit")
	}
	debug.SetMemoryLimit(limit)
	if limit == math.MaxInt64 {
		log.Info("postbox serve: no memory limit", "from", from)
		return
	}
	log.Info("postbox serve: memory limit", "limit", formatBytes(limit), "from", from)
}

// formatBytes writes n in the largest binary unit that divides it.
func formatBytes(n int64) string {
	for _, u := range []struct {
		suffix string
		n      int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.n && n%u.n == 0 {
			return strconv.FormatInt(n/u.n, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}
