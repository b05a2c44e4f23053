package herd

// The failover soak: worker processes (re-runs of the test binary) use a
// Cache and a Locker through go-redis failover clients on a Sentinel set
// (master, two replicas, three Sentinels) while the parent fails the
// master over again and again: SENTINEL FAILOVER, kill -9, and SIGSTOP
// past down-after-milliseconds, in turn. The source of truth and one
// FencedStore live on a separate redis-server that never fails; a second
// FencedStore, and the records of a Job, live on the Sentinel set.
//
// Short mode (the default, in CI): 3 failovers (one of each kind), with
// the default options. Full mode (HERD_SOAK=1): 21 failovers, with the
// default options and again with ReplicaAcks -1 (no replica wait), whose
// counts are only reported.
//
// Workload per process: lock holders take a 500ms lease on one of 4 keys
// (TryAcquire), write both downstream FencedStores with its token, hold
// it for 0-400ms (one in ten sleeps past the lease, a paused holder) and
// write again, then release; a job goroutine runs a Job of a 700ms period
// (its lock a Locker on the Sentinel set, its records on the Sentinel
// set's FencedStore) again and again, whose fn one time in ten outlives
// its lease; cache goroutines Get (the loader reads the
// key's version from the source) and, for the keys the process owns,
// Set or Invalidate after an INCR of the version (writes of a key are
// serialised in its owner process).
//
// Checks (counted, and with the replica wait asserted to be zero except
// stale reads, see below):
//
//  1. duplicate tokens: two successful acquisitions of a key with one
//     token; and two holders at once: two leases of a key whose holding
//     (from the acquire to the lease's local validity or its release)
//     overlaps;
//  2. downstream: two different leases whose writes the FencedStore
//     accepted with the same token (tokens not strictly increasing across
//     holders as the downstream saw them);
//  3. undone writes: after each failover settles, a cache key on the new
//     master holds a version below the last Set or Invalidate acknowledged
//     so far (those acknowledged by the deposed master included); and, at
//     the end, a key written once (1 in 10 cache operations: a Set of a
//     new key, half of them followed by an Invalidate) whose acknowledged
//     Set or Invalidate is not reflected on the final master (later
//     writes cannot mask the loss of these);
//  4. stale reads: a Get that started after an acknowledged write of
//     version v and returned a version below v (unless it may have joined
//     an older flight of its process). Reads served by a deposed master
//     during a failover remain possible, so these are asserted to be zero
//     only outside the failover windows;
//  5. undocumented errors: every error is herd's ("herd: " prefix, or
//     errors.Is one of its sentinels);
//  6. fenced writes on the failed-over set: two leases whose writes it
//     accepted with one token (as check 2); a write accepted after a
//     write with a higher token was acknowledged (the deposed holder's
//     write went through: the acknowledged one was lost); and, after each
//     failover settles and at the end, a record whose fence on the master
//     is below the highest token acknowledged so far;
//  7. job periods: a period whose fn started again after a Run that
//     reported it recorded (ran, nil) had ended, or two Runs reporting
//     one period recorded. A Run that could not record its period says
//     so (an error), and the period may then run again.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/herdkit/herd/internal/wire"
	"github.com/redis/go-redis/v9"
)

// Environment of a failover soak worker.
const (
	foEnvSentinels = "HERD_FO_SENTINELS" // comma-separated Sentinel addresses
	foEnvSource    = "HERD_FO_SOURCE"    // the source's and FencedStore's Redis
	foEnvDir       = "HERD_FO_DIR"       // history files; the file "stop" ends the workers
	foEnvProcs     = "HERD_FO_PROCS"     // number of worker processes
	foEnvAcks      = "HERD_FO_ACKS"      // ReplicaAcks
)

// foAckMax records an acknowledged fenced write on the source: the hash
// field KEYS[1]/ARGV[1] is raised to the token ARGV[2] (decimal, as
// fencedset.lua compares them).
var foAckMax = redis.NewScript(`
local top = redis.call('HGET', KEYS[1], ARGV[1])
local tok = ARGV[2]
if not top or #top < #tok or (#top == #tok and top < tok) then
  redis.call('HSET', KEYS[1], ARGV[1], tok)
end
return 1`)

