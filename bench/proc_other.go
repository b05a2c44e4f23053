//go:build !linux

package main

import "syscall"

// sysProcAttr: outside Linux a worker notices its parent's death by its
// stdin closing, and by its deadline.
func sysProcAttr() *syscall.SysProcAttr { return nil }
