package cpu

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"ddflash/kernels"
)

// TestLargeBuffersGetHugePages checks that a large buffer, once written, is
// backed by transparent huge pages where the kernel gives them to memory
// advised so (its "madvise" mode, as well as "always"), and that it reads
// as zeros first, also where the heap reuses memory an earlier buffer wrote
// (adviseHugePages drops its pages).
func TestLargeBuffersGetHugePages(t *testing.T) {
	mode, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	if err != nil || bytes.Contains(mode, []byte("[never]")) {
		t.Skipf("this kernel gives no transparent huge pages (%q, %v)", mode, err)
	}
	const size = 8 << 20
	for range 3 {
		used := make([]uint16, size/2) // garbage for the heap to reuse
		for i := range used {
			used[i] = 0xffff
		}
	}
	runtime.GC()
	buf, err := New(1).Alloc(kernels.BF16, size/2)
	if err != nil {
		t.Fatal(err)
	}
	u16 := asBuffer(buf).u16
	for i, v := range u16 {
		if v != 0 {
			t.Fatalf("element %d of a new buffer is %#x, want 0", i, v)
		}
	}
	for i := range u16 {
		u16[i] = uint16(i)
	}
	start := uintptr(unsafe.Pointer(&u16[0]))
	inside := (start + hugePage - 1) &^ (hugePage - 1) // the first whole huge page
	if kb := anonHugeKB(t, inside); kb < hugePage>>10 {
		t.Errorf("a written %d MiB buffer has %d KiB of huge pages around %#x, want at least one (%d KiB)", size>>20, kb, inside, hugePage>>10)
	}
}

// anonHugeKB returns the AnonHugePages of the mapping holding addr, from
// /proc/self/smaps.
func anonHugeKB(t *testing.T, addr uintptr) int {
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	in := false
	for sc := bufio.NewScanner(f); sc.Scan(); {
		line := sc.Text()
		var lo, hi uintptr
		if n, _ := fmt.Sscanf(line, "%x-%x", &lo, &hi); n == 2 && strings.Contains(line, " ") {
			in = lo <= addr && addr < hi
			continue
		}
		var kb int
		if n, _ := fmt.Sscanf(line, "AnonHugePages: %d kB", &kb); in && n == 1 {
			return kb
		}
	}
	t.Fatalf("no mapping in /proc/self/smaps holds %#x", addr)
	return 0
}
