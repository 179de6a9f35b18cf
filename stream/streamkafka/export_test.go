package streamkafka

// SetHooks sets functions Append calls before it produces and before it
// settles; an error from one ends the Append there, as a crash would.
func SetHooks(b *Backend, beforeProduce, beforeSettle func() error) {
	b.beforeProduce, b.beforeSettle = beforeProduce, beforeSettle
}