const (
	foLockKeys  = 4
	foCacheKeys = 12
	foLease     = 500 * time.Millisecond
	foTTL       = time.Minute
	foPeriod    = 700 * time.Millisecond
)

func init() {
	workerRoles["failover"] = failoverWorker
}

// foRecord is one operation of a worker's history.
type foRecord struct {
	Kind  string // get, set, inval, lease, write and fwrite (downstream), jobrun (fn started), job (Run returned)
	Key   string
	Proc  int
	Start int64 // unix nanoseconds
	End   int64
	Ver   int64  // get: version returned; set/inval: version written; jobrun/job: the period's start
	Tok   uint64 // lease, write
	Lease string // lease, write, release: the lease's id (proc/seq)
	Valid int64  // lease: its local validity (Lease.Deadline)
	OK    bool   // the operation succeeded (write: accepted)
	Err   string // error class, "" when none
	Msg   string // error text
}

// foErrClass classifies an error; "undocumented" is a failure.
func foErrClass(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrNotReplicated):
		return "ErrNotReplicated"
	case errors.Is(err, ErrLeaseLost):
		return "ErrLeaseLost"
	case errors.Is(err, ErrLeaseHeld):
		return "ErrLeaseHeld"
	case errors.Is(err, ErrFenced):
		return "ErrFenced"
	case errors.Is(err, ErrWaitTimeout):
		return "ErrWaitTimeout"
	case errors.Is(err, ErrLoadFailed):
		return "ErrLoadFailed"
	case errors.Is(err, ErrUnavailable):
		return "ErrUnavailable"
	case strings.HasPrefix(err.Error(), "herd: "):
		return "redis error"
	}
	return "undocumented"
}

