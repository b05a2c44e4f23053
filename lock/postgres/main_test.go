package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"

	"github.com/herdkit/herd"
	"github.com/herdkit/herd/lock/postgres/pgtest"
	"github.com/herdkit/herd/locktest"
	"github.com/jackc/pgx/v5"
)

// dbEnv is the worker process's database URL (see holder).
const dbEnv = "HERD_PG_DB"

// testURL is the URL of the database the tests of this run created, or
// "" with dbErr saying why there is none.
var (
	testURL string
	dbErr   error
)

func TestMain(m *testing.M) {
	if code, ok := locktest.RunWorker(holder); ok {
		os.Exit(code)
	}
	os.Exit(locktest.Main(m, pgtest.Server("herd_test_", &testURL, &dbErr)))
}

// holder is the worker process's holder of locktest.PausedHolderFenced:
// a Locker, and the fenced table, on the database at $HERD_PG_DB.
func holder(ctx context.Context) (herd.Lock[*Lease], locktest.TableRig, func(), error) {
	conf, err := pgx.ParseConfig(os.Getenv(dbEnv))
	if err != nil {
		return nil, locktest.TableRig{}, nil, err
	}
	db, err := pgx.ConnectConfig(ctx, conf) // the data's own connection
	if err != nil {
		return nil, locktest.TableRig{}, nil, err
	}
	locks := New(conf, nil)
	return locks, tables(db), func() { locks.Close(); db.Close(ctx) }, nil
}

// tables is the locktest.TableRig of c, with FencedTable's writes.
func tables(c *pgx.Conn) locktest.TableRig {
	return pgtest.Tables(c, DB(c), FencedTable.Update, FencedTable.Upsert)
}

// testConf returns the connection configuration of the test database, or
// skips the test when there is no server (HERD_REQUIRE_REDIS=1 has failed
// the run in TestMain then).
func testConf(t testing.TB) *pgx.ConnConfig {
	t.Helper()
	if testURL == "" {
		locktest.Skip(t, "PostgreSQL server", dbErr)
	}
	conf, err := pgx.ParseConfig(testURL)
	if err != nil {
		t.Fatal(err)
	}
	return conf
}

// testConn returns a plain connection to the test database, closed at the
// end of the test.
func testConn(t testing.TB) *pgx.Conn {
	t.Helper()
	return pgtest.Conn(t, testURL, dbErr)
}

// newTestLocker returns a Locker on the test database, closed at the end
// of the test.
func newTestLocker(t testing.TB, opt *Options) *Locker {
	t.Helper()
	l := New(testConf(t), opt)
	t.Cleanup(func() { l.Close() })
	return l
}

// testName returns a lock name unique to the running test.
func testName(t testing.TB) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return t.Name() + ":" + hex.EncodeToString(b[:])
}
