package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/fencedrow"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what [FencedTable] writes through: a *pgxpool.Pool, a *pgx.Conn
// or a pgx.Tx.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// FencedTable makes writes to a table whose rows carry a fence column
// conditional on a fencing token: a write lands only when its token is at
// least the row's fence (the last token accepted for that row), and sets
// the row's fence to it. A lower token is refused; an equal one is the
// same holding writing again (tokens are unique per acquisition), and is
// accepted, as [herd.FencedStore] accepts it: docs/locks.md ("Fencing
// tokens") gives the rule and its reason. This is the downstream half of a lock used
// for correctness: a holder that paused past its lease (a GC pause, a
// stalled VM) and wakes up believing it still holds the lock has an older
// token than the holder that took over, and its late write is refused,
// whatever lock handed the tokens out ([Locker], or herd's Redis locks).
//
// The table is the caller's, with a unique key column and a bigint fence
// column (NOT NULL DEFAULT 0 for rows written without a token), such as
// the package doc's CREATE TABLE. Each write is one statement:
//
//	UPDATE t SET col = $3, ..., fence = $2 WHERE id = $1 AND fence <= $2
//
// and, for [FencedTable.Upsert], an INSERT ... ON CONFLICT (id) DO
// UPDATE ... WHERE t.fence <= EXCLUDED.fence, so a fenced write changes
// nothing, not even part of a row. A holding may write a row as often as
// it likes, and a retried write is idempotent; once a newer holding has
// written the row, every later write of the older one is refused. The
// statement is the same in MySQL's dialect but for
// the upsert (INSERT ... ON DUPLICATE KEY UPDATE with IF); this type
// speaks PostgreSQL's.
//
// A FencedTable is a value with no state; it is safe for concurrent use.
type FencedTable struct {
	// Table is the table's name; a dot separates schema and table. Each
	// part is quoted as an identifier.
	Table string
	// ID is the key column. Default: "id".
	ID string
	// Fence is the fence column. Default: "fence".
	Fence string
}

// row is f for the checks that lock/postgres and lock/mysql share.
func (f FencedTable) row() fencedrow.Table {
	return fencedrow.Table{Table: f.Table, ID: f.ID, Fence: f.Fence, Bigint: "bigint"}
}

func (f FencedTable) names() (table, id, fence string) {
	id, fence = f.row().Names()
	return tableIdent(f.Table), pgx.Identifier{id}.Sanitize(), pgx.Identifier{fence}.Sanitize()
}

// Update sets the columns in set on the row whose key is id, and its fence
// to token, only when the row's fence is at most token. It returns nil
// when the row was written; an error wrapping [herd.ErrFenced] when the
// row's fence is above token (a holder with a newer token has written
// it: nothing changed), which gives the row's fence and the token; an
// error wrapping [herd.ErrNotFound] when there is no such
// row; a database error wrapped. An invalid call (an empty Table, no
// column, the key or the fence among the columns, a token of 0 or above
// 2^63−1) is an error, and nothing is sent.
func (f FencedTable) Update(ctx context.Context, db DB, id any, token uint64, set map[string]any) error {
	cols, vals, err := f.row().Prepare("update", token, set)
	if err != nil {
		return err
	}
	table, idCol, fenceCol := f.names()
	var b strings.Builder
	b.WriteString("UPDATE " + table + " SET ")
	for i, c := range cols {
		b.WriteString(pgx.Identifier{c}.Sanitize() + " = $" + strconv.Itoa(i+3) + ", ")
	}
	b.WriteString(fenceCol + " = $2 WHERE " + idCol + " = $1 AND " + fenceCol + " <= $2")
	tag, err := db.Exec(ctx, b.String(), append([]any{id, int64(token)}, vals...)...)
	if err != nil {
		return fmt.Errorf("herd: fenced update of %s %v: %w", f.Table, id, err)
	}
	if tag.RowsAffected() > 0 {
		return nil
	}
	// Nothing written: tell a fenced row from a missing one.
	return f.refused(ctx, db, "update", id, token)
}

// refused explains a write that changed nothing: the row is missing
// ([herd.ErrNotFound]) or its fence is above token ([herd.ErrFenced],
// with both numbers).
func (f FencedTable) refused(ctx context.Context, db DB, op string, id any, token uint64) error {
	table, idCol, fenceCol := f.names()
	var top int64
	err := db.QueryRow(ctx, "SELECT "+fenceCol+" FROM "+table+" WHERE "+idCol+" = $1", id).Scan(&top)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("%w: %s %v", herd.ErrNotFound, f.Table, id)
	case err != nil:
		return fmt.Errorf("herd: fenced %s of %s %v: nothing written; reading its fence: %w", op, f.Table, id, err)
	}
	return fencedrow.Fenced(f.Table, id, token, top)
}

// Upsert is [FencedTable.Update] with an insert path: a missing row is
// inserted with the columns in set and its fence at token; an existing one
// is written only when its fence is at most token. It returns nil when
// the row was written and an error wrapping [herd.ErrFenced] when it was
// not (the row exists with a fence above token; the error gives both).
// It needs a unique index
// or primary key on the key column.
func (f FencedTable) Upsert(ctx context.Context, db DB, id any, token uint64, set map[string]any) error {
	cols, vals, err := f.row().Prepare("upsert", token, set)
	if err != nil {
		return err
	}
	table, idCol, fenceCol := f.names()
	quoted := make([]string, len(cols))
	params := make([]string, len(cols))
	updates := make([]string, len(cols))
	for i, c := range cols {
		quoted[i] = pgx.Identifier{c}.Sanitize()
		params[i] = "$" + strconv.Itoa(i+3)
		updates[i] = quoted[i] + " = EXCLUDED." + quoted[i]
	}
	sql := "INSERT INTO " + table + " AS t (" + idCol + ", " + fenceCol + ", " + strings.Join(quoted, ", ") + ") " +
		"VALUES ($1, $2, " + strings.Join(params, ", ") + ") " +
		"ON CONFLICT (" + idCol + ") DO UPDATE SET " + strings.Join(updates, ", ") + ", " + fenceCol + " = EXCLUDED." + fenceCol +
		" WHERE t." + fenceCol + " <= EXCLUDED." + fenceCol
	tag, err := db.Exec(ctx, sql, append([]any{id, int64(token)}, vals...)...)
	if err != nil {
		return fmt.Errorf("herd: fenced upsert of %s %v: %w", f.Table, id, err)
	}
	if tag.RowsAffected() > 0 {
		return nil
	}
	// The row exists with a higher fence (ON CONFLICT found it): read the
	// fence for the error. A row deleted since is reported as fenced too,
	// without the number.
	err = f.refused(ctx, db, "upsert", id, token)
	if errors.Is(err, herd.ErrNotFound) {
		return fmt.Errorf("%w: %s %v: the row had a fence above the write's token %d (it has been deleted since)", herd.ErrFenced, f.Table, id, token)
	}
	return err
}