func failoverWorker(ctx context.Context, _ string) error {
	proc, _ := strconv.Atoi(os.Getenv(envInstance))
	procs, _ := strconv.Atoi(os.Getenv(foEnvProcs))
	acks, _ := strconv.Atoi(os.Getenv(foEnvAcks))
	dir := os.Getenv(foEnvDir)
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:    redistest.SentinelMasterName,
		SentinelAddrs: strings.Split(os.Getenv(foEnvSentinels), ","),
		DialTimeout:   300 * time.Millisecond,
		ReadTimeout:   time.Second, // above the replica wait's 250ms
		WriteTimeout:  time.Second,
	})
	defer rdb.Close()
	src := redis.NewClient(&redis.Options{Addr: os.Getenv(foEnvSource)})
	defer src.Close()
	cache := New(rdb, &Options{ReplicaAcks: acks, MinLease: foLease, MaxLease: foLease, DefaultLease: foLease})
	defer cache.Close()
	locker := NewLocker(rdb, &LockerOptions{ReplicaAcks: acks})
	defer locker.Close()
	store := NewFencedStore(src, "down")
	fstore := NewFencedStore(rdb, "fdown") // on the failed-over set

	f, err := os.Create(filepath.Join(dir, fmt.Sprintf("history-%d.jsonl", proc)))
	if err != nil {
		return err
	}
	defer f.Close()
	var mu sync.Mutex
	w := bufio.NewWriter(f)
	enc := json.NewEncoder(w)
	record := func(r foRecord) {
		r.Proc = proc
		mu.Lock()
		_ = enc.Encode(r)
		mu.Unlock()
	}
	stopped := func() bool {
		_, err := os.Stat(filepath.Join(dir, "stop"))
		return err == nil
	}
	var keyMu [foCacheKeys]sync.Mutex
	var seq sync.Mutex
	next := 0
	var wg sync.WaitGroup
	for range 2 { // lock holders
		wg.Go(func() {
			for !stopped() {
				key := "lock" + strconv.Itoa(rand.IntN(foLockKeys))
				start := time.Now()
				l, err := locker.TryAcquire(ctx, key, foLease)
				seq.Lock()
				next++
				id := fmt.Sprintf("%d/%d", proc, next)
				seq.Unlock()
				var valid int64
				if l != nil {
					valid = l.Deadline().UnixNano()
				}
				record(foRecord{Kind: "lease", Key: key, Start: start.UnixNano(), End: time.Now().UnixNano(),
					Tok: l.tokenOrZero(), Lease: id, Valid: valid, OK: err == nil, Err: foErrClass(err), Msg: errText(err)})
				if err != nil {
					time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
					continue
				}
				write := func() {
					s := time.Now()
					err := store.Set(ctx, key, l.Token(), []byte(id), 0)
					record(foRecord{Kind: "write", Key: key, Start: s.UnixNano(), End: time.Now().UnixNano(),
						Tok: l.Token(), Lease: id, OK: err == nil, Err: foErrClass(err), Msg: errText(err)})
					s = time.Now()
					err = fstore.Set(ctx, key, l.Token(), []byte(id), 0)
					record(foRecord{Kind: "fwrite", Key: key, Start: s.UnixNano(), End: time.Now().UnixNano(),
						Tok: l.Token(), Lease: id, OK: err == nil, Err: foErrClass(err), Msg: errText(err)})
					if err == nil {
						_ = foAckMax.Run(ctx, src, []string{"facked"}, key, strconv.FormatUint(l.Token(), 10)).Err()
					}
				}
				write()
				hold := time.Duration(rand.IntN(400)) * time.Millisecond
				if rand.IntN(10) == 0 {
					hold = foLease + 200*time.Millisecond // a paused holder
				}
				time.Sleep(hold)
				write()
				rs := time.Now()
				err = l.Release(ctx)
				record(foRecord{Kind: "release", Key: key, Start: rs.UnixNano(), End: time.Now().UnixNano(),
					Tok: l.Token(), Lease: id, OK: err == nil, Err: foErrClass(err), Msg: errText(err)})
			}
		})
	}
	wg.Go(func() { // the job
		for !stopped() {
			at := time.Now()
			period := at.Truncate(foPeriod).UnixNano()
			j := Job{Name: "job", Period: foPeriod, Lock: AnyLock(locker), Done: fstore, Lease: foLease,
				Now: func() time.Time { return at }}
			ran, err := j.Run(ctx, func(ctx context.Context, _ LeaseHandle) error {
				s := time.Now()
				record(foRecord{Kind: "jobrun", Key: "job", Start: s.UnixNano(), End: s.UnixNano(), Ver: period, OK: true})
				work := time.Duration(20+rand.IntN(80)) * time.Millisecond
				if rand.IntN(10) == 0 {
					work = foLease + 200*time.Millisecond // outlives its lease, ignoring ctx
				}
				time.Sleep(work)
				return nil
			})
			record(foRecord{Kind: "job", Key: "job", Start: at.UnixNano(), End: time.Now().UnixNano(), Ver: period,
				OK: ran && err == nil, Err: foErrClass(err), Msg: errText(err)})
			time.Sleep(time.Duration(rand.IntN(50)) * time.Millisecond)
		}
	})
	for range 4 { // cache users
		wg.Go(func() {
			for !stopped() {
				if rand.IntN(10) == 0 {
					// A key written once (and maybe invalidated once):
					// later writes cannot mask its loss.
					seq.Lock()
					next++
					key := fmt.Sprintf("once:%d:%d", proc, next)
					seq.Unlock()
					start := time.Now()
					err := cache.Set(ctx, key, []byte("1"), time.Hour)
					record(foRecord{Kind: "oset", Key: key, Start: start.UnixNano(), End: time.Now().UnixNano(),
						OK: err == nil, Err: foErrClass(err), Msg: errText(err)})
					if err == nil && rand.IntN(2) == 0 {
						start = time.Now()
						err = cache.Invalidate(ctx, key)
						record(foRecord{Kind: "oinval", Key: key, Start: start.UnixNano(), End: time.Now().UnixNano(),
							OK: err == nil, Err: foErrClass(err), Msg: errText(err)})
					}
					continue
				}
				i := rand.IntN(foCacheKeys)
				key := "c" + strconv.Itoa(i)
				start := time.Now()
				if i%procs == proc && rand.IntN(5) == 0 {
					keyMu[i].Lock()
					v, err := src.Incr(ctx, "ver:"+key).Result()
					if err != nil {
						keyMu[i].Unlock()
						continue
					}
					kind := "set"
					if rand.IntN(2) == 0 {
						err = cache.Set(ctx, key, []byte(strconv.FormatInt(v, 10)), foTTL)
					} else {
						kind = "inval"
						err = cache.Invalidate(ctx, key)
					}
					record(foRecord{Kind: kind, Key: key, Start: start.UnixNano(), End: time.Now().UnixNano(),
						Ver: v, OK: err == nil, Err: foErrClass(err), Msg: errText(err)})
					if err == nil {
						_ = src.HSet(ctx, "acked", key, v).Err()
					}
					keyMu[i].Unlock()
					continue
				}
				b, err := cache.Get(ctx, key, foTTL, func(ctx context.Context) ([]byte, error) {
					v, err := src.Get(ctx, "ver:"+key).Result()
					if errors.Is(err, redis.Nil) {
						return []byte("0"), nil
					}
					return []byte(v), err
				})
				v, _ := strconv.ParseInt(string(b), 10, 64)
				record(foRecord{Kind: "get", Key: key, Start: start.UnixNano(), End: time.Now().UnixNano(),
					Ver: v, OK: err == nil, Err: foErrClass(err), Msg: errText(err)})
				time.Sleep(time.Duration(rand.IntN(5)) * time.Millisecond)
			}
		})
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	return w.Flush()
}

