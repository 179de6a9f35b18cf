package streamkafka

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"embed"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/postbox-events/postbox/internal/pgmigrate"
	"github.com/postbox-events/postbox/internal/sqlitedb"
)

//go:embed migrations
var migrations embed.FS

// Migrations of the identity index, for users who run migrations with
// their own tool: SQLiteMigrations for a SQLite file, PostgresMigrations
// for PostgreSQL (applied with Config.IndexSchema first in search_path).
var (
	SQLiteMigrations   fs.FS = pgmigrate.Dir(migrations, "migrations/sqlite")
	PostgresMigrations fs.FS = pgmigrate.Dir(migrations, "migrations/postgres")
)

// indexComponent names the index's migrations in schema_migrations
// (SQLite) and postbox_migrations (PostgreSQL).
const indexComponent = "streamkafka"

var schemaName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// index is the identity index: the streams and one row per identity (see
// the package doc). Its queries are written once, for SQLite, with ? for
// parameters, {s}. before table names and {now} for the database's clock
// in unix microseconds; q rewrites them for PostgreSQL.
type index struct {
	db     *sql.DB
	pool   *pgxpool.Pool // PostgreSQL only
	pg     bool
	prefix string               // what {s}. becomes
	now    string               // what {now} becomes
	stmts  map[string]*sql.Stmt // SQLite: prepared statements, by query text; read-only after open
}

