package herd

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdkit/herd/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// writePathFiles are the files that may send a script: the write path.
var writePathFiles = map[string]bool{"scripts.go": true, "writepath.go": true, "replicate.go": true}

// writeCommand matches a Lua call of a Redis command that writes.
var writeCommand = regexp.MustCompile(`redis\.p?call\('(SET|SETEX|PSETEX|INCR|INCRBY|HSET|HINCRBY|HDEL|DEL|UNLINK|PEXPIRE|EXPIRE|PERSIST|ZADD|ZREM|ZREMRANGEBYSCORE|SADD|SREM|PUBLISH|SPUBLISH)'`)

// plainWrites are the go-redis methods that send a write command. herd
// writes only in scripts, through the write path; a method of this name
// outside it is a write that skips the replica wait and the error rules.
// (Names herd uses for its own methods, such as Set, are not here; Do
// with a literal command name is checked apart.)
var plainWrites = map[string]bool{
	"SetNX": true, "SetEx": true, "SetXX": true, "SetArgs": true, "MSet": true, "MSetNX": true, "GetSet": true, "GetDel": true, "GetEx": true,
	"Del": true, "Unlink": true, "Expire": true, "PExpire": true, "ExpireAt": true, "PExpireAt": true, "Persist": true, "Rename": true, "RenameNX": true,
	"Incr": true, "IncrBy": true, "Decr": true, "DecrBy": true, "Append": true,
	"HSet": true, "HSetNX": true, "HMSet": true, "HDel": true, "HIncrBy": true,
	"ZAdd": true, "ZRem": true, "ZRemRangeByScore": true, "SAdd": true, "SRem": true, "LPush": true, "RPush": true,
	"Publish": true, "SPublish": true, "FlushDB": true, "FlushAll": true,
}

// TestEveryScriptGoesThroughTheWritePath is the guard of the one write
// path: no code outside it sends a script, a raw EVAL or a plain write
// command (a go-redis write method, or Do with a write command), every script is
// declared in scripts.go and listed in allScripts, and each script's kind
// matches its Lua (a script that writes is never sent as a read, and only
// lease releases skip the replica wait).
func TestEveryScriptGoesThroughTheWritePath(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]*ast.File{}
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files[name] = f
	}
	raw := map[string]bool{"Eval": true, "EvalSha": true, "EvalRO": true, "EvalShaRO": true, "ScriptLoad": true, "FCall": true, "FCallRO": true}
	declared := 0
	for name, file := range files {
		inPath := writePathFiles[name]
		ast.Inspect(file, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.SelectorExpr:
				if n.Sel.Name == "rs" && !inPath {
					t.Errorf("%s: a script's redis.Script is used outside the write path", fset.Position(n.Pos()))
				}
			case *ast.CallExpr:
				sel, ok := n.Fun.(*ast.SelectorExpr)
				if !ok {
					if id, ok := n.Fun.(*ast.Ident); ok && id.Name == "newScript" {
						declared++
						if name != "scripts.go" {
							t.Errorf("%s: a script declared outside scripts.go", fset.Position(n.Pos()))
						}
					}
					return true
				}
				if x, ok := sel.X.(*ast.Ident); ok && x.Name == "redis" && sel.Sel.Name == "NewScript" && name != "scripts.go" {
					t.Errorf("%s: redis.NewScript outside scripts.go", fset.Position(n.Pos()))
				}
				if raw[sel.Sel.Name] && !inPath {
					t.Errorf("%s: %s sent outside the write path", fset.Position(n.Pos()), sel.Sel.Name)
				}
				if plainWrites[sel.Sel.Name] && !inPath {
					t.Errorf("%s: the Redis write command %s sent outside the write path (write in a script, through the path)", fset.Position(n.Pos()), sel.Sel.Name)
				}
				if sel.Sel.Name == "Do" && len(n.Args) > 1 && !inPath {
					if lit, ok := n.Args[1].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						if name, _ := strconv.Unquote(lit.Value); writeCommand.MatchString("redis.call('" + strings.ToUpper(name) + "'") {
							t.Errorf("%s: the Redis write command %s sent with Do outside the write path", fset.Position(n.Pos()), lit.Value)
						}
					}
				}
			}
			return true
		})
	}
	if declared != len(allScripts) {
		t.Errorf("scripts.go declares %d scripts, allScripts lists %d", declared, len(allScripts))
	}
	for _, s := range allScripts {
		src := scriptSource(t, s)
		w := writeCommand.FindString(src)
		switch {
		case s.kind == reads && w != "":
			t.Errorf("script %s is declared reads but calls %s", s.name, w)
		case s.kind != reads && w == "":
			t.Errorf("script %s is declared as writing but calls no write command", s.name)
		case s.kind == releases && !strings.HasSuffix(s.name, "release"):
			t.Errorf("script %s skips the replica wait but is not a lease release", s.name)
		}
	}
}