func (l *Lease) tokenOrZero() uint64 {
	if l == nil {
		return 0
	}
	return l.token
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// foCounts are the soak's findings.
type foCounts struct {
	Failovers                    int
	Ops                          int
	Leases, Writes, Accepted     int
	AckedWrites                  int
	DuplicateTokens              int // check 1
	OverlappingHolders           int // check 1b: two leases of a key valid at once
	SharedDownstreamTokens       int // check 2
	FencedWrites, FencedAccepted int
	FencedSharedTokens           int // check 6: as check 2, on the failed-over set
	FencedDeposedAccepted        int // check 6: accepted after a higher token was acknowledged
	FencedUndone                 int // check 6: a record's fence below an acknowledged token
	JobRuns, JobsRecorded        int
	JobPeriodsRunAgain           int // check 7
	Undone                       int // check 3
	StaleReads                   int // check 4, all
	StaleReadsOutside            int // check 4, outside failover windows
	Undocumented                 int // check 5
	Errors                       map[string]int
}

func TestFailoverSoak(t *testing.T) {
	t.Parallel()
	full := os.Getenv("HERD_SOAK") == "1"
	n := 3
	if full {
		n = 21
	}
	t.Run("replica wait", func(t *testing.T) {
		c := runFailoverSoak(t, n, 0)
		for name, v := range map[string]int{
			"duplicate tokens":                               c.DuplicateTokens,
			"two holders at once":                            c.OverlappingHolders,
			"downstream writes of two leases with one token": c.SharedDownstreamTokens,
			"acknowledged writes undone":                     c.Undone,
			"fenced writes of two leases with one token":     c.FencedSharedTokens,
			"fenced writes of a deposed holder accepted":     c.FencedDeposedAccepted,
			"acknowledged fenced writes undone":              c.FencedUndone,
			"job periods run again after being recorded":     c.JobPeriodsRunAgain,
			"stale reads outside failovers":                  c.StaleReadsOutside,
			"undocumented errors":                            c.Undocumented,
		} {
			if v != 0 {
				t.Errorf("%s: %d", name, v)
			}
		}
		if c.AckedWrites == 0 || c.Accepted == 0 || c.FencedAccepted == 0 || c.JobsRecorded == 0 {
			t.Errorf("the workload did nothing: %+v", c)
		}
	})
	if full {
		t.Run("no replica wait", func(t *testing.T) {
			c := runFailoverSoak(t, n, -1)
			if c.Undocumented != 0 {
				t.Errorf("undocumented errors: %d", c.Undocumented)
			}
		})
	}
}

type foWindow struct{ start, end int64 }

func runFailoverSoak(t *testing.T, failovers, acks int) foCounts {
	s := redistest.StartSentinel(t)
	src := redistest.Start(t)
	srcc := src.Client(t)
	ctx := context.Background()
	dir := t.TempDir()
	procs := 3
	w := startWorkers(t, procs, "failover",
		foEnvSentinels+"="+strings.Join(s.SentinelAddrs(), ","), foEnvSource+"="+src.Addr(),
		foEnvDir+"="+dir, foEnvProcs+"="+strconv.Itoa(procs), foEnvAcks+"="+strconv.Itoa(acks))

	undone, fundone := 0, 0
	var windows []foWindow
	time.Sleep(2 * time.Second) // the workers start
	for i := range failovers {
		start := time.Now()
		kind := []string{"SENTINEL FAILOVER", "kill -9", "SIGSTOP"}[i%3]
		switch i % 3 {
		case 0:
			s.Failover(t)
		case 1:
			s.KillMaster(t)
		case 2:
			s.PauseMaster(t)
		}
		s.WaitSettled(t)
		windows = append(windows, foWindow{start.UnixNano(), time.Now().Add(2 * time.Second).UnixNano()})
		// Every write acknowledged so far, the deposed master's during the
		// failover included, must be on the settled master.
		acked, err := srcc.HGetAll(ctx, "acked").Result()
		if err != nil {
			t.Fatalf("HGETALL acked: %v", err)
		}
		undone += checkUndone(t, s.Master(t), acked)
		facked, err := srcc.HGetAll(ctx, "facked").Result()
		if err != nil {
			t.Fatalf("HGETALL facked: %v", err)
		}
		fundone += checkFencedUndone(t, s.Master(t), facked)
		t.Logf("failover %d (%s): settled after %v", i+1, kind, time.Since(start).Round(time.Millisecond))
		time.Sleep(2 * time.Second) // load on a settled set
	}
	if err := os.WriteFile(filepath.Join(dir, "stop"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	w.wait(30 * time.Second)
	c := checkFailoverHistories(t, dir, procs, windows, s.Master(t))
	facked, err := srcc.HGetAll(ctx, "facked").Result()
	if err != nil {
		t.Fatalf("HGETALL facked: %v", err)
	}
	fundone += checkFencedUndone(t, s.Master(t), facked)
	c.Failovers, c.Undone, c.FencedUndone = failovers, c.Undone+undone, c.FencedUndone+fundone
	t.Logf("ReplicaAcks %d: %+v", acks, c)
	return c
}

// checkUndone counts the cache keys whose value on the settled master is
// older than the last write acknowledged before (acked was read first).
func checkUndone(t *testing.T, m *redistest.Server, acked map[string]string) int {
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer c.Close()
	n := 0
	for key, vs := range acked {
		want, _ := strconv.ParseInt(vs, 10, 64)
		keys, _ := makeKeys(DefaultPrefix, key)
		b, err := c.Get(context.Background(), keys.Value).Bytes()
		if err != nil {
			continue // no value: the next Get loads the source
		}
		env, ok := wire.DecodeEnvelope(b)
		if !ok {
			continue
		}
		if got, _ := strconv.ParseInt(string(env.Payload), 10, 64); got < want {
			t.Logf("undone: %s holds version %d on the new master, %d was acknowledged before the failover", key, got, want)
			n++
		}
	}
	return n
}

// checkFencedUndone counts the records of the failed-over set's
// FencedStore whose fence on the master is below the highest token a
// write acknowledged before (acked was read first).
func checkFencedUndone(t *testing.T, m *redistest.Server, acked map[string]string) int {
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer c.Close()
	n := 0
	for key, ts := range acked {
		want, _ := strconv.ParseUint(ts, 10, 64)
		keys, _ := makeKeys("fdown", key)
		top, err := c.HGet(context.Background(), keys.Record, "t").Uint64()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatalf("HGET %s on the master: %v", keys.Record, err)
		}
		if top < want {
			t.Logf("undone: the fenced record %s has fence %d on the master, token %d was acknowledged", key, top, want)
			n++
		}
	}
	return n
}

func checkFailoverHistories(t *testing.T, dir string, procs int, windows []foWindow, master *redistest.Server) foCounts {
	var recs []foRecord
	for i := range procs {
		f, err := os.Open(filepath.Join(dir, fmt.Sprintf("history-%d.jsonl", i)))
		if err != nil {
			t.Fatalf("history of worker %d: %v", i, err)
		}
		dec := json.NewDecoder(f)
		for {
			var r foRecord
			if err := dec.Decode(&r); err != nil {
				break
			}
			recs = append(recs, r)
		}
		f.Close()
	}
	c := foCounts{Ops: len(recs), Errors: map[string]int{}}
	tokens := map[string]map[uint64]string{}     // key → token → lease id
	downstream := map[string]map[uint64]string{} // key → token → lease id accepted
	var gets []foRecord
	var writes []foRecord
	fenced := map[string][]foRecord{}         // key → accepted fwrites
	ftokens := map[string]map[uint64]string{} // key → token → lease id accepted
	jobRuns := map[int64][]foRecord{}         // period → fn starts
	jobDone := map[int64][]foRecord{}         // period → Runs that recorded it
	for _, r := range recs {
		if r.Err != "" && r.Err != "ErrLeaseHeld" && r.Err != "ErrFenced" && r.Err != "ErrLeaseLost" {
			c.Errors[r.Kind+": "+r.Err]++
		}
		if r.Err == "undocumented" {
			c.Undocumented++
			t.Logf("undocumented error: %+v", r)
		}
		switch r.Kind {
		case "lease":
			if !r.OK {
				continue
			}
			c.Leases++
			if tokens[r.Key] == nil {
				tokens[r.Key] = map[uint64]string{}
			}
			if other, dup := tokens[r.Key][r.Tok]; dup {
				c.DuplicateTokens++
				t.Logf("token %d of %s issued to %s and %s", r.Tok, r.Key, other, r.Lease)
			}
			tokens[r.Key][r.Tok] = r.Lease
		case "write":
			c.Writes++
			if !r.OK {
				continue
			}
			c.Accepted++
			if downstream[r.Key] == nil {
				downstream[r.Key] = map[uint64]string{}
			}
			if other, ok := downstream[r.Key][r.Tok]; ok && other != r.Lease {
				c.SharedDownstreamTokens++
				t.Logf("downstream accepted token %d of %s from %s and %s", r.Tok, r.Key, other, r.Lease)
			}
			downstream[r.Key][r.Tok] = r.Lease
		case "fwrite":
			c.FencedWrites++
			if !r.OK {
				continue
			}
			c.FencedAccepted++
			fenced[r.Key] = append(fenced[r.Key], r)
			if ftokens[r.Key] == nil {
				ftokens[r.Key] = map[uint64]string{}
			}
			if other, ok := ftokens[r.Key][r.Tok]; ok && other != r.Lease {
				c.FencedSharedTokens++
				t.Logf("the failed-over set's store accepted token %d of %s from %s and %s", r.Tok, r.Key, other, r.Lease)
			}
			ftokens[r.Key][r.Tok] = r.Lease
		case "jobrun":
			c.JobRuns++
			jobRuns[r.Ver] = append(jobRuns[r.Ver], r)
		case "job":
			if r.OK {
				c.JobsRecorded++
				jobDone[r.Ver] = append(jobDone[r.Ver], r)
			}
		case "get":
			if r.OK {
				gets = append(gets, r)
			}
		case "set", "inval":
			if r.OK {
				c.AckedWrites++
				writes = append(writes, r)
			}
		}
	}
	inWindow := func(start, end int64) bool {
		for _, w := range windows {
			if start < w.end && end > w.start {
				return true
			}
		}
		return false
	}
	// Keys written once: an acknowledged Set must still be on the final
	// master, and so must the absence after an acknowledged Invalidate. A
	// key whose Invalidate was not acknowledged may be either way.
	once := map[string]string{} // key → "set" or "inval" (acknowledged), "" ambiguous
	onceEnd := map[string]int64{}
	for _, r := range recs {
		if r.Kind == "oset" {
			onceEnd[r.Key] = r.End
		}
		switch {
		case r.Kind == "oset" && r.OK:
			c.AckedWrites++
			if _, seen := once[r.Key]; !seen {
				once[r.Key] = "set"
			}
		case r.Kind == "oinval" && r.OK:
			c.AckedWrites++
			once[r.Key] = "inval"
		case r.Kind == "oinval":
			once[r.Key] = ""
		}
	}
	mc := redis.NewClient(&redis.Options{Addr: master.Addr()})
	defer mc.Close()
	for key, want := range once {
		if want == "" {
			continue
		}
		keys, _ := makeKeys(DefaultPrefix, key)
		n, err := mc.Exists(context.Background(), keys.Value).Result()
		if err != nil {
			t.Fatalf("EXISTS on the final master: %v", err)
		}
		if (want == "set") != (n == 1) {
			c.Undone++
			where := "outside the failovers"
			for i, w := range windows {
				if onceEnd[key] > w.start && onceEnd[key] < w.end {
					where = fmt.Sprintf("in failover %d (+%v)", i+1, time.Duration(onceEnd[key]-w.start))
				}
			}
			t.Logf("undone: the acknowledged %s of %s (written %s) is not on the final master", want, key, where)
		}
	}

	// Fenced writes on the failed-over set: none accepted after a write
	// with a higher token was acknowledged.
	for _, ws := range fenced {
		for _, w := range ws {
			for _, o := range ws {
				if o.Tok > w.Tok && o.End < w.Start {
					c.FencedDeposedAccepted++
					t.Logf("the failed-over set's store accepted %s's token %d after %s's token %d was acknowledged", w.Lease, w.Tok, o.Lease, o.Tok)
					break
				}
			}
		}
	}
	// Job periods: once a Run reported its period recorded, no fn of that
	// period starts again, and no second Run reports it recorded.
	for p, done := range jobDone {
		if len(done) > 1 {
			c.JobPeriodsRunAgain += len(done) - 1
			t.Logf("period %d reported recorded by %d Runs", p, len(done))
		}
		first := done[0].End
		for _, d := range done {
			first = min(first, d.End)
		}
		for _, r := range jobRuns[p] {
			if r.Start > first {
				c.JobPeriodsRunAgain++
				t.Logf("period %d ran again in process %d after a Run reported it recorded", p, r.Proc)
			}
		}
	}

	// Mutual exclusion: a lease is held from its acquire's start until
	// its local validity or its release's start, whichever is first.
	released := map[string]int64{}
	for _, r := range recs {
		if r.Kind == "release" {
			released[r.Lease] = r.Start
		}
	}
	held := map[string][]foWindow{}
	for _, r := range recs {
		if r.Kind == "lease" && r.OK {
			end := r.Valid
			if rel, ok := released[r.Lease]; ok && rel < end {
				end = rel
			}
			held[r.Key] = append(held[r.Key], foWindow{r.End, end})
		}
	}
	for _, hs := range held {
		sort.Slice(hs, func(i, j int) bool { return hs[i].start < hs[j].start })
		maxEnd := int64(0)
		for _, h := range hs {
			if h.start < maxEnd {
				c.OverlappingHolders++
			}
			maxEnd = max(maxEnd, h.end)
		}
	}

	// Per key, the acknowledged writes by end time with the running
	// highest version; per key and process, the Gets by start time.
	sort.Slice(writes, func(i, j int) bool { return writes[i].End < writes[j].End })
	byKey := map[string][]foRecord{}
	for _, w := range writes {
		ws := byKey[w.Key]
		if n := len(ws); n > 0 && ws[n-1].Ver > w.Ver {
			w.Ver = ws[n-1].Ver // keep the highest so far, with this end time
		}
		byKey[w.Key] = append(ws, w)
	}
	sort.Slice(gets, func(i, j int) bool { return gets[i].Start < gets[j].Start })
	byProc := map[string][]foRecord{}
	for _, g := range gets {
		k := g.Key + "|" + strconv.Itoa(g.Proc)
		byProc[k] = append(byProc[k], g)
	}
	for _, g := range gets {
		ws := byKey[g.Key]
		i := sort.Search(len(ws), func(i int) bool { return ws[i].End >= g.Start }) - 1
		if i < 0 || g.Ver >= ws[i].Ver {
			continue
		}
		if joinedOlder(byProc[g.Key+"|"+strconv.Itoa(g.Proc)], g, ws[i].End) {
			continue
		}
		c.StaleReads++
		if !inWindow(ws[i].End, g.End) {
			c.StaleReadsOutside++
			t.Logf("stale read outside a failover (after a write of version %d that ended at %d): %+v", ws[i].Ver, ws[i].End, g)
		}
	}
	return c
}

// joinedOlder reports whether g may have joined a flight of its process
// that began before t: a Get of the same key in the same process (same,
// sorted by start) started before t and ended after g started. Gets that
// started more than a minute before g are not looked at.
func joinedOlder(same []foRecord, g foRecord, t int64) bool {
	i := sort.Search(len(same), func(i int) bool { return same[i].Start >= g.Start })
	for j := i - 1; j >= 0 && same[j].Start > g.Start-int64(time.Minute); j-- {
		if o := same[j]; o.Start < t && o.End >= g.Start {
			return true
		}
	}
	return false
}
