//go:build cuda

package cuda_test

import (
	"os"
	"testing"
)

// TestEngineStep checks the engine's recorded steps on the GPU as
// TestEmulatedStep does on the emulation (replayed steps equal eager ones
// bit for bit; a steady decode step's driver calls, from the backend's own
// tally), then times the small preset's whole steps eagerly and replayed;
// the table goes to $DDFLASH_ENGINE_STEP_TABLE as well.
func TestEngineStep(t *testing.T) {
	be := gpu(t)
	checkEngineSteps(t, be)
	table := engineStepTimes(t, be, "small", 20)
	t.Log("\n" + table)
	if path := os.Getenv("DDFLASH_ENGINE_STEP_TABLE"); path != "" {
		must(t, os.WriteFile(path, []byte(table), 0o644))
	}
}