// scriptSource returns s's Lua.
func scriptSource(t *testing.T, s *script) string {
	t.Helper()
	if s == getScript {
		return getLua
	}
	b, err := os.ReadFile("scripts/" + s.name + ".lua")
	if err != nil {
		t.Fatalf("script %s: %v", s.name, err)
	}
	return string(b)
}

// TestOnlyAnUnansweringRedisIsAnOutage: the write path's classification.
// An outage is what Redis did not answer; herd's own refusals and Redis's
// error replies are not, also when they are wrapped or joined.
func TestOnlyAnUnansweringRedisIsAnOutage(t *testing.T) {
	t.Parallel()
	netErr := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	for _, tc := range []struct {
		name string
		err  error
		want errKind
	}{
		{"nil", nil, kindNone},
		{"redis.Nil", redis.Nil, kindAnswer},
		{"WRONGTYPE", fmt.Errorf("herd: x: %w", redisReply("WRONGTYPE Operation against a key holding the wrong kind of value")), kindAnswer},
		{"script error", redisReply("ERR Error running script (call to f_1): @user_script:1: bad"), kindAnswer},
		{"READONLY in a script", redisReply("ERR Error running script (call to f_1): @user_script:3: @user_script: 3: -READONLY You can't write against a read only replica."), kindDown},
		{"LOADING", redisReply("LOADING Redis is loading the dataset in memory"), kindDown},
		{"not replicated", fmt.Errorf("%w: 0 of 1 replicas acknowledged within 250ms", ErrNotReplicated), kindRefusal},
		{"not replicated, wrapped twice", fmt.Errorf("herd: commit: %w", fmt.Errorf("%w: x", ErrNotReplicated)), kindRefusal},
		{"WAIT's connection broke", fmt.Errorf("%w: WAIT: %w", ErrNotReplicated, netErr), kindDown},
		{"tag index full", errors.Join(fmt.Errorf("%w: tag %q", ErrTagFull, "a"), fmt.Errorf("%w: tag %q", ErrTagFull, "b")), kindRefusal},
		{"invalid tag", fmt.Errorf("%w: empty tag", ErrInvalidTag), kindRefusal},
		{"bad reply", fmt.Errorf("%w: [x]", errBadReply), kindRefusal},
		{"purge gave up", fmt.Errorf("%w: more than 1000 pages", errPurgeTooLong), kindRefusal},
		{"cancelled", fmt.Errorf("herd: x: %w", context.Canceled), kindCtx},
		{"network", netErr, kindDown},
		{"EOF", io.EOF, kindDown},
		{"timeout", context.DeadlineExceeded, kindDown},
		{"refusal joined with an outage", errors.Join(ErrTagFull, netErr), kindDown},
	} {
		if got := classify(tc.err); got != tc.want {
			t.Errorf("%s: classify(%v) = %d, want %d", tc.name, tc.err, got, tc.want)
		}
	}
}

// redisReply is an error reply as go-redis returns one.
type redisReply string

