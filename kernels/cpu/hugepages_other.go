//go:build !linux

package cpu

// adviseHugePages is a no-op where huge pages are not asked for by madvise.
func adviseHugePages([]byte) {}
