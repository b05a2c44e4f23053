package locktest

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd"
)

// TableRig is a backend's way to a database whose fenced writes go to a
// table (lock/postgres and lock/mysql's FencedTable): a statement, a
// query of one row, and the table's two fenced writes.
type TableRig struct {
	// Exec runs a statement.
	Exec func(ctx context.Context, stmt string) error
	// Query runs a query of one row and scans its columns into dst.
	Query func(ctx context.Context, query string, dst ...any) error
	// Update and Upsert are the FencedTable's writes of the row id of
	// table (table "" is a FencedTable with no Table).
	Update func(ctx context.Context, table string, id any, token uint64, set map[string]any) error
	Upsert func(ctx context.Context, table string, id any, token uint64, set map[string]any) error
}

// exec runs stmt, or fails t.
func (r TableRig) exec(t *testing.T, stmt string) {
	t.Helper()
	if err := r.Exec(context.Background(), stmt); err != nil {
		t.Fatalf("%v\n%s", err, stmt)
	}
}

// SchemaRig is what [FencedTableSchema] needs of a backend whose fenced
// writes go to a table in a database: its [TableRig], and the package
// doc and dialect whose statements it checks. The writes are of the
// column "balance" of the row with id 1.
type SchemaRig struct {
	// DocFile is the package doc holding the CREATE TABLE accounts and
	// ALTER TABLE accounts statements, as indented lines ending with ';'.
	DocFile string
	// PlainTable is the dialect's CREATE TABLE for a table "%s" with an
	// id primary key and a balance column, and no fence (the table the
	// doc's ALTER TABLE is for).
	PlainTable string
	TableRig
}

// FencedTableSchema checks that the package doc's CREATE TABLE (and its
// ALTER TABLE for an existing table) make a table the backend's fenced
// writes work on: the same holding writes twice (Upsert, then Update,
// then Update again with the same value), a lower token is refused with
// an error that gives the row's fence and the token, and a higher one
// lands.
func FencedTableSchema(t *testing.T, rig SchemaRig) {
	t.Helper()
	ctx := context.Background()
	suffix := "_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	exec := func(what, stmt string) {
		t.Helper()
		if err := rig.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v\n%s", what, err, stmt)
		}
	}
	exec("the doc's CREATE TABLE", strings.Replace(docStatement(t, rig.DocFile, "CREATE TABLE accounts"), "accounts", "accounts"+suffix, 1))
	old := "old_accounts" + suffix
	exec("a table without a fence", strings.Replace(rig.PlainTable, "%s", old, 1))
	exec("its row", "INSERT INTO "+old+" VALUES (1, 10)")
	exec("the doc's ALTER TABLE", strings.Replace(docStatement(t, rig.DocFile, "ALTER TABLE accounts"), "accounts", old, 1))

	for _, table := range []string{"accounts" + suffix, old} {
		const holding = 1796190371175265 // a token as the locks hand them out: µs since 1970
		balance := func(v int64) map[string]any { return map[string]any{"balance": v} }
		if err := rig.Upsert(ctx, table, 1, holding, balance(100)); err != nil {
			t.Fatalf("%s: the holding's first write: %v", table, err)
		}
		for _, v := range []int64{90, 90} {
			if err := rig.Update(ctx, table, 1, holding, balance(v)); err != nil {
				t.Errorf("%s: the same holding's next write (balance %d): %v, want it accepted", table, v, err)
			}
		}
		err := rig.Update(ctx, table, 1, holding-1, balance(0))
		if !errors.Is(err, herd.ErrFenced) {
			t.Fatalf("%s: a lower token: %v, want ErrFenced", table, err)
		}
		if msg := err.Error(); !strings.Contains(msg, "fence is "+strconv.Itoa(holding)) || !strings.Contains(msg, "token "+strconv.Itoa(holding-1)) {
			t.Errorf("%s: the refusal %q does not give the row's fence and the token", table, msg)
		}
		if err := rig.Upsert(ctx, table, 1, holding-1, balance(0)); !errors.Is(err, herd.ErrFenced) || !strings.Contains(err.Error(), "fence is "+strconv.Itoa(holding)) {
			t.Errorf("%s: a lower token's Upsert: %v, want ErrFenced with the row's fence", table, err)
		}
		var b, f int64
		if err := rig.Query(ctx, "SELECT balance, fence FROM "+table+" WHERE id = 1", &b, &f); err != nil {
			t.Fatal(err)
		}
		if b != 90 || f != holding {
			t.Errorf("%s: the row is (balance %d, fence %d), want (90, %d)", table, b, f, holding)
		}
		if err := rig.Update(ctx, table, 1, holding+1, balance(80)); err != nil {
			t.Errorf("%s: a newer holding's write: %v", table, err)
		}
	}
}

