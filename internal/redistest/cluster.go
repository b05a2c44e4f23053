package redistest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// clusterSlots is the number of hash slots in a Redis Cluster.
	clusterSlots = 16384
	// clusterNodeTimeout is passed as --cluster-node-timeout, in
	// milliseconds.
	clusterNodeTimeout = 2000
	// clusterReadyTimeout bounds creating the cluster and waiting until
	// every node agrees on it.
	clusterReadyTimeout = 20 * time.Second
)

// Cluster is a Redis Cluster of redis-server processes started for a test.
// With [StartCluster] every node is a master; [StartClusterReplicas] adds
// replicas.
type Cluster struct {
	servers  []*Server
	masters  int
	replicas int // per master
}

// StartCluster starts a Redis Cluster of masters nodes on free ports on
// 127.0.0.1, creates it with redis-cli --cluster create, which spreads the
// 16384 hash slots evenly over the nodes, and waits until every node reports
// cluster_state:ok with all slots assigned and all nodes agree on the slot
// map. Like servers started with [Start], the nodes keep no data on disk and
// are stopped when the test finishes.
//
// options are more redis-server command-line options for every node, as
// for [Start].
//
// StartCluster skips or fails the test as described for [Require] when
// redis-server or redis-cli is missing. It fails the test if masters is less
// than 3, the minimum redis-cli accepts, or if the cluster is not ready
// within 20 seconds.
func StartCluster(t testing.TB, masters int, options ...string) *Cluster {
	t.Helper()
	return startCluster(t, masters, 0, options)
}

// StartClusterReplicas is [StartCluster] with replicas replicas per
// master: masters × (1 + replicas) nodes, which redis-cli assigns as it
// creates the cluster. It also waits until every replica's link to its
// master is up. [Cluster.Addrs] and [Cluster.Servers] list every node;
// CLUSTER SLOTS (or CLUSTER NODES) tells which are replicas of which
// master.
func StartClusterReplicas(t testing.TB, masters, replicas int) *Cluster {
	t.Helper()
	if replicas < 0 {
		t.Fatalf("redistest: StartClusterReplicas with %d replicas", replicas)
	}
	return startCluster(t, masters, replicas, nil)
}

func startCluster(t testing.TB, masters, replicas int, options []string) *Cluster {
	t.Helper()
	bins := requireBinaries(t, "redis-server", "redis-cli")
	if masters < 3 {
		t.Fatalf("redistest: StartCluster needs at least 3 masters, got %d", masters)
	}
	c, stop, err := buildCluster(bins, masters, replicas, options, func() (string, error) { return t.TempDir(), nil })
	if stop != nil {
		t.Cleanup(func() {
			if err := stop(); err != nil {
				t.Errorf("redistest: %v", err)
			}
		})
	}
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return c
}

// StartClusterMain is [StartCluster] for use in TestMain, or in a command
// (the bench's -cluster start), where there is no testing.TB. It returns
// the cluster and a function that stops every node and removes their
// temporary directories; calling that function more than once is
// harmless. It returns an error when redis-server or redis-cli is
// missing, when masters is less than 3, or when the cluster is not ready
// within 20 seconds (its nodes are stopped then).
func StartClusterMain(masters int) (*Cluster, func(), error) {
	var bins []string
	for _, name := range []string{"redis-server", "redis-cli"} {
		bin, found, err := lookup(name)
		if err != nil {
			return nil, nil, err
		}
		if !found {
			return nil, nil, fmt.Errorf("redistest: %s not found in $PATH", name)
		}
		bins = append(bins, bin)
	}
	if masters < 3 {
		return nil, nil, fmt.Errorf("redistest: a cluster needs at least 3 masters, got %d", masters)
	}
	var dirs []string
	mkdir := func() (string, error) {
		dir, err := os.MkdirTemp("", "redistest-cluster-")
		if err == nil {
			dirs = append(dirs, dir)
		}
		return dir, err
	}
	c, stopNodes, err := buildCluster(bins, masters, 0, nil, mkdir)
	var once sync.Once
	stop := func() {
		once.Do(func() {
			if stopNodes != nil {
				if err := stopNodes(); err != nil {
					fmt.Fprintf(os.Stderr, "redistest: %v\n", err)
				}
			}
			for _, d := range dirs {
				os.RemoveAll(d)
			}
		})
	}
	if err != nil {
		stop()
		return nil, nil, fmt.Errorf("redistest: %w", err)
	}
	return c, stop, nil
}

