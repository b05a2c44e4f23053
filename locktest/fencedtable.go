package locktest

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/herdkit/herd"
)

// SchemaRig is what [FencedTableSchema] needs of a backend whose fenced
// writes go to a table in a database (lock/postgres and lock/mysql's
// FencedTable): a way to run a statement, to read a row, and the table's
// two writes, each of the column "balance" of the row with id 1.
type SchemaRig struct {
	// DocFile is the package doc holding the CREATE TABLE accounts and
	// ALTER TABLE accounts statements, as indented lines ending with ';'.
	DocFile string
	// PlainTable is the dialect's CREATE TABLE for a table "%s" with an
	// id primary key and a balance column, and no fence (the table the
	// doc's ALTER TABLE is for).
	PlainTable string
	Exec       func(ctx context.Context, stmt string) error
	Row        func(ctx context.Context, table string) (balance, fence int64, err error)
	Update     func(ctx context.Context, table string, token uint64, balance int64) error
	Upsert     func(ctx context.Context, table string, token uint64, balance int64) error
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
		if err := rig.Upsert(ctx, table, holding, 100); err != nil {
			t.Fatalf("%s: the holding's first write: %v", table, err)
		}
		for _, v := range []int64{90, 90} {
			if err := rig.Update(ctx, table, holding, v); err != nil {
				t.Errorf("%s: the same holding's next write (balance %d): %v, want it accepted", table, v, err)
			}
		}
		err := rig.Update(ctx, table, holding-1, 0)
		if !errors.Is(err, herd.ErrFenced) {
			t.Fatalf("%s: a lower token: %v, want ErrFenced", table, err)
		}
		if msg := err.Error(); !strings.Contains(msg, "fence is "+strconv.Itoa(holding)) || !strings.Contains(msg, "token "+strconv.Itoa(holding-1)) {
			t.Errorf("%s: the refusal %q does not give the row's fence and the token", table, msg)
		}
		if err := rig.Upsert(ctx, table, holding-1, 0); !errors.Is(err, herd.ErrFenced) || !strings.Contains(err.Error(), "fence is "+strconv.Itoa(holding)) {
			t.Errorf("%s: a lower token's Upsert: %v, want ErrFenced with the row's fence", table, err)
		}
		b, f, err := rig.Row(ctx, table)
		if err != nil {
			t.Fatal(err)
		}
		if b != 90 || f != holding {
			t.Errorf("%s: the row is (balance %d, fence %d), want (90, %d)", table, b, f, holding)
		}
		if err := rig.Update(ctx, table, holding+1, 80); err != nil {
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
