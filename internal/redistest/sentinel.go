package redistest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// SentinelMasterName is the name the Sentinels monitor the master by.
	SentinelMasterName = "herd"
	// SentinelDownAfter is the Sentinels' down-after-milliseconds.
	SentinelDownAfter = time.Second
	// sentinelFailoverTimeout is their failover-timeout: a Sentinel does
	// not start an automatic failover of the same master within twice it.
	sentinelFailoverTimeout = 2 * time.Second
	// sentinelSettleTimeout bounds waiting for a failover to complete and
	// for the set to settle (every Sentinel agrees, every replica attached).
	sentinelSettleTimeout = 40 * time.Second
)

// Sentinel is a replicated Redis set managed by Sentinel: one master, two
// replicas and three Sentinels (quorum 2), all on free ports on 127.0.0.1,
// started for a test. Like servers started with [Start], the data nodes
// keep nothing on disk; a node killed and restarted comes back empty and
// rejoins as a replica of the current master.
//
// The methods that fail over ([Sentinel.Failover], [Sentinel.KillMaster],
// [Sentinel.PauseMaster]) return once a new master is announced by every
// Sentinel. Call [Sentinel.WaitSettled] before the next one.
type Sentinel struct {
	nodes     []*Server // data nodes; nodes[0] is the first master
	sentinels []*Server

	mu sync.Mutex // serialises failovers
}

// StartSentinel starts the set and waits until both replicas are attached
// to the master and every Sentinel knows both replicas and the other
// Sentinels. It skips or fails the test as [Require] does when
// redis-server is missing, and fails it when the set is not ready within
// 40 seconds.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	bin := requireBinaries(t, "redis-server")[0]
	s := &Sentinel{}
	t.Cleanup(func() {
		if err := s.stop(); err != nil {
			t.Errorf("redistest: %v", err)
		}
	})
	for i := range 3 {
		var extra []string
		if i > 0 {
			extra = []string{"--replicaof", "127.0.0.1", strconv.Itoa(s.nodes[0].port)}
		}
		n := newServer(bin, t.TempDir(), extra)
		if err := n.start(freePort); err != nil {
			t.Fatalf("redistest: sentinel set node: %v", err)
		}
		s.nodes = append(s.nodes, n)
	}
	for range 3 {
		dir := t.TempDir()
		conf := filepath.Join(dir, "sentinel.conf")
		text := fmt.Sprintf("sentinel monitor %[1]s 127.0.0.1 %[2]d 2\n"+
			"sentinel down-after-milliseconds %[1]s %[3]d\n"+
			"sentinel failover-timeout %[1]s %[4]d\n"+
			"sentinel parallel-syncs %[1]s 2\n",
			SentinelMasterName, s.nodes[0].port, SentinelDownAfter.Milliseconds(), sentinelFailoverTimeout.Milliseconds())
		if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
			t.Fatalf("redistest: %v", err)
		}
		sn := newServer(bin, dir, nil)
		sn.conf = conf
		if err := sn.start(freePort); err != nil {
			t.Fatalf("redistest: sentinel: %v", err)
		}
		s.sentinels = append(s.sentinels, sn)
	}
	if err := s.waitSettled(time.Now().Add(sentinelSettleTimeout)); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return s
}

// Nodes returns the three data nodes (the first one started as master).
func (s *Sentinel) Nodes() []*Server { return append([]*Server(nil), s.nodes...) }

// Sentinels returns the three Sentinel processes.
func (s *Sentinel) Sentinels() []*Server { return append([]*Server(nil), s.sentinels...) }

// SentinelAddrs returns the Sentinels' addresses.
func (s *Sentinel) SentinelAddrs() []string {
	addrs := make([]string, len(s.sentinels))
	for i, sn := range s.sentinels {
		addrs[i] = sn.Addr()
	}
	return addrs
}

// FailoverOptions returns go-redis failover options for the set, with
// opts applied, as a user would write them.
func (s *Sentinel) FailoverOptions(opts ...func(*redis.FailoverOptions)) *redis.FailoverOptions {
	opt := &redis.FailoverOptions{MasterName: SentinelMasterName, SentinelAddrs: s.SentinelAddrs()}
	for _, o := range opts {
		o(opt)
	}
	return opt
}

// Client returns a go-redis failover client (redis.NewFailoverClient) for
// the set, closed when the test finishes.
func (s *Sentinel) Client(t testing.TB, opts ...func(*redis.FailoverOptions)) *redis.Client {
	t.Helper()
	c := redis.NewFailoverClient(s.FailoverOptions(opts...))
	t.Cleanup(func() { c.Close() })
	return c
}

