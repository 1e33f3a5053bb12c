//go:build !race

package cpu

// raceEnabled: see race_on_test.go.
const raceEnabled = false
