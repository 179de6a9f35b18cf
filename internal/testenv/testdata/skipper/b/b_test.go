// Package b has a test that needs a service, for testenv's test of the
// skip summary.
package b

import (
	"testing"

	"github.com/postbox-events/postbox/internal/testenv"
)

func TestNeedsPostgres(t *testing.T) { testenv.URL(t, testenv.Postgres) }