func (e redisReply) Error() string { return string(e) }
func (redisReply) RedisError()     {}

// TestStalledReplicaLeavesTheBreakerClosed: with one replica stopped
// (SIGSTOP) and the master healthy, misses that get "not replicated" fail
// open one by one (ReplicaAcks' promise: only that miss) and never open
// the breaker: a key whose value is in Redis is still served from it, by
// Get, by Peek and with FailClosed.
func TestStalledReplicaLeavesTheBreakerClosed(t *testing.T) {
	t.Parallel()
	s := redistest.StartSentinel(t)
	rdb := s.Client(t)
	ctx := context.Background()
	c := newTestCache(t, rdb, nil)
	closed := newTestCache(t, rdb, &Options{FailClosed: true})
	key := testKey(t) + "present"
	// Stored while every replica runs, by a writer that gives them 2s to
	// acknowledge (the default 250ms is for the claim below, not for a
	// loaded machine's healthy replicas).
	w := newTestCache(t, rdb, &Options{ReplicaTimeout: failoverReplicaTimeout})
	if err := w.Set(ctx, key, []byte("stored"), time.Minute); err != nil {
		t.Fatal(err)
	}
	stalled := s.Nodes()[1]
	if stalled == s.Master(t) {
		stalled = s.Nodes()[2]
	}
	stalled.Pause(t)
	defer stalled.Resume(t)

	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for i := range 12 {
		wg.Go(func() {
			_, err := c.Get(ctx, fmt.Sprintf("%smiss%d", testKey(t), i), time.Minute, func(context.Context) ([]byte, error) {
				return []byte("loaded"), nil
			})
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		})
	}
	for i := range 12 {
		wg.Go(func() {
			// FailClosed: the miss itself fails (not replicated); only it.
			_, _ = closed.Get(ctx, fmt.Sprintf("%sclosed%d", testKey(t), i), time.Minute, func(context.Context) ([]byte, error) {
				return []byte("loaded"), nil
			})
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Errorf("a miss with a stalled replica: %v, want a local load", err)
		}
	}
	st := c.Stats()
	if st.FailOpen == 0 {
		t.Fatalf("no miss failed open (stats %+v): the replica did not stall the writes", st)
	}
	if st.BreakerOpens != 0 {
		t.Errorf("BreakerOpens = %d after %d misses refused as not replicated, want 0", st.BreakerOpens, st.FailOpen)
	}
	loads := 0
	v, err := c.Get(ctx, key, time.Minute, func(context.Context) ([]byte, error) {
		loads++
		return []byte("loaded"), nil
	})
	if err != nil || string(v) != "stored" || loads != 0 {
		t.Errorf("Get of a key in Redis = %q, %v with %d loads, want the stored value and no load", v, err, loads)
	}
	if v, found, err := c.Peek(ctx, key); err != nil || !found || string(v) != "stored" {
		t.Errorf("Peek = %q, %v, %v, want the stored value", v, found, err)
	}
	if n := closed.Stats().BreakerOpens; n != 0 {
		t.Errorf("FailClosed: BreakerOpens = %d, want 0", n)
	}
	if v, err := closed.Get(ctx, key, time.Minute, func(context.Context) ([]byte, error) { return nil, errors.New("not called") }); err != nil || string(v) != "stored" {
		t.Errorf("FailClosed Get = %q, %v, want the stored value", v, err)
	}
}

// TestTagRefusalsLeaveTheBreakerClosed: SetTags' promise that only that
// value goes unstored. Rebuilds whose tags are refused (an invalid tag, a
// full index) on a healthy Redis do not open the breaker.
func TestTagRefusalsLeaveTheBreakerClosed(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		tags []string
	}{
		{"InvalidTag", []string{""}},
		{"IndexFull", []string{"layout"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newTestCache(t, rdb, &Options{Prefix: "brk" + tc.name, MaxTagEntries: 1})
			present := testKey(t) + "present"
			if err := c.Set(ctx, present, []byte("stored"), time.Minute); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			for i := range 8 {
				wg.Go(func() {
					_, _ = c.Get(ctx, fmt.Sprintf("%s%d", testKey(t), i), time.Minute, func(ctx context.Context) ([]byte, error) {
						_ = SetTags(ctx, tc.tags...)
						return []byte("v"), nil
					})
				})
			}
			wg.Wait()
			st := c.Stats()
			if st.CommitErrors < 7 {
				t.Fatalf("CommitErrors = %d, want the tags refused for at least 7 of 8 rebuilds", st.CommitErrors)
			}
			if st.BreakerOpens != 0 {
				t.Errorf("BreakerOpens = %d after tag refusals on a healthy Redis, want 0", st.BreakerOpens)
			}
			loads := 0
			v, err := c.Get(ctx, present, time.Minute, func(context.Context) ([]byte, error) { loads++; return nil, nil })
			if err != nil || string(v) != "stored" || loads != 0 {
				t.Errorf("Get of a stored key = %q, %v with %d loads, want it from Redis", v, err, loads)
			}
		})
	}
}

