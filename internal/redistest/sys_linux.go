//go:build linux

package redistest

import (
	"bytes"
	"fmt"
	"os"
	"syscall"
)

// sysProcAttr returns the attributes used for every child process. The child
// is killed when the thread of the test binary that started it goes away, so
// a killed test binary does not leave redis-server processes behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// procStopped reports whether the process pid is in the stopped state, as
// reported by /proc. The boolean known is false when the state could not be
// determined.
func procStopped(pid int) (stopped, known bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false, false
	}
	// The state follows the command name, which is in parentheses and may
	// itself contain spaces or parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false, false
	}
	switch b[i+2] {
	case 'T', 't':
		return true, true
	}
	return false, true
}
