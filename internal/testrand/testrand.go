// Package testrand gives tests random inputs that a failure can replay.
package testrand

import (
	"math/rand/v2"
	"testing"
)

// Seeded draws from a fresh random seed and, if the test fails, logs the
// seed so that the failing inputs can be replayed.
func Seeded(t testing.TB, stream uint64) *rand.Rand {
	seed := rand.Uint64()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("random inputs from seed %d: rerun with rand.NewPCG(%d, %d)", seed, seed, stream)
		}
	})
	return rand.New(rand.NewPCG(seed, stream))
}
