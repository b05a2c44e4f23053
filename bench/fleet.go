package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"time"
)

// fleet is the set of worker processes: this program re-run with the
// worker role in its environment. Each one exits by itself when its stdin
// closes or its deadline passes; the parent also kills each one by pid
// when it leaves, however it leaves.
type fleet struct {
	procs []*proc
}

type proc struct {
	idx     int
	cmd     *exec.Cmd
	pid     int
	stdin   io.WriteCloser
	enc     *json.Encoder
	replies chan reply
	exited  chan struct{}
	waitErr error
}

// startFleet starts n workers from exe.
func startFleet(exe string, n int, deadline time.Time, stderr io.Writer) (*fleet, error) {
	f := &fleet{}
	for i := range n {
		cmd := exec.Command(exe)
		cmd.Env = append(os.Environ(),
			roleEnv+"="+roleWorker,
			deadlineEnv+"="+strconv.FormatInt(deadline.UnixNano(), 10),
			indexEnv+"="+strconv.Itoa(i),
		)
		cmd.Stderr = stderr
		cmd.SysProcAttr = sysProcAttr()
		stdin, err := cmd.StdinPipe()
		if err != nil {
			f.kill()
			return nil, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			f.kill()
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			f.kill()
			return nil, fmt.Errorf("start worker %d: %w", i, err)
		}
		p := &proc{idx: i, cmd: cmd, pid: cmd.Process.Pid, stdin: stdin, enc: json.NewEncoder(stdin),
			replies: make(chan reply, 4), exited: make(chan struct{})}
		f.procs = append(f.procs, p)
		go p.read(stdout)
	}
	return f, nil
}

func (p *proc) read(stdout io.Reader) {
	dec := json.NewDecoder(bufio.NewReader(stdout))
	for {
		var r reply
		if err := dec.Decode(&r); err != nil {
			break
		}
		p.replies <- r
	}
	p.waitErr = p.cmd.Wait()
	close(p.exited)
	close(p.replies)
}

func (f *fleet) has(pid int) bool {
	for _, p := range f.procs {
		if p.pid == pid {
			return true
		}
	}
	return false
}

// broadcast sends cmd to every worker.
func (f *fleet) broadcast(cmd command) error {
	for _, p := range f.procs {
		if err := p.enc.Encode(cmd); err != nil {
			return fmt.Errorf("worker %d: %w", p.idx, err)
		}
	}
	return nil
}

// await collects one reply from every worker, in worker order. tick, if
// not nil, runs every 250ms while waiting (progress).
func (f *fleet) await(ctx context.Context, timeout time.Duration, tick func()) ([]reply, error) {
	limit := time.NewTimer(timeout)
	defer limit.Stop()
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	out := make([]reply, len(f.procs))
	for i, p := range f.procs {
	wait:
		for {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-limit.C:
				return nil, fmt.Errorf("worker %d (pid %d) did not answer within %v", p.idx, p.pid, timeout)
			case <-t.C:
				if tick != nil {
					tick()
				}
			case r, ok := <-p.replies:
				if !ok {
					return nil, fmt.Errorf("worker %d (pid %d) exited: %v", p.idx, p.pid, p.waitErr)
				}
				if r.Op == "error" {
					return nil, fmt.Errorf("%s", r.Error)
				}
				out[i] = r
				break wait
			}
		}
	}
	return out, nil
}

// stop ends every worker: first by closing its stdin (it exits by
// itself), then, after grace, by SIGKILL to its pid.
func (f *fleet) stop(grace time.Duration) {
	for _, p := range f.procs {
		_ = p.stdin.Close()
	}
	limit := time.After(grace)
	for _, p := range f.procs {
		select {
		case <-p.exited:
		case <-limit:
		}
	}
	f.kill()
}

// kill SIGCONTs (a stopped process cannot exit) and SIGKILLs every worker
// still running, by pid, and reaps it.
func (f *fleet) kill() {
	var wg sync.WaitGroup
	for _, p := range f.procs {
		select {
		case <-p.exited:
			continue
		default:
		}
		_ = contProcess(p.pid)
		_ = p.cmd.Process.Kill()
		wg.Go(func() {
			select {
			case <-p.exited:
			case <-time.After(5 * time.Second):
			}
		})
	}
	wg.Wait()
}
