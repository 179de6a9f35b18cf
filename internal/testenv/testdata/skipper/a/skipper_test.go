// Package a has tests that need services, for testenv's test of
// the skip summary.
package a

import (
	"testing"

	"github.com/postbox-events/postbox/internal/testenv"
)

func TestNeedsPostgres(t *testing.T) { testenv.URL(t, testenv.Postgres) }
func TestNeedsRedis(t *testing.T)    { testenv.URL(t, testenv.Redis) }

func TestNeedsBoth(t *testing.T) {
	t.Run("postgres", func(t *testing.T) { testenv.URL(t, testenv.Postgres) })
	t.Run("nats", func(t *testing.T) { testenv.URL(t, testenv.NATS) })
}

func TestNeedsNothing(t *testing.T) {}
