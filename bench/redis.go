package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// redisSpec tells a worker which Redis to use.
type redisSpec struct {
	Kind  string   `json:"kind"` // "embedded", "redis" or "cluster"
	Addrs []string `json:"addrs"`
}

// newClient returns the go-redis client every strategy of a phase uses,
// configured the same way for all of them.
func newClient(spec redisSpec) redis.UniversalClient {
	if spec.Kind == "cluster" {
		return redis.NewClusterClient(&redis.ClusterOptions{
			Addrs:        spec.Addrs,
			ReadTimeout:  time.Second,
			WriteTimeout: time.Second,
		})
	}
	return redis.NewClient(&redis.Options{
		Addr:         spec.Addrs[0],
		ReadTimeout:  time.Second,
		WriteTimeout: time.Second,
	})
}

// counter is a go-redis hook that counts the commands a process sends
// (each command of a pipeline counts once) and those that failed with
// anything but redis.Nil. Pub/sub frames (SUBSCRIBE, UNSUBSCRIBE) do not
// go through hooks; the server-side count includes them. A new
// connection's handshake (HELLO, CLIENT ...) is not counted: go-redis
// 9.23 also sends CLIENT MAINT_NOTIFICATIONS, which Redis 7 and miniredis
// reject and go-redis ignores.
type counter struct {
	cmds, errs atomic.Int64
	canceled   atomic.Int64
	mu         sync.Mutex
	byErr      map[string]int64 // error text -> count (at most maxErrKinds texts)
}

const maxErrKinds = 8

func (c *counter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if handshake(cmd) {
			return next(ctx, cmd)
		}
		c.cmds.Add(1)
		err := next(ctx, cmd)
		c.failed(err)
		return err
	}
}

func (c *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			if !handshake(cmd) {
				c.cmds.Add(1)
				c.failed(cmd.Err())
			}
		}
		return err
	}
}

func handshake(cmd redis.Cmder) bool {
	switch strings.ToLower(cmd.Name()) {
	case "hello", "client":
		return true
	}
	return false
}

func (c *counter) failed(err error) {
	if err == nil || errors.Is(err, redis.Nil) || strings.HasPrefix(err.Error(), "NOSCRIPT") {
		return // a miss, or EVALSHA's expected first miss (go-redis then sends EVAL)
	}
	if errors.Is(err, context.Canceled) {
		// Cancelled by the process itself (for example herd stopping a
		// lease's renewal when the rebuild ends): not a Redis failure.
		c.canceled.Add(1)
		return
	}
	c.errs.Add(1)
	msg := err.Error()
	if len(msg) > 120 {
		msg = msg[:120]
	}
	c.mu.Lock()
	if c.byErr == nil {
		c.byErr = map[string]int64{}
	}
	if _, ok := c.byErr[msg]; ok || len(c.byErr) < maxErrKinds {
		c.byErr[msg]++
	}
	c.mu.Unlock()
}

// errors returns the counts per error text.
func (c *counter) errorKinds() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int64, len(c.byErr))
	for k, v := range c.byErr {
		out[k] = v
	}
	return out
}

// Where the Redis under test comes from: the kind field of redisEnv and
// results.
const (
	redisStarted  = "started"         // a redis-server from $PATH, started and stopped by this run
	redisEmbedded = "embedded"        // miniredis, served by the parent process
	redisGiven    = "redis"           // the server named by -redis
	redisCluster  = "cluster"         // the cluster named by -cluster
	redisOwnClust = "started-cluster" // -cluster start: three masters started and stopped by this run
)

// miniredisDesc is how the reports name the embedded Redis.
const miniredisDesc = "miniredis (embedded emulation: Lua is serialised, latencies are not representative)"

// redisEnv is the parent's handle on the Redis under test.
type redisEnv struct {
	kind    string // one of the redis* kinds above
	version string // INFO server redis_version; "" for miniredis or when unknown
	spec    redisSpec
	admin   redis.UniversalClient
	mini    *miniredis.Miniredis
	srv     *ownServer // the redis-server this run started, or nil
	// clusterStop stops the cluster this run started (-cluster start).
	clusterStop func()
	stop        chan struct{}
	done        chan struct{}
}

