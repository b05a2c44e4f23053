package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/herdkit/herd"
	"github.com/herdkit/herd/internal/fencedrow"
)

// DB is what [FencedTable] writes through: a *sql.DB, a *sql.Conn or a
// *sql.Tx of go-sql-driver/mysql.
type DB interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
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
// whatever lock handed the tokens out ([Locker], or herd's other locks).
//
// The table is the caller's, with a unique key column and a BIGINT fence
// column (NOT NULL DEFAULT 0 for rows written without a token), such as
// the package doc's CREATE TABLE. A write is one statement:
//
//	UPDATE t SET col = ?, ..., fence = ? WHERE id = ? AND fence <= ?
//
// which either changes the whole row or nothing. When it reports no row
// changed, a read of the row's fence tells the three cases apart: no
// such row; a fence above the token (refused); the fence equal to the
// token (the same holding wrote these very values before: MySQL counts
// an unchanged row as not affected unless the DSN sets clientFoundRows,
// and the write is done either way). [FencedTable.Upsert] adds the
// insert path as a plain INSERT when the UPDATE found no row, so it
// never depends on the counts of INSERT ... ON DUPLICATE KEY UPDATE,
// which clientFoundRows changes. A holding may write a row as often as
// it likes, and a retried write is idempotent; once a newer holding has
// written the row, every later write of the older one is refused.
//
// A FencedTable is a value with no state; it is safe for concurrent use.
type FencedTable struct {
	// Table is the table's name; a dot separates database and table.
	// Each part is quoted as an identifier.
	Table string
	// ID is the key column. Default: "id".
	ID string
	// Fence is the fence column. Default: "fence".
	Fence string
}

// row is f for the checks that lock/postgres and lock/mysql share.
func (f FencedTable) row() fencedrow.Table {
	return fencedrow.Table{Table: f.Table, ID: f.ID, Fence: f.Fence, Bigint: "BIGINT"}
}

func (f FencedTable) names() (table, id, fence string) {
	id, fence = f.row().Names()
	return tableIdent(f.Table), ident(id), ident(fence)
}

// update runs the fenced UPDATE and reports whether it wrote the row.
func (f FencedTable) update(ctx context.Context, db DB, id any, token uint64, cols []string, vals []any) (bool, error) {
	table, idCol, fenceCol := f.names()
	var b strings.Builder
	b.WriteString("UPDATE " + table + " SET ")
	for _, c := range cols {
		b.WriteString(ident(c) + " = ?, ")
	}
	b.WriteString(fenceCol + " = ? WHERE " + idCol + " = ? AND " + fenceCol + " <= ?")
	args := append(append(vals[:len(vals):len(vals)], int64(token)), id, int64(token))
	res, err := db.ExecContext(ctx, b.String(), args...)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n > 0, err
}

// Update sets the columns in set on the row whose key is id, and its fence
// to token, only when the row's fence is at most token. It returns nil
// when the row was written (or already held these values under this
// token); an error wrapping [herd.ErrFenced] when the row's fence is
// above token (a holder with a newer token has written it: nothing
// changed), which gives the row's fence and the token; an error wrapping
// [herd.ErrNotFound] when there is no such
// row; a database error wrapped. An invalid call (an empty Table, no
// column, the key or the fence among the columns, a token of 0 or above
// 2^63−1) is an error, and nothing is sent. It runs one statement when
// it writes and two when it does not.
func (f FencedTable) Update(ctx context.Context, db DB, id any, token uint64, set map[string]any) error {
	cols, vals, err := f.row().Prepare("update", token, set)
	if err != nil {
		return err
	}
	wrote, err := f.update(ctx, db, id, token, cols, vals)
	if err != nil {
		return fmt.Errorf("herd: fenced update of %s %v: %w", f.Table, id, err)
	}
	if wrote {
		return nil
	}
	// Nothing changed: tell a missing row from a fenced one, and both
	// from the same holding's unchanged row.
	top, err := f.fence(ctx, db, id)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("%w: %s %v", herd.ErrNotFound, f.Table, id)
	case err != nil:
		return fmt.Errorf("herd: fenced update of %s %v: nothing written; reading its fence: %w", f.Table, id, err)
	case top == int64(token):
		return nil
	}
	return fencedrow.Fenced(f.Table, id, token, top)
}

// fence reads the fence of the row id (sql.ErrNoRows: no such row). The
// read is a locking one, so that inside a transaction it sees the row
// the UPDATE saw, not the transaction's snapshot.
func (f FencedTable) fence(ctx context.Context, db DB, id any) (int64, error) {
	table, idCol, fenceCol := f.names()
	var top int64
	err := db.QueryRowContext(ctx, "SELECT "+fenceCol+" FROM "+table+" WHERE "+idCol+" = ? LOCK IN SHARE MODE", id).Scan(&top)
	return top, err
}

// Upsert is [FencedTable.Update] with an insert path: a missing row is
// inserted with the columns in set and its fence at token; an existing one
// is written only when its fence is at most token. It returns nil when
// the row was written (or already held these values under this token)
// and an error wrapping [herd.ErrFenced] when it was not (the row exists
// with a fence above token; the error gives both). It needs a unique index
// or primary key on the key column; an insert refused by another unique
// index is returned as the database's error, not ErrFenced. It runs one
// statement when the row exists and is written, two when it is inserted,
// and four when its INSERT finds the row there (it is fenced, unchanged,
// or another writer inserted it after the UPDATE: the UPDATE runs again
// then, so a row inserted by an older token in between is still
// overwritten).
func (f FencedTable) Upsert(ctx context.Context, db DB, id any, token uint64, set map[string]any) error {
	cols, vals, err := f.row().Prepare("upsert", token, set)
	if err != nil {
		return err
	}
	table, idCol, fenceCol := f.names()
	quoted := make([]string, len(cols))
	params := make([]string, len(cols))
	for i, c := range cols {
		quoted[i] = ident(c)
		params[i] = "?"
	}
	insert := "INSERT INTO " + table + " (" + idCol + ", " + fenceCol + ", " + strings.Join(quoted, ", ") + ") " +
		"VALUES (?, ?, " + strings.Join(params, ", ") + ")"
	var dup error // the INSERT's ER_DUP_ENTRY
	for try := 0; ; try++ {
		wrote, err := f.update(ctx, db, id, token, cols, vals)
		if err != nil {
			return fmt.Errorf("herd: fenced upsert of %s %v: %w", f.Table, id, err)
		}
		if wrote {
			return nil
		}
		if try > 0 {
			// The INSERT found a duplicate: the row, with a fence above
			// token or this token's unchanged values, or, when there is
			// no such row, another unique index of the table.
			top, err := f.fence(ctx, db, id)
			switch {
			case errors.Is(err, sql.ErrNoRows):
				return fmt.Errorf("herd: fenced upsert of %s %v: %w", f.Table, id, dup)
			case err != nil:
				return fmt.Errorf("herd: fenced upsert of %s %v: nothing written; reading its fence: %w", f.Table, id, err)
			case top == int64(token):
				return nil
			}
			return fencedrow.Fenced(f.Table, id, token, top)
		}
		_, err = db.ExecContext(ctx, insert, append([]any{id, int64(token)}, vals...)...)
		dup = err
		var myErr *mysql.MySQLError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &myErr) && myErr.Number == 1062: // ER_DUP_ENTRY: the row exists
		default:
			return fmt.Errorf("herd: fenced upsert of %s %v: %w", f.Table, id, err)
		}
	}
}
