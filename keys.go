package herd

import (
	"fmt"

	"github.com/herdkit/herd/internal/wire"
)

// DefaultPrefix ("herd") is the namespace of every Redis key herd writes
// when no prefix is configured.
const DefaultPrefix = wire.DefaultPrefix

// keyFamily holds the Redis names that belong to one user key. The layout
// is internal/wire's.
type keyFamily = wire.KeyFamily

// makeKeys maps a user key to its Redis names (see wire.MakeKeys). The
// only invalid key is the empty string: ErrInvalidKey.
func makeKeys(prefix, key string) (keyFamily, error) {
	k, err := wire.MakeKeys(prefix, key)
	if err != nil {
		return keyFamily{}, fmt.Errorf("%w: %w", ErrInvalidKey, err)
	}
	return k, nil
}
