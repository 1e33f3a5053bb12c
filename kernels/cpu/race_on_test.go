//go:build race

package cpu

// raceEnabled: the race detector drops a share of sync.Pool's Puts on
// purpose (to expose code that relies on getting an item back), so the
// backend's pooled temporaries are reallocated at random and allocation
// counts say nothing.
const raceEnabled = true
