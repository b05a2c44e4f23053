package herd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// Environment of a re-run worker process.
const (
	envAddr     = "HERD_TEST_ADDR"     // redis address
	envKey      = "HERD_TEST_KEY"      // user key
	envDuration = "HERD_TEST_DURATION" // how long to run
	envG        = "HERD_TEST_G"        // goroutines
	envInstance = "HERD_TEST_INSTANCE" // index of this worker, 0..n-1 (set by startWorkers)
)

func init() {
	workerRoles["mutex"] = mutexWorker
}

// workerProcs is a set of worker processes started by startWorkers.
type workerProcs struct {
	t      *testing.T
	cmds   []*exec.Cmd
	outs   []*bytes.Buffer
	waited bool
}

// startWorkers re-runs the test binary n times in the given role with env;
// worker i finds its index in envInstance. Workers still running when the
// test ends (wait was not reached) are killed by pid and reaped, and their
// output is logged if the test failed.
func startWorkers(t *testing.T, n int, role string, env ...string) *workerProcs {
	t.Helper()
	p := &workerProcs{t: t}
	t.Cleanup(func() {
		if p.waited {
			return
		}
		for _, c := range p.cmds {
			_ = c.Process.Kill()
		}
		for i, c := range p.cmds {
			_ = c.Wait()
			if t.Failed() {
				t.Logf("worker %d (pid %d) output:\n%s", i, c.Process.Pid, p.outs[i])
			}
		}
	})
	for i := range n {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), env...)
		cmd.Env = append(cmd.Env, workerEnv+"="+role, envInstance+"="+strconv.Itoa(i))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatalf("start worker %d: %v", i, err)
		}
		p.cmds, p.outs = append(p.cmds, cmd), append(p.outs, &out)
	}
	return p
}

// pids returns the process ids of the workers, by instance.
func (p *workerProcs) pids() []int {
	pids := make([]int, len(p.cmds))
	for i, c := range p.cmds {
		pids[i] = c.Process.Pid
	}
	return pids
}

