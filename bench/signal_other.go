//go:build !unix

package main

import "errors"

const canStall = false

var errNoStall = errors.New("the stall scenario needs SIGSTOP (unix only)")

func stopProcess(int) error { return errNoStall }
func contProcess(int) error { return errNoStall }
