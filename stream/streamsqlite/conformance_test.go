package streamsqlite_test

import (
	"path/filepath"
	"testing"

	"github.com/postbox-events/postbox/stream"
	"github.com/postbox-events/postbox/stream/streamsqlite"
	"github.com/postbox-events/postbox/stream/streamtest"
)

func TestConformance(t *testing.T) {
	dir := t.TempDir()
	streamtest.Run(t, streamtest.Features{}, func(t *testing.T, name string) stream.Backend {
		return start(t, filepath.Join(dir, name+".db"), streamsqlite.Config{})
	})
}
