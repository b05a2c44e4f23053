//go:build linux

package main

import "syscall"

// sysProcAttr makes the kernel kill a worker when the parent dies, even
// by SIGKILL.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
