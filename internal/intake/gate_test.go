package intake_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/intake"
)

// TestGate: the gate is open until it is armed and has a store; armed,
// it refuses the events of a source that was deleted, naming it, and
// keeps its answer until it is told to forget it (or its TTL passes).
func TestGate(t *testing.T) {
	e := open(t, sqliteStore, openOptions{})
	ctx := context.Background()
	g := intake.NewGate("devices", time.Hour, nil)
	if err := g.Check(); err != nil {
		t.Fatalf("an unarmed gate: %v", err)
	}
	g.Arm()
	if err := g.Check(); err != nil {
		t.Fatalf("a gate without a store: %v", err)
	}
	g.Use(e.st)
	g.Forget()
	if err := g.Check(); err == nil || !strings.Contains(err.Error(), `source "devices" was deleted`) {
		t.Fatalf("a source that does not exist: %v, want it named deleted", err)
	}
	if _, _, err := e.st.CreateSource(ctx, intake.Source{Name: "devices", Kind: intake.KindDevice}); err != nil {
		t.Fatal(err)
	}
	if err := g.Check(); err == nil {
		t.Fatal("the gate read the store again within its TTL, unasked")
	}
	g.Forget()
	if err := g.Check(); err != nil {
		t.Fatalf("the source created again: %v", err)
	}
}
