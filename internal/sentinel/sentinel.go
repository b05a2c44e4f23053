// Package sentinel holds the error values that package herd exports and
// that herd's internal packages return as well, so that those packages
// need not import herd (which imports them). herd.ErrClosed is
// [ErrClosed] and herd.ErrLeaseHeld is [ErrLeaseHeld]: the same values,
// so errors.Is with the exported names holds for an error of either
// origin.
package sentinel

import "errors"

var (
	// ErrClosed is herd.ErrClosed.
	ErrClosed = errors.New("herd: closed")

	// ErrLeaseHeld is herd.ErrLeaseHeld.
	ErrLeaseHeld = errors.New("herd: lease held by another owner")
)
