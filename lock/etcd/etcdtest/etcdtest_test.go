package etcdtest

import (
	"context"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestServer: a server answers on its endpoint, keeps a committed write
// across a SIGKILL and a restart on the same data directory and ports,
// and Close ends its process.
func TestServer(t *testing.T) {
	s, err := Start(t.TempDir())
	if errors.Is(err, ErrNoBinary) && os.Getenv("HERD_REQUIRE_REDIS") != "1" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: s.Endpoints(), Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	put, err := cli.Put(ctx, "k", "v")
	if err != nil {
		t.Fatal(err)
	}
	pid := s.Pid()
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if s.Pid() != 0 {
		t.Errorf("Pid() after Kill = %d, want 0", s.Pid())
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	got, err := cli.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "v" || got.Kvs[0].ModRevision != put.Header.Revision {
		t.Errorf("after the restart: %v, want k=v at revision %d", got.Kvs, put.Header.Revision)
	}
	restarted := s.Pid()
	if restarted == 0 || restarted == pid {
		t.Errorf("Pid() after Restart = %d (before: %d), want a new process", restarted, pid)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(restarted, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("the process %d after Close: %v, want gone", restarted, err)
	}
}