// buildCluster starts masters × (1 + replicas) nodes, each in a directory
// from mkdir, creates the cluster and waits until it is ready. stop, when
// not nil, stops every node started, also after an error.
func buildCluster(bins []string, masters, replicas int, options []string, mkdir func() (string, error)) (c *Cluster, stop func() error, err error) {
	c = &Cluster{masters: masters, replicas: replicas}
	stop = c.stop
	for range masters * (1 + replicas) {
		dir, err := mkdir()
		if err != nil {
			return nil, stop, err
		}
		opts := clusterOptions(dir)
		if replicas > 0 {
			// CLUSTER SLOTS lists a replica only once its replication offset
			// moved: ping replicas every second instead of every ten.
			opts = append(opts, "--repl-ping-replica-period", "1")
		}
		opts = append(opts, options...)
		s := newServer(bins[0], dir, opts)
		if err := s.start(freeClusterPort); err != nil {
			return nil, stop, fmt.Errorf("cluster node: %w", err)
		}
		c.servers = append(c.servers, s)
	}
	deadline := time.Now().Add(clusterReadyTimeout)
	if err := c.create(bins[1], replicas, deadline); err != nil {
		return nil, stop, err
	}
	if err := c.waitReady(deadline); err != nil {
		return nil, stop, err
	}
	return c, stop, nil
}

// clusterOptions returns the redis-server options for a cluster node whose
// directory is dir.
func clusterOptions(dir string) []string {
	return []string{
		"--cluster-enabled", "yes",
		"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
		"--cluster-node-timeout", strconv.Itoa(clusterNodeTimeout),
	}
}

// Addrs returns the addresses of the nodes, "127.0.0.1:port", in the order
// of [Cluster.Servers].
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.servers))
	for i, s := range c.servers {
		addrs[i] = s.Addr()
	}
	return addrs
}

// Servers returns the nodes of the cluster. Each can be stopped, paused or
// restarted like a server started with [Start].
func (c *Cluster) Servers() []*Server {
	return slices.Clone(c.servers)
}

// Client returns a new go-redis cluster client that knows all nodes as seed
// addresses. The options start out with only Addrs set and are then passed
// to each of opts in order. The client is closed when the test finishes.
func (c *Cluster) Client(t testing.TB, opts ...func(*redis.ClusterOptions)) *redis.ClusterClient {
	t.Helper()
	opt := &redis.ClusterOptions{Addrs: c.Addrs()}
	for _, o := range opts {
		o(opt)
	}
	cc := redis.NewClusterClient(opt)
	t.Cleanup(func() { cc.Close() })
	return cc
}

