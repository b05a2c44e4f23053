package etcdtest

import "runtime"

// archName is the value of ETCD_UNSUPPORTED_ARCH, which etcd 3.4 wants
// on architectures other than amd64 (and, from 3.5, arm64).
func archName() string { return runtime.GOARCH }
