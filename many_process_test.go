package herd

// Cross-process tests of GetMany, on the worker rig of
// cache_process_test.go (startWorkers, cpWorker, bookkeeping keys under
// the run's "cp-<run>:" prefix).

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func init() {
	workerRoles["manyoverlap"] = manyOverlapWorker
	workerRoles["manycrossed"] = manyCrossedWorker
}

// Overlapping batches: 40 keys; caller i of process p asks for the 16
// consecutive keys from (10p + 3i) mod 40.
const manyOverlapKeys, manyOverlapWindow = 40, 16

func manyOverlapBatch(prefix string, inst, i int) []string {
	keys := make([]string, manyOverlapWindow)
	for j := range keys {
		keys[j] = cpKey(prefix, "user", strconv.Itoa((10*inst+3*i+j)%manyOverlapKeys))
	}
	return keys
}

// TestGetManyAcrossProcesses: 4 OS processes × 8 goroutines, each asking
// GetMany for its own window of 16 of 40 cold keys, all at once at a
// barrier; the batches overlap within and across processes. Each loader
// call counts every key it gets and returns only once every caller of
// every process is inside GetMany, so no caller can come after a key's
// flight ended. Exactly one load per key in the whole cluster, every
// caller gets every key of its window, and all callers agree on each
// key's value. On a single redis-server and on a 3-master cluster.
func TestGetManyAcrossProcesses(t *testing.T) {
	t.Parallel()
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Start(t)
		manyRunOverlap(t, "redis", []string{srv.Addr()}, srv.Client(t))
	})
	t.Run("cluster", func(t *testing.T) {
		cl := redistest.StartCluster(t, 3)
		manyRunOverlap(t, "cluster", cl.Addrs(), cl.Client(t))
	})
}

func manyRunOverlap(t *testing.T, mode string, addrs []string, rdb redis.UniversalClient) {
	const procs, g = 4, 8
	ctx := context.Background()
	prefix := cpNewPrefix()
	p := startWorkers(t, procs, "manyoverlap", cpEnvFor(mode, addrs, prefix, "", procs, g, 1)...)
	p.wait(60 * time.Second)
	if t.Failed() {
		t.FailNow()
	}
	asked := make(map[string]bool)
	for inst := range procs {
		for i := range g {
			for _, k := range manyOverlapBatch(prefix, inst, i) {
				asked[k] = true
			}
		}
	}
	loads, err := rdb.HGetAll(ctx, cpKey(prefix, "loads")).Result()
	if err != nil {
		t.Fatal(err)
	}
	for k := range asked {
		if loads[k] != "1" {
			t.Errorf("key %s: loaded %q times, want exactly 1", k, loads[k])
		}
		vals, _ := rdb.SMembers(ctx, cpKey(prefix, "values", k)).Result()
		if len(vals) != 1 {
			t.Errorf("key %s: callers got %d distinct values %q, want 1", k, len(vals), vals)
		}
	}
	for k := range loads {
		if !asked[k] {
			t.Errorf("key %s was loaded but nobody asked for it", k)
		}
	}
	if served, _ := rdb.Get(ctx, cpKey(prefix, "served")).Int(); served != procs*g {
		t.Errorf("%d callers served, want %d", served, procs*g)
	}
	calls, _ := rdb.LRange(ctx, cpKey(prefix, "calls"), 0, -1).Result()
	perProc := make(map[string]int)
	for _, c := range calls {
		inst, _, _ := strings.Cut(c, ":")
		perProc[inst]++
	}
	t.Logf("%s: %d keys asked, loaded in %d loader calls (per process %v)", mode, len(asked), len(calls), perProc)
	for _, r := range cpReports(t, rdb, prefix, procs) {
		t.Logf("process %d (pid %d): %s", r.Inst, r.Pid, cpStatsLine(r.Stats))
		if r.Stats.LocalLoads != 0 || r.Stats.Fenced != 0 || r.Stats.WaitTimeouts != 0 {
			t.Errorf("process %d: localLoads=%d fenced=%d waitTimeouts=%d, want 0", r.Inst, r.Stats.LocalLoads, r.Stats.Fenced, r.Stats.WaitTimeouts)
		}
	}
}

