//go:build unix

package main

import "syscall"

const canStall = true

// stopProcess and contProcess stop and resume a worker (SIGSTOP, SIGCONT).
func stopProcess(pid int) error { return syscall.Kill(pid, syscall.SIGSTOP) }
func contProcess(pid int) error { return syscall.Kill(pid, syscall.SIGCONT) }
