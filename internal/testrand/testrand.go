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

// LanguageModelRow is a row of n logits shaped like a language model's: a
// normal bulk over the whole vocabulary and about one token in 2,000 raised
// 8 to 14 above it, so that top-p 0.95 keeps tens of tokens and the bulk
// still holds a few percent of the mass.
func LanguageModelRow(rng *rand.Rand, n int) []float32 {
	logits := make([]float32, n)
	for i := range logits {
		logits[i] = float32(1.5 * rng.NormFloat64())
		if rng.IntN(2000) == 0 {
			logits[i] += float32(8 + 6*rng.Float64())
		}
	}
	return logits
}