// docStatement returns the statement of the package doc in file that
// starts with prefix: the doc's indented lines from there to the one
// that ends with a semicolon.
func docStatement(t *testing.T, file, prefix string) string {
	t.Helper()
	src, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var stmt []string
	for line := range strings.SplitSeq(string(src), "\n") {
		code, ok := strings.CutPrefix(line, "//\t")
		if !ok {
			continue
		}
		if stmt == nil && !strings.HasPrefix(code, prefix) {
			continue
		}
		stmt = append(stmt, code)
		if strings.HasSuffix(code, ";") {
			return strings.Join(stmt, "\n")
		}
	}
	t.Fatalf("%s has no statement starting with %q and ending with ';'", file, prefix)
	return ""
}

// fencedTable creates a table for the FencedTable scenarios: key id, a
// value column v and the fence. It returns its name and a reader of a
// row's (v, fence), ok false when there is no such row.
func fencedTable(t *testing.T, rig TableRig) (string, func(id int) (string, int64, bool)) {
	t.Helper()
	name := "fenced_" + strconv.FormatInt(time.Now().UnixNano(), 36) + "_" + strconv.FormatInt(tables.Add(1), 10)
	rig.exec(t, "CREATE TABLE "+name+" (id int PRIMARY KEY, v text, fence bigint NOT NULL DEFAULT 0)")
	row := func(id int) (string, int64, bool) {
		var v string
		var fence int64
		if err := rig.Query(context.Background(), "SELECT v, fence FROM "+name+" WHERE id = "+strconv.Itoa(id), &v, &fence); err != nil {
			return "", 0, false
		}
		return v, fence, true
	}
	return name, row
}

// tables numbers the tables of fencedTable, which may be created within
// one tick of the clock.
var tables atomic.Int64

// FencedTableBadInput checks that invalid FencedTable calls (no table,
// no column, an empty column name, the fence or the key among the
// columns, a token of 0 or of 2^63) fail without touching the database:
// with an error that is neither [herd.ErrFenced] nor [herd.ErrNotFound].
func FencedTableBadInput(t *testing.T, rig TableRig) {
	t.Helper()
	ctx := context.Background()
	tbl, _ := fencedTable(t, rig)
	for name, call := range map[string]func() error{
		"no table":      func() error { return rig.Update(ctx, "", 1, 1, map[string]any{"v": "x"}) },
		"no column":     func() error { return rig.Update(ctx, tbl, 1, 1, nil) },
		"empty column":  func() error { return rig.Upsert(ctx, tbl, 1, 1, map[string]any{"": "x"}) },
		"the fence":     func() error { return rig.Update(ctx, tbl, 1, 1, map[string]any{"fence": 9}) },
		"the key":       func() error { return rig.Upsert(ctx, tbl, 1, 1, map[string]any{"id": 2}) },
		"token 0":       func() error { return rig.Update(ctx, tbl, 1, 0, map[string]any{"v": "x"}) },
		"token too big": func() error { return rig.Upsert(ctx, tbl, 1, 1<<63, map[string]any{"v": "x"}) },
	} {
		if err := call(); err == nil || errors.Is(err, herd.ErrFenced) || errors.Is(err, herd.ErrNotFound) {
			t.Errorf("%s: %v, want an invalid-call error", name, err)
		}
	}
}

// FencedTableWithLocks writes the tokens of two holders of one key in
// turn, taken from the Lock l, through the FencedTable of rig: the
// second holder's write lands, the first's late write is refused with
// [herd.ErrFenced], and the row keeps the second's value.
func FencedTableWithLocks[L herd.LeaseHandle](t *testing.T, rig TableRig, l herd.Lock[L]) {
	t.Helper()
	ctx := context.Background()
	tbl, row := fencedTable(t, rig)
	k := key(t)
	a, err := l.TryAcquire(ctx, k, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	b, err := l.TryAcquire(ctx, k, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)
	if err := rig.Upsert(ctx, tbl, 1, b.Token(), map[string]any{"v": "B"}); err != nil {
		t.Fatal(err)
	}
	if err := rig.Upsert(ctx, tbl, 1, a.Token(), map[string]any{"v": "A"}); !errors.Is(err, herd.ErrFenced) {
		t.Errorf("the older holder's write: %v, want ErrFenced", err)
	}
	if v, _, _ := row(1); v != "B" {
		t.Errorf("the row holds %q, want %q", v, "B")
	}
}
