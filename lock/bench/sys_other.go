//go:build !linux

package main

import "syscall"

// sysProcAttr: no parent-death signal outside Linux.
func sysProcAttr() *syscall.SysProcAttr { return nil }
