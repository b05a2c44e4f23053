package herd

// Cross-process test of the near cache: four worker processes (the test
// binary re-run, see startWorkers) hold a near copy of one hot key; in
// each round one of them writes it, and every other one must see the new
// value in its first Get that starts once the bound has passed since the
// write returned. The write's return travels to the readers through a
// bookkeeping key (set after Set returned), so a reader's clock starts
// after the write's acknowledgement; Gets before the bound may return
// either value, and must return one of the two.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func init() {
	workerRoles["nearinval"] = nearInvalWorker
}

// nearProcStaleness is the workers' Options.Near.Staleness.
const nearProcStaleness = 300 * time.Millisecond

func TestNearInvalidationAcrossProcesses(t *testing.T) {
	t.Parallel()
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Start(t)
		nearRunProcesses(t, "redis", []string{srv.Addr()}, srv.Client(t))
	})
	t.Run("cluster", func(t *testing.T) {
		cl := redistest.StartCluster(t, 3)
		nearRunProcesses(t, "cluster", cl.Addrs(), cl.Client(t))
	})
}

func nearRunProcesses(t *testing.T, mode string, addrs []string, rdb redis.UniversalClient) {
	const procs, rounds = 4, 8
	prefix := cpNewPrefix()
	seed := New(rdb, nil)
	if err := seed.Set(context.Background(), cpKey(prefix, "hot"), []byte("v0"), time.Hour); err != nil {
		t.Fatal(err)
	}
	seed.Close()
	p := startWorkers(t, procs, "nearinval", cpEnvFor(mode, addrs, prefix, "", procs, 1, rounds)...)
	p.wait(2 * time.Minute)
	if t.Failed() {
		t.FailNow()
	}
	for _, r := range cpReports(t, rdb, prefix, procs) {
		s := r.Stats
		// Each reads the previous value from memory 20 times a round, and
		// hears every write (its own and the others').
		if s.NearHits < 20*rounds || s.NearInvalidations < rounds || s.Loads+s.LocalLoads != 0 {
			t.Errorf("worker %d: near hits %d, invalidations %d, loads %d", r.Inst, s.NearHits, s.NearInvalidations, s.Loads+s.LocalLoads)
		}
		t.Logf("worker %d: %s", r.Inst, r.Log)
	}
}

// nearInvalWorker is one process of TestNearInvalidationAcrossProcesses.
func nearInvalWorker(ctx context.Context, _ string) error {
	w, err := cpNewWorker()
	if err != nil {
		return err
	}
	defer w.rdb.Close()
	c := New(w.rdb, &Options{Near: NearOptions{MaxEntries: 100, MaxAge: time.Hour, Staleness: nearProcStaleness}})
	defer c.Close()
	for deadline := time.Now().Add(cpBarrierTimeout); !nearServing(c); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			return errors.New("the near cache never served")
		}
	}
	key := w.key("hot")
	get := func() (string, error) {
		gctx, cancel := context.WithTimeout(ctx, cpGetTimeout)
		defer cancel()
		v, err := c.Get(gctx, key, time.Hour, func(context.Context) ([]byte, error) {
			return nil, errors.New("the loader ran: the value is in Redis")
		})
		return string(v), err
	}
	var worst time.Duration // the longest a reader saw the old value after the write returned
	for r := 1; r <= w.waves; r++ {
		prev, cur := "v"+strconv.Itoa(r-1), "v"+strconv.Itoa(r)
		// Hold a near copy of the previous value, and read it from memory.
		for deadline := time.Now().Add(cpBarrierTimeout); ; time.Sleep(time.Millisecond) {
			v, err := get()
			if err != nil || v != prev {
				return fmt.Errorf("round %d: before the write, Get = %q, %v; want %q", r, v, err, prev)
			}
			if nearHas(c, key) {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("round %d: no near copy", r)
			}
		}
		before := c.Stats()
		for range 20 {
			if v, err := get(); err != nil || v != prev {
				return fmt.Errorf("round %d: from memory, Get = %q, %v", r, v, err)
			}
		}
		if d := statsDelta(before, c.Stats()); d.NearHits != 20 {
			return fmt.Errorf("round %d: 20 Gets of a near copy made %d near hits", r, d.NearHits)
		}
		if err := w.barrier(ctx, "ready-"+strconv.Itoa(r)); err != nil {
			return err
		}
		written := w.key("written", strconv.Itoa(r))
		if w.inst == r%w.procs {
			if err := c.Set(ctx, key, []byte(cur), time.Hour); err != nil {
				return fmt.Errorf("round %d: Set: %w", r, err)
			}
			if err := w.rdb.Set(ctx, written, "1", time.Hour).Err(); err != nil {
				return err
			}
			if v, err := get(); err != nil || v != cur {
				return fmt.Errorf("round %d: the writer's own Get = %q, %v", r, v, err)
			}
		} else {
			for deadline := time.Now().Add(cpBarrierTimeout); ; time.Sleep(time.Millisecond) {
				n, err := w.rdb.Exists(ctx, written).Result()
				if err != nil {
					return err
				}
				if n == 1 {
					break
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("round %d: the write never returned", r)
				}
			}
			acked := time.Now() // the write returned before this
			for {
				start := time.Now()
				v, err := get()
				if err != nil || (v != prev && v != cur) {
					return fmt.Errorf("round %d: after the write, Get = %q, %v", r, v, err)
				}
				if v == prev {
					worst = max(worst, start.Sub(acked))
				}
				if start.Sub(acked) > nearProcStaleness {
					if v != cur {
						return fmt.Errorf("round %d: a Get %v after the write returned got the old value (bound %v)", r, start.Sub(acked), nearProcStaleness)
					}
					break
				}
				time.Sleep(time.Millisecond)
			}
		}
		if err := w.barrier(ctx, "done-"+strconv.Itoa(r)); err != nil {
			return err
		}
	}
	rep := &cpReport{Inst: w.inst, Pid: w.pid, Stats: c.Stats(),
		Log: []string{fmt.Sprintf("old value seen at most %v after a write returned", worst)}}
	return w.report(ctx, rep)
}