// truncateMGet is a go-redis hook that drops the last value of every MGET
// reply, and counts them: a reply herd cannot read, from a Redis that
// answers.
type truncateMGet struct{ n *atomic.Int64 }

func (truncateMGet) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h truncateMGet) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.truncate(cmd)
		return err
	}
}

func (h truncateMGet) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			h.truncate(cmd)
		}
		return err
	}
}

func (h truncateMGet) truncate(cmd redis.Cmder) {
	if c, ok := cmd.(*redis.SliceCmd); ok && cmd.Name() == "mget" && len(c.Val()) > 0 {
		c.SetVal(c.Val()[:len(c.Val())-1])
		h.n.Add(1)
	}
}

// TestUnreadableReplyLeavesTheBreakerClosed: a Redis that answers, with a
// reply herd cannot read (an MGET with one value too few), fails the
// calls that read it, and is not an outage: after more such GetMany
// calls than the breaker's threshold (whose keys then go through the
// flight, as misses) the breaker has not opened, and a Get of a stored
// key is still served from Redis.
func TestUnreadableReplyLeavesTheBreakerClosed(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	c := newTestCache(t, rdb, &Options{Prefix: "badreply", BreakerThreshold: 3})
	present := testKey(t) + "present"
	if err := c.Set(ctx, present, []byte("stored"), time.Minute); err != nil {
		t.Fatal(err)
	}
	bad := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { bad.Close() })
	var truncated atomic.Int64
	bad.AddHook(truncateMGet{&truncated})
	cb := newTestCache(t, bad, &Options{Prefix: "badreply", BreakerThreshold: 3})
	for i := range 10 {
		keys := []string{fmt.Sprintf("%sa%d", testKey(t), i), fmt.Sprintf("%sb%d", testKey(t), i)}
		for _, k := range keys {
			if err := c.Set(ctx, k, []byte("stored"), time.Minute); err != nil {
				t.Fatal(err)
			}
		}
		_, _ = cb.GetMany(ctx, keys, time.Minute, func(ctx context.Context, keys []string) (map[string][]byte, error) {
			out := map[string][]byte{}
			for _, k := range keys {
				out[k] = []byte("loaded")
			}
			return out, nil
		})
	}
	if st := cb.Stats(); st.BreakerOpens != 0 {
		t.Errorf("BreakerOpens = %d after unreadable replies from a Redis that answers, want 0", st.BreakerOpens)
	}
	if n := truncated.Load(); n < 10 {
		t.Errorf("%d MGET replies made unreadable, want one per GetMany (10)", n)
	}
	loads := 0
	v, err := cb.Get(ctx, present, time.Minute, func(context.Context) ([]byte, error) { loads++; return nil, nil })
	if err != nil || string(v) != "stored" || loads != 0 {
		t.Errorf("Get of a stored key = %q, %v with %d loads, want it from Redis", v, err, loads)
	}
}
