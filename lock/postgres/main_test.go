package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"
)

// Environment of the tests.
const (
	urlEnv     = "HERD_PG_URL"        // the server's admin URL
	requireEnv = "HERD_REQUIRE_REDIS" // 1: a missing server fails the tests (herd's CI variable for every server)
	workerEnv  = "HERD_PG_WORKER"     // set when the test binary runs as a worker process
	dbEnv      = "HERD_PG_DB"         // the worker's database URL
	defaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
)

// testURL is the URL of the database the tests of this run created, or
// "" with dbErr saying why there is none.
var (
	testURL string
	dbErr   error
)

func TestMain(m *testing.M) {
	if role := os.Getenv(workerEnv); role != "" {
		os.Exit(runWorker(role))
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	admin := os.Getenv(urlEnv)
	if admin == "" {
		admin = defaultURL
	}
	drop, err := createDB(admin)
	if err != nil {
		if os.Getenv(requireEnv) == "1" {
			fmt.Fprintf(os.Stderr, "PostgreSQL at %s is needed (%s=1): %v\n", admin, requireEnv, err)
			return 1
		}
		dbErr = err
		return m.Run()
	}
	code := m.Run()
	if err := drop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	return code
}

// createDB creates a database with a random name on the server at admin,
// sets testURL to it, and returns the function that drops it.
func createDB(admin string) (func() error, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, admin)
	if err != nil {
		return nil, err
	}
	defer c.Close(context.Background())
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "herd_test_" + hex.EncodeToString(b[:])
	if _, err := c.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return nil, err
	}
	u, err := url.Parse(admin)
	if err != nil {
		return nil, err
	}
	u.Path = "/" + name
	testURL = u.String()
	return func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, admin)
		if err != nil {
			return fmt.Errorf("drop the test database %s: %w", name, err)
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			return fmt.Errorf("drop the test database %s: %w", name, err)
		}
		return nil
	}, nil
}

// testConf returns the connection configuration of the test database, or
// skips the test when there is no server (HERD_REQUIRE_REDIS=1 has failed
// the run in TestMain then).
func testConf(t testing.TB) *pgx.ConnConfig {
	t.Helper()
	if testURL == "" {
		t.Skipf("no PostgreSQL server: %v (set %s=1 to fail instead)", dbErr, requireEnv)
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
	c, err := pgx.ConnectConfig(context.Background(), testConf(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
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