// manyOverlapWorker is one process of TestGetManyAcrossProcesses.
func manyOverlapWorker(ctx context.Context, _ string) error {
	w, err := cpNewWorker()
	if err != nil {
		return err
	}
	defer w.rdb.Close()
	const lease = 3 * time.Second
	clog := &cpLog{}
	c := New(w.rdb, &Options{MinLease: lease, MaxLease: lease, DefaultLease: lease,
		Logger: slog.New(slog.NewTextHandler(clog, nil))})
	defer c.Close()
	const name = "m"
	load := func(ctx context.Context, keys []string) (map[string][]byte, error) {
		pipe := w.rdb.Pipeline()
		for _, k := range keys {
			pipe.HIncrBy(ctx, w.key("loads"), k, 1)
		}
		pipe.RPush(ctx, w.key("calls"), strconv.Itoa(w.inst)+":"+strings.Join(keys, ","))
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, err
		}
		if err := w.waitEntered(ctx, name); err != nil {
			return nil, err
		}
		out := make(map[string][]byte, len(keys))
		for _, k := range keys {
			out[k] = fmt.Appendf(nil, "%s@pid-%d", k, w.pid)
		}
		return out, nil
	}
	err = w.runWave(ctx, name, func(i int) {
		keys := manyOverlapBatch(w.prefix, w.inst, i)
		if err := w.enter(ctx, name, i); err != nil {
			w.fail("%v", err)
			return
		}
		gctx, cancel := context.WithTimeout(ctx, cpGetTimeout)
		defer cancel()
		vals, err := c.GetMany(gctx, keys, cpValueTTL, load)
		if err != nil {
			w.fail("goroutine %d: GetMany: %v", i, err)
			return
		}
		pipe := w.rdb.Pipeline()
		for _, k := range keys {
			v, ok := vals[k]
			if !ok || !strings.HasPrefix(string(v), k+"@") {
				w.fail("goroutine %d: key %s = (%q, %v)", i, k, v, ok)
				continue
			}
			pipe.SAdd(ctx, w.key("values", k), v)
		}
		pipe.Incr(ctx, w.key("served"))
		if _, err := pipe.Exec(ctx); err != nil {
			w.fail("%v", err)
		}
	})
	if err != nil {
		return err
	}
	if err := w.report(ctx, &cpReport{Inst: w.inst, Pid: w.pid, Stats: c.Stats(), Log: clog.get()}); err != nil {
		return err
	}
	return w.err()
}

// TestGetManyCrossedLeads: two processes whose batches depend on each
// other. Process 1 leads key B in a batch whose loader returns only once
// process 0's loader has begun. Process 0 then asks for {A, B}: it leads
// A and follows B; its loader must be called with A at once, without
// waiting for B, and returns once B's loader has begun. Process 1 then
// asks for {A, B} too: it follows A and shares its own flight of B. If a
// batch's loader waited for the keys it follows, process 0's loader would
// wait for B, B's for process 0's loader, and both would stall until the
// loaders' bound (4 leases) failed them. Both batches must complete well
// within one lease (2s), with one loader call per process, each with the
// one key that process leads.
func TestGetManyCrossedLeads(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	prefix := cpNewPrefix()
	p := startWorkers(t, 2, "manycrossed", cpEnvFor("redis", []string{srv.Addr()}, prefix, "", 2, 1, 1)...)
	p.wait(60 * time.Second)
	calls, _ := rdb.LRange(ctx, cpKey(prefix, "calls"), 0, -1).Result()
	slices.Sort(calls)
	a, b := cpKey(prefix, "user", "A"), cpKey(prefix, "user", "B")
	if want := []string{"0:" + a, "1:" + b}; !slices.Equal(calls, want) {
		t.Errorf("loader calls %q, want %q (process 0 loads A alone, process 1 loads B alone)", calls, want)
	}
	took, _ := rdb.HGetAll(ctx, cpKey(prefix, "took")).Result()
	for _, batch := range slices.Sorted(maps.Keys(took)) {
		d, err := time.ParseDuration(took[batch])
		if err != nil {
			t.Fatalf("%s: %v", batch, err)
		}
		t.Logf("%s took %v", batch, d)
		if d >= 2*time.Second {
			t.Errorf("%s took %v, not within the 2s lease: the batches waited on each other", batch, d)
		}
	}
	if len(took) != 3 {
		t.Errorf("%d batches reported, want 3", len(took))
	}
}