// redisSource decides where the Redis comes from: the server or cluster
// the flags name; else miniredis when -embedded is set or no redis-server
// is on $PATH; else a redis-server of our own.
func redisSource(cfg *config) string {
	switch {
	case cfg.StartCluster:
		return redisOwnClust
	case len(cfg.ClusterAddrs) > 0:
		return redisCluster
	case cfg.RedisAddr != "":
		return redisGiven
	case cfg.Embedded:
		return redisEmbedded
	}
	if !canStartServer {
		return redisEmbedded
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		return redisEmbedded
	}
	return redisStarted
}

// startRedis starts a redis-server or the embedded Redis, or connects to
// the given one, as redisSource decides, and says on stderr which it
// chose. A redis-server it starts listens on a free port on 127.0.0.1,
// keeps nothing on disk, and is stopped by close; it is killed with its
// parent (Linux) if this process dies without closing.
func startRedis(ctx context.Context, cfg *config, stderr io.Writer) (*redisEnv, error) {
	e := &redisEnv{kind: redisSource(cfg)}
	switch e.kind {
	case redisCluster:
		e.spec = redisSpec{Kind: "cluster", Addrs: cfg.ClusterAddrs}
	case redisGiven:
		e.spec = redisSpec{Kind: "redis", Addrs: []string{cfg.RedisAddr}}
	case redisOwnClust:
		addrs, stop, err := startCluster()
		if err != nil {
			return nil, err
		}
		e.clusterStop = stop
		e.spec = redisSpec{Kind: "cluster", Addrs: addrs}
	case redisStarted:
		s, err := startServer()
		if err != nil {
			return nil, fmt.Errorf("%w (pass -embedded to use the embedded miniredis instead)", err)
		}
		e.srv = s
		e.spec = redisSpec{Kind: "redis", Addrs: []string{s.addr}}
	case redisEmbedded:
		m := miniredis.NewMiniRedis()
		if err := m.StartAddr("127.0.0.1:0"); err != nil {
			return nil, fmt.Errorf("embedded redis: %w", err)
		}
		e.mini = m
		e.spec = redisSpec{Kind: "embedded", Addrs: []string{m.Addr()}}
		// miniredis only expires keys when told the time has moved on.
		e.stop, e.done = make(chan struct{}), make(chan struct{})
		go e.clock()
	}
	e.admin = newClient(e.spec)
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := e.admin.Ping(pctx).Err(); err != nil {
		e.close()
		return nil, fmt.Errorf("redis %v: %w", e.spec.Addrs, err)
	}
	if e.mini == nil {
		if info, err := e.admin.Info(pctx, "server").Result(); err == nil {
			e.version = infoField(info, "redis_version")
		}
	}
	switch e.kind {
	case redisStarted:
		fmt.Fprintf(stderr, "bench: started redis-server %s on %s (pid %d); it is stopped when the run ends\n",
			e.version, e.srv.addr, e.srv.pid)
	case redisEmbedded:
		why := "no redis-server on $PATH"
		switch {
		case cfg.Embedded:
			why = "-embedded"
		case !canStartServer:
			why = "the bench cannot start a redis-server on " + runtime.GOOS
		}
		fmt.Fprintf(stderr, "bench: %s: using the embedded miniredis, whose latencies are not representative"+
			" (Lua scripts run one at a time); install redis-server or pass -redis ADDR for real figures\n", why)
	}
	return e, nil
}

// clock moves the embedded Redis's TTLs along with real time.
func (e *redisEnv) clock() {
	defer close(e.done)
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-e.stop:
			return
		case now := <-t.C:
			e.mini.FastForward(now.Sub(last))
			last = now
		}
	}
}

// close closes the admin client, stops the embedded Redis, and stops the
// redis-server this run started (SIGTERM to its pid, SIGKILL after 5 s)
// and removes its directory.
func (e *redisEnv) close() {
	if e.admin != nil {
		_ = e.admin.Close()
	}
	if e.mini != nil {
		close(e.stop)
		<-e.done
		e.mini.Close()
	}
	if e.srv != nil {
		e.srv.stop()
	}
	if e.clusterStop != nil {
		e.clusterStop()
	}
}