// stop stops all nodes concurrently.
func (c *Cluster) stop() error {
	errs := make([]error, len(c.servers))
	var wg sync.WaitGroup
	for i, s := range c.servers {
		wg.Go(func() { errs[i] = s.stop() })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// create joins the nodes into one cluster with redis-cli.
func (c *Cluster) create(cli string, replicas int, deadline time.Time) error {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	cmd := exec.CommandContext(ctx, cli, args...)
	cmd.SysProcAttr = sysProcAttr()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v\n%s", cli, strings.Join(args, " "), err, out)
	}
	return nil
}

// waitReady polls the nodes until the cluster is ready or the deadline
// passes.
func (c *Cluster) waitReady(deadline time.Time) error {
	for {
		err := c.ready()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			var b strings.Builder
			for _, s := range c.servers {
				fmt.Fprintf(&b, "\nnode %s (pid %d):\n%s", s.Addr(), s.Pid(), s.logTail())
			}
			return fmt.Errorf("cluster not ready within %v: %w%s", clusterReadyTimeout, err, b.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ready returns nil if every node reports cluster_state:ok with all slots
// assigned and knows all nodes, and all nodes see the same slot map;
// otherwise it describes what is missing.
func (c *Cluster) ready() error {
	const timeout = time.Second
	want := c.Addrs()
	slices.Sort(want)
	var first string
	for _, s := range c.servers {
		addr := s.Addr()
		info, err := commandString(addr, timeout, "CLUSTER", "INFO")
		if err != nil {
			return fmt.Errorf("node %s: CLUSTER INFO: %w", addr, err)
		}
		for field, value := range map[string]string{
			"cluster_state":          "ok",
			"cluster_slots_assigned": strconv.Itoa(clusterSlots),
			"cluster_slots_ok":       strconv.Itoa(clusterSlots),
			"cluster_known_nodes":    strconv.Itoa(len(c.servers)),
			"cluster_size":           strconv.Itoa(c.masters),
		} {
			if v, _ := infoField(info, field); v != value {
				return fmt.Errorf("node %s: %s is %q, want %q", addr, field, v, value)
			}
		}
		nodes, err := commandString(addr, timeout, "CLUSTER", "NODES")
		if err != nil {
			return fmt.Errorf("node %s: CLUSTER NODES: %w", addr, err)
		}
		view, err := slotMap(nodes, want)
		if err != nil {
			return fmt.Errorf("node %s: %w", addr, err)
		}
		if c.replicas > 0 {
			slots, err := command(addr, timeout, "CLUSTER", "SLOTS")
			if err != nil {
				return fmt.Errorf("node %s: CLUSTER SLOTS: %w", addr, err)
			}
			ranges, _ := slots.([]any)
			for _, r := range ranges {
				if e, _ := r.([]any); len(e)-2 != 1+c.replicas {
					return fmt.Errorf("node %s: CLUSTER SLOTS lists %d nodes for a slot range, want %d", addr, len(e)-2, 1+c.replicas)
				}
			}
		}
		if repl, err := commandString(addr, timeout, "INFO", "replication"); err != nil {
			return fmt.Errorf("node %s: INFO replication: %w", addr, err)
		} else if role, _ := infoField(repl, "role"); role == "slave" {
			if link, _ := infoField(repl, "master_link_status"); link != "up" {
				return fmt.Errorf("replica %s: master_link_status is %q, want up", addr, link)
			}
		}
		if first == "" {
			first = view
		} else if view != first {
			return fmt.Errorf("nodes disagree on the slot map:\n%s\nversus, at %s:\n%s", first, addr, view)
		}
	}
	return nil
}

// slotMap parses the output of CLUSTER NODES and returns a canonical
// description of which node serves which slots. It fails unless the output
// lists exactly the nodes in want (sorted), all connected and in good
// health, whose masters together serve every slot exactly once; a replica
// is described by the master it replicates.
func slotMap(nodes string, want []string) (string, error) {
	var addrs, lines []string
	var covered [clusterSlots]bool
	n := 0
	for line := range strings.SplitSeq(strings.TrimSpace(nodes), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			return "", fmt.Errorf("malformed CLUSTER NODES line %q", line)
		}
		addr, _, _ := strings.Cut(f[1], "@")
		flags := strings.Split(f[2], ",")
		replica := slices.Contains(flags, "slave")
		if !replica && !slices.Contains(flags, "master") {
			return "", fmt.Errorf("%s is not a master (flags %s)", addr, f[2])
		}
		for _, bad := range []string{"fail", "fail?", "handshake", "noaddr"} {
			if slices.Contains(flags, bad) {
				return "", fmt.Errorf("%s has flag %s", addr, bad)
			}
		}
		if f[7] != "connected" {
			return "", fmt.Errorf("%s is %s", addr, f[7])
		}
		if replica {
			addrs = append(addrs, addr)
			lines = append(lines, addr+" "+f[0]+" replica of "+f[3])
			continue
		}
		var ranges []string
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") { // a slot being imported or migrated
				return "", fmt.Errorf("%s has slot migration %s", addr, r)
			}
			lo, hi, isRange := strings.Cut(r, "-")
			if !isRange {
				hi = lo
			}
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if err1 != nil || err2 != nil || a < 0 || b >= clusterSlots || a > b {
				return "", fmt.Errorf("%s has malformed slot range %q", addr, r)
			}
			for slot := a; slot <= b; slot++ {
				if covered[slot] {
					return "", fmt.Errorf("slot %d is served twice", slot)
				}
				covered[slot] = true
				n++
			}
			ranges = append(ranges, r)
		}
		addrs = append(addrs, addr)
		lines = append(lines, addr+" "+f[0]+" "+strings.Join(ranges, " "))
	}
	slices.Sort(addrs)
	if !slices.Equal(addrs, want) {
		return "", fmt.Errorf("knows nodes %v, want %v", addrs, want)
	}
	if n != clusterSlots {
		return "", fmt.Errorf("%d of %d slots are assigned", n, clusterSlots)
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n"), nil
}
