package streamsqlite

// SearchSQL is the query Search runs, and its arguments, for EXPLAIN.
var SearchSQL = searchSQL
