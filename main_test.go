package herd

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// workerEnv names the worker role when the test binary is re-run as a
// separate instance process (see startWorkers).
const workerEnv = "HERD_TEST_WORKER"

func TestMain(m *testing.M) {
	if role := os.Getenv(workerEnv); role != "" {
		os.Exit(runWorkerRole(role))
	}
	goleak.VerifyTestMain(m)
}

// backend is one kind of Redis the shared suites run against.
type backend struct {
	name string
	rdb  redis.UniversalClient
	// mini is set for miniredis, whose clock only moves by FastForward.
	mini *miniredis.Miniredis
	// cluster is set for the Redis Cluster backend.
	cluster bool
}

// backends returns the Redis kinds every lease suite runs on: miniredis,
// a real redis-server, and a real 3-master cluster. Real servers are
// started for this test and stopped when it ends.
func backends(t *testing.T) []backend {
	t.Helper()
	cl := redistest.StartCluster(t, 3)
	return append(standaloneBackends(t), backend{name: "cluster", rdb: cl.Client(t), cluster: true})
}

// standaloneBackends is backends without the cluster.
func standaloneBackends(t *testing.T) []backend {
	t.Helper()
	mr := miniredis.RunT(t)
	mini := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { mini.Close() })
	srv := redistest.Start(t)
	return []backend{
		{name: "miniredis", rdb: mini, mini: mr},
		{name: "redis", rdb: srv.Client(t)},
	}
}

// testKey returns a key unique to the running test, with bytes that a
// careless key layout would mishandle.
func testKey(t *testing.T) string {
	return "{" + t.Name() + "}:\n"
}

// waitFor polls cond every few milliseconds until it holds or d passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// isClosed reports whether ch is closed, without blocking.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// runWorkerRole dispatches a re-run test binary to its role.
func runWorkerRole(role string) int {
	name, _, _ := strings.Cut(role, ":")
	fn, ok := workerRoles[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "unknown worker role %q\n", role)
		return 2
	}
	if err := fn(context.Background(), role); err != nil {
		fmt.Fprintf(os.Stderr, "worker %s: %v\n", role, err)
		return 1
	}
	return 0
}

// workerRoles holds the functions a re-run test binary can act as.
var workerRoles = map[string]func(ctx context.Context, role string) error{}

// cmdHook is a go-redis hook that shows a test every command a client
// sends, alone or in a pipeline: to before when it is about to be sent,
// to after once it returned (its reply or error set). Either may be nil.
type cmdHook struct{ before, after func(redis.Cmder) }

func (h cmdHook) see(f func(redis.Cmder), cmds []redis.Cmder) {
	if f != nil {
		for _, cmd := range cmds {
			f(cmd)
		}
	}
}

func (h cmdHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h cmdHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.see(h.before, []redis.Cmder{cmd})
		err := next(ctx, cmd)
		h.see(h.after, []redis.Cmder{cmd})
		return err
	}
}
func (h cmdHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.see(h.before, cmds)
		err := next(ctx, cmds)
		h.see(h.after, cmds)
		return err
	}
}
