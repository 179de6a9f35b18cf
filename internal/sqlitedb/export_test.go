package sqlitedb

// Cached reports whether query has its prepared statement.
func (c *StmtCache) Cached(query string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stmts[query] != nil
}

// Seen is how many queries the cache has seen.
func (c *StmtCache) Seen() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seen)
}
