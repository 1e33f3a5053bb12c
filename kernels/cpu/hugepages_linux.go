package cpu

import (
	"syscall"
	"unsafe"
)

// adviseHugePages asks the kernel to back the whole huge pages inside mem,
// which must hold zeros, with transparent huge pages. A decode step streams
// every weight once, and with 4 KiB pages that is a TLB miss every 4 KiB,
// where the hardware prefetchers also stop: on the mid preset's projections
// a decode row read its weights about a fifth faster from huge pages
// (docs/cpu-backend-perf.md). Many systems give huge pages only to memory
// so advised ("madvise" in /sys/kernel/mm/transparent_hugepage/enabled),
// and the Go runtime does not advise its heap. Memory the heap reuses has
// been touched (zeroed) already, in 4 KiB pages: those are dropped
// (MADV_DONTNEED, after which the memory reads as zeros, as the Go runtime
// itself returns memory), so that the next touch faults in huge pages.
// It is advice: a kernel without huge pages returns an error, ignored, and
// the memory works as before.
func adviseHugePages(mem []byte) {
	start := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	lo := int((hugePage - start%hugePage) % hugePage)
	if lo >= len(mem) {
		return
	}
	n := (len(mem) - lo) &^ (hugePage - 1)
	if n == 0 {
		return
	}
	if syscall.Madvise(mem[lo:lo+n], syscall.MADV_HUGEPAGE) == nil {
		_ = syscall.Madvise(mem[lo:lo+n], syscall.MADV_DONTNEED)
	}
}