// isPostgres reports whether Config.Index names a PostgreSQL database.
func isPostgres(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

// openIndex opens (creating and migrating) the index named by cfg.Index.
func openIndex(ctx context.Context, cfg Config) (*index, error) {
	if !isPostgres(cfg.Index) {
		db, err := sqlitedb.Open(cfg.Index, sqlitedb.Options{})
		if err != nil {
			return nil, err
		}
		if err := sqlitedb.Migrate(ctx, db, indexComponent, SQLiteMigrations); err != nil {
			db.Close()
			return nil, err
		}
		// SQLite's clock is the process's: the one clock of one node.
		x := &index{db: db, now: `CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER)`}
		if err := x.prepare(ctx); err != nil {
			db.Close()
			return nil, err
		}
		return x, nil
	}
	if !schemaName.MatchString(cfg.IndexSchema) {
		return nil, fmt.Errorf("index schema %q: want letters, digits and _, at most 63 bytes, not starting with a digit", cfg.IndexSchema)
	}
	pool, err := pgxpool.New(ctx, cfg.Index)
	if err != nil {
		return nil, fmt.Errorf("index: %w", err)
	}
	if err := pgmigrate.Apply(ctx, pool, indexComponent, PostgresMigrations, cfg.IndexSchema); err != nil {
		pool.Close()
		return nil, fmt.Errorf("index: schema %s: %w", cfg.IndexSchema, err)
	}
	return &index{
		db: stdlib.OpenDBFromPool(pool), pool: pool, pg: true,
		prefix: pgx.Identifier{cfg.IndexSchema}.Sanitize() + ".",
		// The database's clock: every process sharing the index compares
		// claims against the same one.
		now: `CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000 AS BIGINT)`,
	}, nil
}

func (x *index) close() error {
	err := x.db.Close()
	if x.pool != nil {
		x.pool.Close()
	}
	return err
}

// q rewrites a query for the index's database.
func (x *index) q(query string) string {
	query = strings.ReplaceAll(query, "{s}.", x.prefix)
	query = strings.ReplaceAll(query, "{now}", x.now)
	if x.pg {
		query = sqlitedb.Rebind(query)
	}
	return query
}

// tx runs fn in one transaction.
func (x *index) tx(ctx context.Context, fn func(*sql.Tx) error) error {
	tx, err := x.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// micros and fromMicros convert times to the index's unix microseconds.
func micros(t time.Time) int64 { return t.UnixMicro() }
func fromMicros(us int64) time.Time {
	return time.UnixMicro(us).UTC()
}

// streamRow is a row of kafka_streams.
type streamRow struct {
	id, topic string
	created   time.Time
}

// addStream inserts the row of a stream unless there is one, and returns
// the row the index holds.
func (x *index) addStream(ctx context.Context, id, topic string, created time.Time) (streamRow, error) {
	if _, err := x.db.ExecContext(ctx, x.q(`INSERT INTO {s}.kafka_streams (stream_id, topic, created_at) VALUES (?, ?, ?)
		ON CONFLICT (stream_id) DO NOTHING`), id, topic, micros(created)); err != nil {
		return streamRow{}, fmt.Errorf("index: add stream %s: %w", id, err)
	}
	r, ok, err := x.stream(ctx, id)
	if err == nil && !ok {
		err = fmt.Errorf("index: stream %s not there after its insert", id)
	}
	return r, err
}

// stream returns the row of stream id, if there is one.
func (x *index) stream(ctx context.Context, id string) (streamRow, bool, error) {
	r := streamRow{id: id}
	var created int64
	err := x.db.QueryRowContext(ctx, x.q(`SELECT topic, created_at FROM {s}.kafka_streams WHERE stream_id = ?`), id).Scan(&r.topic, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return r, false, nil
	}
	if err != nil {
		return r, false, fmt.Errorf("index: stream %s: %w", id, err)
	}
	r.created = fromMicros(created)
	return r, true, nil
}

// streams returns every stream, by id.
func (x *index) streams(ctx context.Context) ([]streamRow, error) {
	rows, err := x.db.QueryContext(ctx, x.q(`SELECT stream_id, topic, created_at FROM {s}.kafka_streams ORDER BY stream_id`))
	if err != nil {
		return nil, fmt.Errorf("index: streams: %w", err)
	}
	defer rows.Close()
	var out []streamRow
	for rows.Next() {
		var r streamRow
		var created int64
		if err := rows.Scan(&r.id, &r.topic, &created); err != nil {
			return nil, fmt.Errorf("index: streams: %w", err)
		}
		r.created = fromMicros(created)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("index: streams: %w", err)
	}
	return out, nil
}

// identity is an event's identity within a stream.
type identity struct{ nativeID, variant string }

// idRow is a row of kafka_identities.
type idRow struct {
	identity
	typ        string
	hash       []byte
	offset     int64 // 0 while claimed
	storedAt   time.Time
	claimedAt  int64 // unix microseconds
	claimUntil int64
	token      string
	now        int64 // the index's clock when the row was read
}

func (r *idRow) stored() bool { return r.offset > 0 }

// expired reports whether r is a claim whose time is up.
func (r *idRow) expired() bool { return !r.stored() && r.claimUntil <= r.now }

// payloadHash is what the index keeps of a payload.
func payloadHash(p []byte) []byte {
	sum := sha256.Sum256(p)
	return sum[:]
}

func newToken() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// maxChunk is the most rows one statement names. A statement names a
// power of two of rows, up to maxChunk, the last row repeated to fill it
// (a repeated row changes nothing in any of the statements), so that
// there are few statement texts and each is prepared once: SQLite spends
// more time parsing a long statement, and binding its parameters (the
// driver matches each parameter with a scan of the arguments), than
// running it.
const maxChunk = 64

// chunks splits n rows into statement sizes: the rows [start, start+take)
// go into a statement of size rows.
func chunks(n int, fn func(start, take, size int) error) error {
	for start := 0; start < n; {
		take := min(n-start, maxChunk)
		size := 1
		for size < take {
			size *= 2
		}
		if err := fn(start, take, size); err != nil {
			return err
		}
		start += take
	}
	return nil
}

// selectSQL reads identity rows with the settle of their round, if any.
func selectSQL(n int) string {
	return `SELECT i.native_id, i.variant, i.type, i.payload_sha256, i.event_offset, i.stored_at, i.claimed_at, i.claim_until,
		i.claim_token, i.claim_pos, s.first_offset, s.stored_at, s.offsets, {now}
		FROM {s}.kafka_identities i LEFT JOIN {s}.kafka_settles s ON s.claim_token = i.claim_token AND i.event_offset IS NULL
		WHERE i.stream_id = ? AND i.native_id IN (` + placeholders(n) + `)`
}

// insertSQL names the stream, the claim's timeout and token once, and
// each row's own columns after them: the fewer parameters, the less
// binding costs (see maxChunk).
func (x *index) insertSQL(n int) string {
	var b strings.Builder
	b.WriteString(`INSERT INTO {s}.kafka_identities (stream_id, native_id, variant, type, payload_sha256, claimed_at, claim_until, claim_token, claim_pos)
		SELECT c.column1, v.column1, v.column2, v.column3, v.column4, {now}, {now} + c.column2, c.column3, v.column5
		FROM (VALUES (CAST(? AS TEXT), CAST(? AS BIGINT), CAST(? AS TEXT))) AS c, (VALUES `)
	for i := range n {
		if i > 0 {
			b.WriteString(`, (?, ?, ?, ?, ?)`)
			continue
		}
		b.WriteString(`(CAST(? AS TEXT), CAST(? AS TEXT), CAST(? AS TEXT), ` + x.blobCast() + `, CAST(? AS BIGINT))`)
	}
	b.WriteString(`) AS v WHERE true ON CONFLICT (stream_id, native_id, variant) DO NOTHING`)
	return b.String()
}

func (x *index) settleSQL(n int) string {
	var b strings.Builder
	b.WriteString(`UPDATE {s}.kafka_identities SET event_offset = v.column3, stored_at = v.column4,
		type = COALESCE(v.column5, kafka_identities.type), payload_sha256 = COALESCE(v.column6, kafka_identities.payload_sha256),
		claimed_at = NULL, claim_until = NULL, claim_token = NULL
		FROM (VALUES `)
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(`(?, ?, CAST(? AS BIGINT), CAST(? AS BIGINT), CAST(? AS TEXT), ` + x.blobCast() + `)`)
	}
	b.WriteString(`) AS v WHERE kafka_identities.stream_id = ? AND kafka_identities.native_id = v.column1
		AND kafka_identities.variant = v.column2 AND kafka_identities.claim_token = ?`)
	return b.String()
}

// prepare prepares the statements Append runs, in every size, on
// SQLite's one connection: a transaction then runs them without parsing
// them again.
func (x *index) prepare(ctx context.Context) error {
	x.stmts = map[string]*sql.Stmt{}
	for size := 1; size <= maxChunk; size *= 2 {
		qs := []string{selectSQL(size), x.insertSQL(size), x.settleSQL(size)}
		if size == 1 {
			qs = append(qs, settleRoundSQL)
		}
		for _, q := range qs {
			q = x.q(q)
			st, err := x.db.PrepareContext(ctx, q)
			if err != nil {
				return fmt.Errorf("prepare %.60s...: %w", q, err)
			}
			x.stmts[q] = st
		}
	}
	return nil
}

// query runs query (not yet rewritten by q) on tx, prepared if it was.
func (x *index) query(ctx context.Context, tx queryer, query string, args ...any) (*sql.Rows, error) {
	query = x.q(query)
	if st := x.stmts[query]; st != nil {
		if tx, ok := tx.(*sql.Tx); ok {
			return tx.StmtContext(ctx, st).QueryContext(ctx, args...)
		}
		return st.QueryContext(ctx, args...)
	}
	return tx.QueryContext(ctx, query, args...)
}

func (x *index) exec(ctx context.Context, tx *sql.Tx, query string, args ...any) (sql.Result, error) {
	query = x.q(query)
	if st := x.stmts[query]; st != nil {
		return tx.StmtContext(ctx, st).ExecContext(ctx, args...)
	}
	return tx.ExecContext(ctx, query, args...)
}

// rows returns the rows of ids in streamID that the index holds.
func (x *index) rows(ctx context.Context, q queryer, streamID string, ids []identity) (map[identity]*idRow, error) {
	out := make(map[identity]*idRow, len(ids))
	var native []string
	seen := make(map[string]bool, len(ids))
	for _, id := range ids {
		if !seen[id.nativeID] {
			seen[id.nativeID] = true
			native = append(native, id.nativeID)
		}
	}
	rounds := map[string][]int64{} // the offsets of a settle, by token
	err := chunks(len(native), func(start, take, size int) error {
		args := make([]any, 0, size+1)
		args = append(args, streamID)
		for k := range size {
			args = append(args, native[start+min(k, take-1)])
		}
		rs, err := x.query(ctx, q, selectSQL(size), args...)
		if err != nil {
			return err
		}
		defer rs.Close()
		for rs.Next() {
			r := &idRow{}
			var offset, storedAt, claimedAt, claimUntil, pos, first, settledAt sql.NullInt64
			var token sql.NullString
			var packed []byte
			if err := rs.Scan(&r.nativeID, &r.variant, &r.typ, &r.hash, &offset, &storedAt, &claimedAt, &claimUntil,
				&token, &pos, &first, &settledAt, &packed, &r.now); err != nil {
				return err
			}
			r.offset, r.claimedAt, r.claimUntil, r.token = offset.Int64, claimedAt.Int64, claimUntil.Int64, token.String
			if storedAt.Valid {
				r.storedAt = fromMicros(storedAt.Int64)
			}
			if !offset.Valid && first.Valid && pos.Valid {
				offs, ok := rounds[r.token]
				if !ok {
					if offs, err = unpackOffsets(first.Int64, packed); err != nil {
						return fmt.Errorf("settle of claim %s: %w", r.token, err)
					}
					rounds[r.token] = offs
				}
				if p := pos.Int64; p >= 0 && p < int64(len(offs)) && offs[p] > 0 {
					r.offset, r.storedAt = offs[p], fromMicros(settledAt.Int64)
				}
			}
			out[r.identity] = r
		}
		return rs.Err()
	})
	return out, err
}

// queryer is a *sql.DB or a *sql.Tx.
type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

// claimRequest is an identity to claim, with what the claimer will store.
type claimRequest struct {
	identity
	typ  string
	hash []byte
	pos  int // the event's position in its Append call
}

// insertClaims inserts a claim row for each of reqs that the index does
// not hold, and returns how many it inserted (another transaction may
// have inserted some meanwhile). reqs are distinct.
func (x *index) insertClaims(ctx context.Context, tx *sql.Tx, streamID, token string, timeout time.Duration, reqs []claimRequest) (int, error) {
	inserted := 0
	err := chunks(len(reqs), func(start, take, size int) error {
		args := make([]any, 0, 3+size*5)
		args = append(args, streamID, timeout.Microseconds(), token)
		for k := range size {
			r := &reqs[start+min(k, take-1)]
			args = append(args, r.nativeID, r.variant, r.typ, r.hash, int64(r.pos))
		}
		res, err := x.exec(ctx, tx, x.insertSQL(size), args...)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		inserted += int(n)
		return err
	})
	return inserted, err
}

// takeOver claims the row of an expired claim, held by oldToken, for
// token; false when someone else took it first, or its round settled
// meanwhile.
func (x *index) takeOver(ctx context.Context, tx *sql.Tx, streamID, token string, timeout time.Duration, r claimRequest, oldToken string) (bool, error) {
	res, err := tx.ExecContext(ctx, x.q(`UPDATE {s}.kafka_identities
		SET type = ?, payload_sha256 = ?, claimed_at = {now}, claim_until = {now} + ?, claim_token = ?, claim_pos = ?
		WHERE stream_id = ? AND native_id = ? AND variant = ? AND event_offset IS NULL AND claim_token = ? AND claim_until <= {now}
		AND NOT EXISTS (SELECT 1 FROM {s}.kafka_settles WHERE claim_token = ?)`),
		r.typ, r.hash, timeout.Microseconds(), token, int64(r.pos), streamID, r.nativeID, r.variant, oldToken, oldToken)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// settled is what settle writes of one identity.
type settled struct {
	identity
	offset   int64 // 0: delete the claim (the event was refused)
	storedAt time.Time
	typ      string // the record's, when it differs from the claim's
	hash     []byte
	pos      int  // the event's position in its Append call
	own      bool // written into its own row, not its round's settle
}

// settle writes what a round of token stored, in one transaction. When
// whole (every event the round produced was acknowledged or refused),
// the events it produced are settled by one row of kafka_settles: their
// offsets by position, and their stored time, which they share. Else,
// and for the events marked own (found in the topic after a takeover),
// each offset and stored time is written into the identity's row. The
// claims of refused events are deleted.
func (x *index) settle(ctx context.Context, streamID, token string, done []settled, whole bool) error {
	var round, own, drop []settled
	for _, s := range done {
		switch {
		case s.offset == 0:
			drop = append(drop, s)
		case s.own || !whole:
			own = append(own, s)
		default:
			round = append(round, s)
		}
	}
	for _, s := range round {
		if !s.storedAt.Equal(round[0].storedAt) {
			own, round = append(own, round...), nil // not one stamp: cannot happen, but stay true
			break
		}
	}
	slices.SortFunc(round, func(a, b settled) int { return cmp.Compare(a.pos, b.pos) })
	return x.tx(ctx, func(tx *sql.Tx) error {
		if len(round) > 0 {
			first, last, packed := packOffsets(round)
			if _, err := x.exec(ctx, tx, settleRoundSQL, token, streamID, first, last, micros(round[0].storedAt), packed, packIdentities(round)); err != nil {
				return err
			}
		}
		err := chunks(len(own), func(start, take, size int) error {
			args := make([]any, 0, size*6+2)
			for k := range size {
				s := &own[start+min(k, take-1)]
				var typ, hash any
				if s.typ != "" {
					typ = s.typ
				}
				if s.hash != nil {
					hash = s.hash
				}
				args = append(args, s.nativeID, s.variant, s.offset, micros(s.storedAt), typ, hash)
			}
			args = append(args, streamID, token)
			_, err := x.exec(ctx, tx, x.settleSQL(size), args...)
			return err
		})
		if err != nil {
			return err
		}
		for _, s := range drop {
			if _, err := tx.ExecContext(ctx, x.q(`DELETE FROM {s}.kafka_identities
				WHERE stream_id = ? AND native_id = ? AND variant = ? AND claim_token = ? AND event_offset IS NULL`),
				streamID, s.nativeID, s.variant, token); err != nil {
				return err
			}
		}
		return nil
	})
}

const settleRoundSQL = `INSERT INTO {s}.kafka_settles (claim_token, stream_id, first_offset, last_offset, stored_at, offsets, identities)
	VALUES (?, ?, ?, ?, ?, ?, ?)`

// packOffsets returns the lowest and highest offsets of round, and its
// offsets by position: for each position from 0 to the highest,
// uvarint(offset - first + 1), or 0 where no event of round is.
func packOffsets(round []settled) (first, last int64, packed []byte) {
	first, last = round[0].offset, round[0].offset
	top := 0
	for _, s := range round {
		first, last, top = min(first, s.offset), max(last, s.offset), max(top, s.pos)
	}
	byPos := make([]int64, top+1)
	for _, s := range round {
		byPos[s.pos] = s.offset - first + 1
	}
	packed = make([]byte, 0, len(byPos)*2)
	for _, d := range byPos {
		packed = binary.AppendUvarint(packed, uint64(d))
	}
	return first, last, packed
}

// packIdentities returns the identities of round, for Trim: native id
// and variant of each, as uvarint lengths and bytes, in round's order
// (by position).
func packIdentities(round []settled) []byte {
	n := 0
	for _, s := range round {
		n += len(s.nativeID) + len(s.variant) + 2
	}
	packed := make([]byte, 0, n)
	for _, s := range round {
		packed = binary.AppendUvarint(packed, uint64(len(s.nativeID)))
		packed = append(packed, s.nativeID...)
		packed = binary.AppendUvarint(packed, uint64(len(s.variant)))
		packed = append(packed, s.variant...)
	}
	return packed
}

// unpackIdentities returns the identities packIdentities packed.
func unpackIdentities(packed []byte) ([]identity, error) {
	var out []identity
	next := func() (string, error) {
		n, k := binary.Uvarint(packed)
		if k <= 0 || n > uint64(len(packed)-k) {
			return "", errors.New("identities: bad length")
		}
		v := string(packed[k : k+int(n)])
		packed = packed[k+int(n):]
		return v, nil
	}
	for len(packed) > 0 {
		var id identity
		var err error
		if id.nativeID, err = next(); err != nil {
			return nil, err
		}
		if id.variant, err = next(); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, nil
}

// unpackOffsets returns the offsets packOffsets packed, by position, 0
// where there is none.
func unpackOffsets(first int64, packed []byte) ([]int64, error) {
	var out []int64
	for len(packed) > 0 {
		d, n := binary.Uvarint(packed)
		if n <= 0 {
			return nil, errors.New("offsets: bad uvarint")
		}
		packed = packed[n:]
		if d == 0 {
			out = append(out, 0)
		} else {
			out = append(out, first+int64(d)-1)
		}
	}
	return out, nil
}

func (x *index) blobCast() string {
	if x.pg {
		return `CAST(? AS BYTEA)`
	}
	return `CAST(? AS BLOB)`
}

// deleteBelow deletes the rows of streamID's events below offset: those
// settled in their own row, those of settles wholly below it with those
// settles, and those below it of a settle that straddles it (the settle
// stays, for the rest). A settle names its identities: a row of one that
// is no longer the settle's (trimmed and appended again) is not deleted.
func (x *index) deleteBelow(ctx context.Context, streamID string, offset int64) error {
	return x.tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, x.q(`DELETE FROM {s}.kafka_identities WHERE stream_id = ? AND event_offset < ?`), streamID, offset); err != nil {
			return err
		}
		type below struct {
			token string
			whole bool
			ids   []identity
		}
		var settles []below
		rs, err := tx.QueryContext(ctx, x.q(`SELECT claim_token, first_offset, last_offset, offsets, identities FROM {s}.kafka_settles
			WHERE stream_id = ? AND first_offset < ?`), streamID, offset)
		if err != nil {
			return err
		}
		for rs.Next() {
			var s below
			var first, last int64
			var offsets, identities []byte
			if err := rs.Scan(&s.token, &first, &last, &offsets, &identities); err != nil {
				rs.Close()
				return err
			}
			s.whole = last < offset
			ids, err := unpackIdentities(identities)
			if err != nil {
				rs.Close()
				return fmt.Errorf("settle of claim %s: %w", s.token, err)
			}
			if s.whole {
				s.ids = ids
			} else {
				offs, err := unpackOffsets(first, offsets)
				if err != nil {
					rs.Close()
					return fmt.Errorf("settle of claim %s: %w", s.token, err)
				}
				// The identities are in position order, as the offsets
				// that are not 0.
				k := 0
				for _, o := range offs {
					if o == 0 {
						continue
					}
					if k >= len(ids) {
						break
					}
					if o < offset {
						s.ids = append(s.ids, ids[k])
					}
					k++
				}
			}
			settles = append(settles, s)
		}
		rs.Close()
		if err := rs.Err(); err != nil {
			return err
		}
		if len(settles) == 0 {
			return nil
		}
		del, err := tx.PrepareContext(ctx, x.q(`DELETE FROM {s}.kafka_identities
			WHERE stream_id = ? AND native_id = ? AND variant = ? AND claim_token = ? AND event_offset IS NULL`))
		if err != nil {
			return err
		}
		defer del.Close()
		for _, s := range settles {
			for _, id := range s.ids {
				if _, err := del.ExecContext(ctx, streamID, id.nativeID, id.variant, s.token); err != nil {
					return err
				}
			}
			if s.whole {
				if _, err := tx.ExecContext(ctx, x.q(`DELETE FROM {s}.kafka_settles WHERE claim_token = ?`), s.token); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// renew moves the claims token holds on ids to end ClaimTimeout from now.
func (x *index) renew(ctx context.Context, streamID, token string, timeout time.Duration, ids []identity) error {
	return x.tx(ctx, func(tx *sql.Tx) error {
		for _, id := range ids {
			if _, err := tx.ExecContext(ctx, x.q(`UPDATE {s}.kafka_identities SET claim_until = {now} + ?
				WHERE stream_id = ? AND native_id = ? AND variant = ? AND claim_token = ? AND event_offset IS NULL`),
				timeout.Microseconds(), streamID, id.nativeID, id.variant, token); err != nil {
				return err
			}
		}
		return nil
	})
}
