// Package fencedrow holds what the FencedTable types of lock/postgres and
// lock/mysql share, apart from their SQL dialects: the default key and
// fence column names, the checks of a write's arguments (made before
// anything is sent), the columns of a write in a stable order, and the
// error of a write refused by the row's fence.
package fencedrow

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/herdkit/herd"
)

// Table is a FencedTable's configuration: its fields, as the backends'
// FencedTable has them.
type Table struct {
	Table, ID, Fence string
	// Bigint is the dialect's name of the fence column's type, for the
	// error of a token out of its range ("bigint", "BIGINT").
	Bigint string
}

// Names returns the key and fence columns: ID and Fence, or "id" and
// "fence" for the empty ones.
func (t Table) Names() (id, fence string) {
	id, fence = t.ID, t.Fence
	if id == "" {
		id = "id"
	}
	if fence == "" {
		fence = "fence"
	}
	return id, fence
}

// Prepare checks a write, op ("update", "upsert"), of token and the
// columns in set, and returns set's column names, sorted (the statement's
// text is the same for the same columns), with their values in that
// order. An invalid call (an empty Table, no column, the key or the fence
// among the columns, an empty column name, a token of 0 or above
// 2^63−1) is an error, "herd: fenced op: ...".
func (t Table) Prepare(op string, token uint64, set map[string]any) ([]string, []any, error) {
	if err := t.check(token, set); err != nil {
		return nil, nil, fmt.Errorf("herd: fenced %s: %w", op, err)
	}
	cols := make([]string, 0, len(set))
	for c := range set {
		if c == "" {
			return nil, nil, fmt.Errorf("herd: fenced %s: an empty column name", op)
		}
		cols = append(cols, c)
	}
	slices.Sort(cols)
	vals := make([]any, len(cols))
	for i, c := range cols {
		vals[i] = set[c]
	}
	return cols, vals, nil
}

func (t Table) check(token uint64, set map[string]any) error {
	if t.Table == "" {
		return errors.New("FencedTable.Table is empty")
	}
	if token == 0 || token > math.MaxInt64 {
		return fmt.Errorf("token %d out of range: the fence column is a %s, and tokens start at 1", token, t.Bigint)
	}
	if len(set) == 0 {
		return errors.New("no column to set")
	}
	id, fence := t.ID, t.Fence
	for c := range set {
		if c == id || c == fence || (id == "" && c == "id") || (fence == "" && c == "fence") {
			return fmt.Errorf("column %q is the key or the fence: it cannot be set", c)
		}
	}
	return nil
}

// Fenced is the error of a write to the row id of table refused because
// the row's fence, top, is above token: it wraps herd.ErrFenced and gives
// both numbers.
func Fenced(table string, id any, token uint64, top int64) error {
	return fmt.Errorf("%w: %s %v: the row's fence is %d, above the write's token %d", herd.ErrFenced, table, id, top, token)
}
