package budget_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/budget"
)

// TestReserve: readers that filled the main part wait; one at a time may
// use the reserve and finish, and what is given back lets the others go
// on. A wait ends with its context.
func TestReserve(t *testing.T) {
	var gauge atomic.Int64
	b := budget.New(100, 40, func(d int64) { gauge.Add(d) })
	a, c := new(int), new(int)
	if !b.TryTake(30, a) || !b.TryTake(30, c) {
		t.Fatal("60 of the main 60 not taken")
	}
	if !b.TryTake(40, a) {
		t.Fatal("a could not use the reserve")
	}
	if b.TryTake(1, c) {
		t.Fatal("c took from the reserve a holds, over the budget")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := b.Take(ctx, 10, c); err == nil {
		t.Fatal("c took 10 while the budget was full")
	}
	done := make(chan error, 1)
	go func() { done <- b.Take(context.Background(), 40, c) }()
	b.Done(a)
	b.Give(70) // a stored what it read
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if u := b.Used(); u != 70 || gauge.Load() != 70 {
		t.Fatalf("used %d (gauge %d), want 70", u, gauge.Load())
	}
	var nilBudget *budget.Budget
	if !nilBudget.TryTake(1<<40, a) || nilBudget.Take(ctx, 1<<40, a) != nil || nilBudget.Reserve() != 0 {
		t.Error("a nil budget bounds something")
	}
}