// manyCrossedWorker is one process of TestGetManyCrossedLeads.
func manyCrossedWorker(ctx context.Context, _ string) error {
	w, err := cpNewWorker()
	if err != nil {
		return err
	}
	defer w.rdb.Close()
	const lease = 2 * time.Second
	c := New(w.rdb, &Options{MinLease: lease, MaxLease: lease, DefaultLease: lease})
	defer c.Close()
	a, b := w.key("user", "A"), w.key("user", "B")
	// await waits, up to 4 leases, until key exists in Redis.
	await := func(ctx context.Context, key string) error {
		for deadline := time.Now().Add(4 * lease); ; time.Sleep(time.Millisecond) {
			n, err := w.rdb.Exists(ctx, w.key(key)).Result()
			if err != nil {
				return err
			}
			if n == 1 {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s did not appear within %v", key, 4*lease)
			}
		}
	}
	// load records its call, announces that it began (as began), waits for
	// the other process's loader to begin (until), and returns.
	load := func(began, until string) ManyLoadFunc {
		return func(ctx context.Context, keys []string) (map[string][]byte, error) {
			if err := w.rdb.RPush(ctx, w.key("calls"), strconv.Itoa(w.inst)+":"+strings.Join(keys, ",")).Err(); err != nil {
				return nil, err
			}
			if err := w.rdb.Set(ctx, w.key(began), "1", 0).Err(); err != nil {
				return nil, err
			}
			if err := await(ctx, until); err != nil {
				return nil, err
			}
			out := make(map[string][]byte, len(keys))
			for _, k := range keys {
				out[k] = []byte("v-" + k)
			}
			return out, nil
		}
	}
	batch := func(name string, keys []string, load ManyLoadFunc) {
		start := time.Now()
		gctx, cancel := context.WithTimeout(ctx, cpGetTimeout)
		defer cancel()
		vals, err := c.GetMany(gctx, keys, cpValueTTL, load)
		took := time.Since(start)
		if err != nil {
			w.fail("%s: %v", name, err)
		}
		for _, k := range keys {
			if string(vals[k]) != "v-"+k {
				w.fail("%s: key %s = %q", name, k, vals[k])
			}
		}
		if err := w.rdb.HSet(ctx, w.key("took"), name, took.String()).Err(); err != nil {
			w.fail("%v", err)
		}
	}
	switch w.inst {
	case 0:
		if err := await(ctx, "began-B"); err != nil {
			return err
		}
		batch("process 0 {A,B}", []string{a, b}, load("began-A", "began-B"))
	case 1:
		done := make(chan struct{})
		go func() {
			defer close(done)
			batch("process 1 {B}", []string{b}, load("began-B", "began-A"))
		}()
		if err := await(ctx, "began-A"); err != nil {
			<-done
			return err
		}
		batch("process 1 {A,B}", []string{a, b}, func(ctx context.Context, keys []string) (map[string][]byte, error) {
			w.rdb.RPush(ctx, w.key("calls"), "1 second batch:"+strings.Join(keys, ","))
			return nil, fmt.Errorf("the second batch of process 1 leads nothing, yet loaded %q", keys)
		})
		<-done
	}
	return w.err()
}