// Master returns the data node the Sentinels currently agree is the
// master, or fails the test when they do not agree.
func (s *Sentinel) Master(t testing.TB) *Server {
	t.Helper()
	m, err := retried(s.agreedMaster)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return m
}

// retried calls ask until it answers without a network error (a Sentinel
// that a loaded machine left without a second to accept or answer: CI
// once saw a 1s dial to one time out), for up to 10 seconds. Other errors
// (Sentinels that disagree, an unknown master) are returned at once.
func retried[T any](ask func() (T, error)) (T, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		v, err := ask()
		var ne net.Error
		if err == nil || !errors.As(err, &ne) || time.Now().After(deadline) {
			return v, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Failover asks a Sentinel for a graceful failover (SENTINEL FAILOVER) and
// waits until every Sentinel announces a new master. It returns the old
// and the new master (the same node when, on a loaded machine, an
// automatic failover followed and failed back). The old master stays a writable master until the
// Sentinels demote it, which can take several seconds.
func (s *Sentinel) Failover(t testing.TB) (old, promoted *Server) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	old = s.Master(t)
	epoch := s.mustEpoch(t)
	deadline := time.Now().Add(sentinelSettleTimeout)
	for {
		_, err := command(s.sentinels[0].Addr(), time.Second, "SENTINEL", "FAILOVER", SentinelMasterName)
		if err == nil {
			break
		}
		// INPROG or NOGOODSLAVE right after an earlier failover: retry.
		if time.Now().After(deadline) {
			t.Fatalf("redistest: SENTINEL FAILOVER: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return old, s.waitNewMaster(t, old, epoch, deadline)
}

// KillMaster kills the master with SIGKILL, waits until every Sentinel
// announces a new master (after down-after-milliseconds and an election),
// then restarts the old node empty as a replica of the new master. It
// returns the old and the new master.
func (s *Sentinel) KillMaster(t testing.TB) (old, promoted *Server) {
	t.Helper()
	return s.KillMasterThen(t, nil)
}

// KillMasterThen is KillMaster that calls afterKill, when not nil, once
// the master is dead and before the Sentinels elect a new one: for
// example to resume replicas that were paused so that they missed the
// master's last writes.
func (s *Sentinel) KillMasterThen(t testing.TB, afterKill func()) (old, promoted *Server) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	old = s.Master(t)
	epoch := s.mustEpoch(t)
	old.Kill(t)
	if afterKill != nil {
		afterKill()
	}
	promoted = s.waitNewMaster(t, old, epoch, time.Now().Add(sentinelSettleTimeout))
	old.Restart(t)
	if _, err := command(old.Addr(), time.Second, "REPLICAOF", "127.0.0.1", strconv.Itoa(promoted.port)); err != nil {
		t.Fatalf("redistest: REPLICAOF after restart: %v", err)
	}
	return old, promoted
}

// PauseMaster freezes the master with SIGSTOP until every Sentinel
// announces a new master, then resumes it: it wakes up still believing it
// is the master, with its clients' connections open, until the Sentinels
// demote it. It returns the old and the new master.
func (s *Sentinel) PauseMaster(t testing.TB) (old, promoted *Server) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	old = s.Master(t)
	epoch := s.mustEpoch(t)
	old.Pause(t)
	promoted = s.waitNewMaster(t, old, epoch, time.Now().Add(sentinelSettleTimeout))
	old.Resume(t)
	return old, promoted
}

func (s *Sentinel) mustEpoch(t testing.TB) int64 {
	t.Helper()
	e, err := retried(s.epoch)
	if err != nil {
		t.Fatalf("redistest: SENTINEL MASTER: %v", err)
	}
	return e
}

// WaitSettled waits until every Sentinel names the same master, that
// master has both other nodes attached as replicas with their link up, and
// no node but the master calls itself master. It fails the test after 40
// seconds.
func (s *Sentinel) WaitSettled(t testing.TB) {
	t.Helper()
	if err := s.waitSettled(time.Now().Add(sentinelSettleTimeout)); err != nil {
		t.Fatalf("redistest: %v", err)
	}
}

// waitNewMaster waits until every Sentinel names a master other than old,
// or old again after a newer configuration epoch than epoch (on a loaded
// machine an automatic failover can follow a requested one and fail back).
func (s *Sentinel) waitNewMaster(t testing.TB, old *Server, epoch int64, deadline time.Time) *Server {
	t.Helper()
	for {
		m, err := s.agreedMaster()
		if err == nil && m != old {
			return m
		}
		if e, eerr := s.epoch(); err == nil && eerr == nil && e > epoch+1 {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: no new master announced by every Sentinel within %v (last: %v)\n%s", sentinelSettleTimeout, err, s.logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// epoch returns the configuration epoch of the master, the lowest any
// Sentinel reports.
func (s *Sentinel) epoch() (int64, error) {
	low := int64(-1)
	for _, sn := range s.sentinels {
		r, err := command(sn.Addr(), time.Second, "SENTINEL", "MASTER", SentinelMasterName)
		if err != nil {
			return 0, err
		}
		kv, _ := r.([]any)
		for i := 0; i+1 < len(kv); i += 2 {
			if k, _ := kv[i].(string); k == "config-epoch" {
				v, _ := kv[i+1].(string)
				e, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return 0, fmt.Errorf("sentinel %s: config-epoch %q", sn.Addr(), v)
				}
				if low < 0 || e < low {
					low = e
				}
			}
		}
	}
	return low, nil
}

// agreedMaster returns the node every Sentinel names as master.
func (s *Sentinel) agreedMaster() (*Server, error) {
	var addr string
	for _, sn := range s.sentinels {
		r, err := command(sn.Addr(), time.Second, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SentinelMasterName)
		if err != nil {
			return nil, fmt.Errorf("sentinel %s: %w", sn.Addr(), err)
		}
		hp, ok := r.([]any)
		if !ok || len(hp) != 2 {
			return nil, fmt.Errorf("sentinel %s: unexpected reply %v", sn.Addr(), r)
		}
		a := fmt.Sprintf("%v:%v", hp[0], hp[1])
		if addr != "" && a != addr {
			return nil, fmt.Errorf("sentinels disagree: %s and %s", addr, a)
		}
		addr = a
	}
	for _, n := range s.nodes {
		if n.Addr() == addr {
			return n, nil
		}
	}
	return nil, fmt.Errorf("sentinels name %s, not a node of the set", addr)
}

func (s *Sentinel) waitSettled(deadline time.Time) error {
	for {
		err := s.settled()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sentinel set not settled within %v: %w\n%s", sentinelSettleTimeout, err, s.logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (s *Sentinel) settled() error {
	m, err := s.agreedMaster()
	if err != nil {
		return err
	}
	info, err := commandString(m.Addr(), time.Second, "INFO", "replication")
	if err != nil {
		return fmt.Errorf("master %s: %w", m.Addr(), err)
	}
	if v, _ := infoField(info, "role"); v != "master" {
		return fmt.Errorf("master %s reports role %q", m.Addr(), v)
	}
	for _, n := range s.nodes {
		if n == m {
			continue
		}
		info, err := commandString(n.Addr(), time.Second, "INFO", "replication")
		if err != nil {
			return fmt.Errorf("node %s: %w", n.Addr(), err)
		}
		if v, _ := infoField(info, "role"); v != "slave" {
			return fmt.Errorf("node %s reports role %q", n.Addr(), v)
		}
		if v, _ := infoField(info, "master_port"); v != strconv.Itoa(m.port) {
			return fmt.Errorf("node %s replicates port %s, not the master's %d", n.Addr(), v, m.port)
		}
		if v, _ := infoField(info, "master_link_status"); v != "up" {
			return fmt.Errorf("node %s: master link %s", n.Addr(), v)
		}
	}
	for _, sn := range s.sentinels {
		info, err := commandString(sn.Addr(), time.Second, "INFO", "sentinel")
		if err != nil {
			return fmt.Errorf("sentinel %s: %w", sn.Addr(), err)
		}
		want := fmt.Sprintf("status=ok,address=%s,slaves=2,sentinels=3", m.Addr())
		if v, _ := infoField(info, "master0"); !strings.Contains(v, want) {
			return fmt.Errorf("sentinel %s: %s, want %s", sn.Addr(), v, want)
		}
	}
	return nil
}

// logs returns the tails of every process's log, for failure messages.
func (s *Sentinel) logs() string {
	var b strings.Builder
	for i, n := range s.nodes {
		fmt.Fprintf(&b, "node %d %s:\n%s\n", i, n.Addr(), n.logTail())
	}
	for i, n := range s.sentinels {
		fmt.Fprintf(&b, "sentinel %d %s:\n%s\n", i, n.Addr(), n.logTail())
	}
	return b.String()
}

func (s *Sentinel) stop() error {
	var errs []error
	for _, n := range append(append([]*Server(nil), s.sentinels...), s.nodes...) {
		errs = append(errs, n.stop())
	}
	return errors.Join(errs...)
}