// describe names the Redis for the reports.
func (e *redisEnv) describe() string {
	v := ""
	if e.version != "" {
		v = " " + e.version
	}
	switch e.kind {
	case redisEmbedded:
		return miniredisDesc
	case redisStarted:
		return fmt.Sprintf("redis-server%s (started for this run on %s)", v, e.spec.Addrs[0])
	case redisCluster:
		return fmt.Sprintf("redis cluster%s at %s", v, strings.Join(e.spec.Addrs, ","))
	case redisOwnClust:
		return fmt.Sprintf("redis cluster%s of %d masters (started for this run on %s)", v, len(e.spec.Addrs), strings.Join(e.spec.Addrs, ","))
	}
	return fmt.Sprintf("redis-server%s at %s", v, e.spec.Addrs[0])
}

// serverCommands returns the number of commands the server (every master
// of a cluster) has processed so far, or -1 when unknown.
func (e *redisEnv) serverCommands(ctx context.Context) int64 {
	if e.mini != nil {
		return int64(e.mini.CommandCount())
	}
	return e.serverStat(ctx, "total_commands_processed")
}

// serverConnections returns the number of connections the server (every
// master of a cluster) has accepted so far, or -1 when unknown.
func (e *redisEnv) serverConnections(ctx context.Context) int64 {
	if e.mini != nil {
		return -1
	}
	return e.serverStat(ctx, "total_connections_received")
}

// serverStat sums the INFO stats field name over the server, or every
// master of a cluster; -1 when unknown.
func (e *redisEnv) serverStat(ctx context.Context, name string) int64 {
	read := func(c *redis.Client) (int64, error) {
		info, err := c.Info(ctx, "stats").Result()
		if err != nil {
			return 0, err
		}
		return strconv.ParseInt(infoField(info, name), 10, 64)
	}
	switch c := e.admin.(type) {
	case *redis.Client:
		n, err := read(c)
		if err != nil {
			return -1
		}
		return n
	case *redis.ClusterClient:
		var total atomic.Int64
		err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			n, err := read(m)
			total.Add(n)
			return err
		})
		if err != nil {
			return -1
		}
		return total.Load()
	}
	return -1
}

func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

// cleanup deletes a phase's keys: everything in the embedded Redis or in
// the redis-server this run started, and only the keys under the phase's
// prefix in a server of the user's.
func (e *redisEnv) cleanup(ctx context.Context, prefix string) error {
	switch e.kind {
	case redisEmbedded:
		e.mini.FlushAll()
		return nil
	case redisStarted:
		return e.admin.FlushAll(ctx).Err()
	}
	del := func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, prefix+":*", 1000).Iterator()
		var batch []string
		for iter.Next(ctx) {
			batch = append(batch, iter.Val())
			if len(batch) == 500 {
				if err := c.Unlink(ctx, batch...).Err(); err != nil {
					return err
				}
				batch = batch[:0]
			}
		}
		if err := iter.Err(); err != nil {
			return err
		}
		if len(batch) > 0 {
			return c.Unlink(ctx, batch...).Err()
		}
		return nil
	}
	switch c := e.admin.(type) {
	case *redis.Client:
		return del(ctx, c)
	case *redis.ClusterClient:
		// Keys of one UNLINK may live in different slots: delete one by one.
		return c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			iter := m.Scan(ctx, 0, prefix+":*", 1000).Iterator()
			for iter.Next(ctx) {
				if err := m.Unlink(ctx, iter.Val()).Err(); err != nil {
					return err
				}
			}
			return iter.Err()
		})
	}
	return nil
}

// isLoopback reports whether every address is on the loopback interface.
func isLoopback(addrs []string) bool {
	for _, a := range addrs {
		host, _, err := net.SplitHostPort(a)
		if err != nil {
			return false
		}
		if host == "localhost" {
			continue
		}
		ip := net.ParseIP(host)
		if ip == nil || !ip.IsLoopback() {
			return false
		}
	}
	return true
}
