package main

import (
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"

	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
)

// SQLiteSchema is a watermill-sql SchemaAdapter for SQLite, which
// watermill-sql (v4.1.2) has none of: the smallest one that writes as its
// default MySQL and PostgreSQL adapters do. A table per topic with an
// integer offset key, the message's uuid, a creation time, the payload
// and the metadata as JSON, no other index; one multi-row INSERT per
// Publish call, three values bound per message. Only the publishing side
// is written: SelectQuery and UnmarshalMessage (the subscriber's) fail.
type SQLiteSchema struct{}

var topicName = regexp.MustCompile(`^[A-Za-z0-9_]+$`)

// MessagesTable is the table of topic's messages.
func (SQLiteSchema) MessagesTable(topic string) string { return "watermill_" + topic }

func (s SQLiteSchema) SchemaInitializingQueries(p wmsql.SchemaInitializingQueriesParams) ([]wmsql.Query, error) {
	if !topicName.MatchString(p.Topic) {
		return nil, fmt.Errorf("topic %q: letters, digits and _ only", p.Topic)
	}
	// As MySQL's AUTO_INCREMENT key and PostgreSQL's BIGSERIAL; no
	// AUTOINCREMENT keyword, which would update sqlite_sequence on every
	// insert.
	return []wmsql.Query{{Query: `CREATE TABLE IF NOT EXISTS ` + s.MessagesTable(p.Topic) + ` (
		"offset"   INTEGER PRIMARY KEY,
		uuid       TEXT NOT NULL,
		created_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP,
		payload    BLOB,
		metadata   TEXT
	)`}}, nil
}

func (s SQLiteSchema) InsertQuery(p wmsql.InsertQueryParams) (wmsql.Query, error) {
	args := make([]any, 0, 3*len(p.Msgs))
	for _, msg := range p.Msgs {
		metadata, err := json.Marshal(msg.Metadata)
		if err != nil {
			return wmsql.Query{}, fmt.Errorf("could not marshal metadata into JSON for message %s: %w", msg.UUID, err)
		}
		args = append(args, msg.UUID, []byte(msg.Payload), metadata)
	}
	q := `INSERT INTO ` + s.MessagesTable(p.Topic) + ` (uuid, payload, metadata) VALUES ` +
		strings.TrimSuffix(strings.Repeat("(?,?,?),", len(p.Msgs)), ",")
	return wmsql.Query{Query: q, Args: args}, nil
}

var errPublishOnly = errors.New("the SQLite schema adapter of this benchmark only publishes")

func (SQLiteSchema) SelectQuery(wmsql.SelectQueryParams) (wmsql.Query, error) {
	return wmsql.Query{}, errPublishOnly
}

func (SQLiteSchema) UnmarshalMessage(wmsql.UnmarshalMessageParams) (wmsql.Row, error) {
	return wmsql.Row{}, errPublishOnly
}

func (SQLiteSchema) SubscribeIsolationLevel() sql.IsolationLevel { return sql.LevelDefault }
