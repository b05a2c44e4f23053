package main

import "syscall"

// sysProcAttr gives a started server a parent-death SIGKILL, so that even
// a killed bench leaves none behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
