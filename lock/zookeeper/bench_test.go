package zookeeper

import (
	"context"
	"testing"
	"time"
)

// BenchmarkAcquireRelease measures an uncontended TryAcquire and Release
// on one Locker, whose idle session is reused from one holding to the
// next (create, children, exists; then delete), and, with new sessions,
// the cost of a session per attempt (connect and close on top).
func BenchmarkAcquireRelease(b *testing.B) {
	for _, bc := range []struct {
		name string
		opt  *Options
	}{
		{"idle session", nil},
		{"new session", &Options{}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			l := newTestLocker(b, nil, bc.opt)
			ctx := context.Background()
			name := testName(b)
			b.ReportAllocs()
			for b.Loop() {
				lease, err := l.TryAcquire(ctx, name, 10*time.Second)
				if err != nil {
					b.Fatal(err)
				}
				if err := lease.Release(ctx); err != nil {
					b.Fatal(err)
				}
				if bc.opt != nil {
					l.idleMu.Lock()
					idle := l.idle
					l.idle = nil
					l.idleMu.Unlock()
					for _, s := range idle {
						s.close()
					}
				}
			}
		})
	}
}
