//go:build !linux

package redistest

import "syscall"

// sysProcAttr returns the attributes used for every child process. Outside
// Linux there is no parent-death signal, so a child may outlive a test binary
// that is killed before its cleanups run.
func sysProcAttr() *syscall.SysProcAttr {
	return nil
}

// procStopped reports that the state of the process is unknown.
func procStopped(pid int) (stopped, known bool) {
	return false, false
}