// wait waits up to d for every worker to exit, kills (by pid) those still
// running after d, and reports every worker that did not exit with
// status 0, with its output.
func (p *workerProcs) wait(d time.Duration) {
	p.t.Helper()
	p.waited = true
	type result struct {
		i   int
		err error
	}
	ch := make(chan result, len(p.cmds))
	for i, c := range p.cmds {
		go func() { ch <- result{i, c.Wait()} }()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	done := make([]bool, len(p.cmds))
	errs := make([]error, len(p.cmds))
	for remaining := len(p.cmds); remaining > 0; {
		select {
		case r := <-ch:
			done[r.i], errs[r.i] = true, r.err
			remaining--
		case <-timer.C:
			for i, c := range p.cmds {
				if !done[i] {
					p.t.Errorf("worker %d (pid %d) still running after %v: killing it", i, c.Process.Pid, d)
					_ = c.Process.Kill()
				}
			}
		}
	}
	for i, err := range errs {
		if err != nil {
			p.t.Errorf("worker %d (pid %d): %v\n%s", i, p.cmds[i].Process.Pid, err, p.outs[i])
		}
	}
}

// TestLeaseMutualExclusionAcrossProcesses: 2 OS processes × 50 goroutines
// contend for one lease until 300 holds are logged (at most 60 s: the
// count, not the time, decides, so a loaded machine only makes it slower).
// Every holder marks its critical section in Redis (an INCR that must
// read 1) and logs (token, start, end). No two holders may overlap and
// tokens must increase with time.
func TestLeaseMutualExclusionAcrossProcesses(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	const procs, goroutines = 2, 50
	key := "mutex-" + strconv.FormatInt(time.Now().UnixNano(), 36)

	p := startWorkers(t, procs, "mutex",
		envAddr+"="+srv.Addr(), envKey+"="+key, envDuration+"=60s", envG+"="+strconv.Itoa(goroutines))
	// Start every goroutine of every process at once.
	waitFor(t, 30*time.Second, "workers to be ready", func() bool {
		n, _ := rdb.Get(ctx, key+":ready").Int()
		return n == procs*goroutines
	})
	if err := rdb.Set(ctx, key+":go", "1", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	p.wait(2 * time.Minute)

	if v, _ := rdb.Get(ctx, key+":violations").Int(); v != 0 {
		t.Errorf("%d holders found another holder inside the critical section", v)
	}
	lines, err := rdb.LRange(ctx, key+":log", 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	type hold struct {
		token      uint64
		start, end int64
		proc       string
	}
	var holds []hold
	perProc := map[string]int{}
	for _, ln := range lines {
		var h hold
		if _, err := fmt.Sscan(ln, &h.token, &h.start, &h.end, &h.proc); err != nil {
			t.Fatalf("bad log line %q: %v", ln, err)
		}
		holds = append(holds, h)
		perProc[h.proc]++
	}
	if len(holds) < mutexHolds || len(perProc) != procs {
		t.Fatalf("%d holds from %d processes, want at least %d from %d processes", len(holds), len(perProc), mutexHolds, procs)
	}
	for proc, n := range perProc {
		if n < mutexHolds/20 {
			t.Errorf("process %s held the lease %d times of %d: it hardly contended", proc, n, len(holds))
		}
	}
	slices.SortFunc(holds, func(a, b hold) int { return cmpUint(a.token, b.token) })
	for i := 1; i < len(holds); i++ {
		prev, cur := holds[i-1], holds[i]
		if cur.token == prev.token {
			t.Fatalf("token %d handed out twice", cur.token)
		}
		if cur.start < prev.end {
			t.Fatalf("holds overlap: token %d [%d, %d] (process %s) and token %d [%d, %d] (process %s)",
				prev.token, prev.start, prev.end, prev.proc, cur.token, cur.start, cur.end, cur.proc)
		}
	}
	expired, _ := rdb.Get(ctx, key+":expired").Int()
	if expired > len(holds)/10 {
		t.Errorf("%d of %d holds outlived their lease: the test did not exercise exclusion", expired, len(holds)+expired)
	}
	t.Logf("%d holds without overlap, tokens strictly increasing; per process %v; %d outlived their lease", len(holds), perProc, expired)
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// mutexHolds is how many logged holds end the mutual-exclusion test.
const mutexHolds = 300

// mutexWorker is the body of one process in the mutual-exclusion test.
func mutexWorker(ctx context.Context, _ string) error {
	key := os.Getenv(envKey)
	dur, err := time.ParseDuration(os.Getenv(envDuration))
	if err != nil {
		return err
	}
	g, err := strconv.Atoi(os.Getenv(envG))
	if err != nil {
		return err
	}
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv(envAddr), PoolSize: g + 10})
	defer rdb.Close()
	l := NewLocker(rdb, nil)
	defer l.Close()
	proc := strconv.Itoa(os.Getpid())

	// The run ends when the log holds mutexHolds lines, or after dur.
	runCtx, stop := context.WithTimeout(ctx, dur)
	defer stop()
	go func() { // the other process may reach the count first
		for runCtx.Err() == nil {
			if n, _ := rdb.LLen(ctx, key+":log").Result(); n >= mutexHolds {
				stop()
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	var wg sync.WaitGroup
	errc := make(chan error, g)
	for range g {
		wg.Go(func() {
			if err := rdb.Incr(ctx, key+":ready").Err(); err != nil {
				errc <- err
				return
			}
			for rdb.Exists(ctx, key+":go").Val() == 0 {
				time.Sleep(time.Millisecond)
			}
			for runCtx.Err() == nil {
				lease, err := l.Acquire(runCtx, key, 2*time.Second)
				if errors.Is(err, ErrLeaseHeld) || runCtx.Err() != nil {
					continue // the wait ran out (MaxWait or the run's end)
				}
				if err != nil {
					errc <- err
					return
				}
				n, err := hold(ctx, rdb, key, lease, proc)
				if err != nil {
					errc <- err
					return
				}
				if n >= mutexHolds {
					stop() // enough: this process's other goroutines stop too
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	var errs []error
	for err := range errc {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// hold is one critical section: mark it in Redis, do a little work, log
// it, release. It returns the length of the log.
func hold(ctx context.Context, rdb *redis.Client, key string, lease *Lease, proc string) (int64, error) {
	start := time.Now().UnixNano()
	n, err := rdb.Incr(ctx, key+":holders").Result()
	if err != nil {
		return 0, err
	}
	if n != 1 {
		rdb.Incr(ctx, key+":violations")
	}
	time.Sleep(time.Duration(rand.N(500)) * time.Microsecond)
	if err := rdb.Decr(ctx, key+":holders").Err(); err != nil {
		return 0, err
	}
	end := time.Now().UnixNano()
	if isClosed(lease.Lost()) {
		// The lease's validity ran out inside the critical section (a
		// badly overloaded machine): exclusion is not promised for it, so
		// it is counted apart instead of being checked for overlap.
		rdb.Incr(ctx, key+":expired")
		return 0, lease.Release(ctx)
	}
	line := strings.Join([]string{
		strconv.FormatUint(lease.Token(), 10), strconv.FormatInt(start, 10), strconv.FormatInt(end, 10), proc,
	}, " ")
	logged, err := rdb.RPush(ctx, key+":log", line).Result()
	if err != nil {
		return 0, err
	}
	return logged, lease.Release(ctx)
}
