package engine

import (
	"errors"
	"testing"

	"ddflash/kernels/cpu"
)

func TestKVCacheReserveTruncate(t *testing.T) {
	c, err := NewKVCache([]KVShard{{B: cpu.New(1), KVDim: 8}}, 2, 4, 5)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var a, b SeqKV
	if err := c.Reserve(&a, 9); err != nil { // 3 pages
		t.Fatal(err)
	}
	if c.FreePages() != 2 || len(a.Pages) != 3 {
		t.Fatalf("after reserving 9 tokens: %d free, %d pages", c.FreePages(), len(a.Pages))
	}
	if err := c.Reserve(&b, 12); !errors.Is(err, ErrKVFull) {
		t.Fatalf("reserve beyond capacity: %v, want ErrKVFull", err)
	}
	if len(b.Pages) != 0 || c.FreePages() != 2 {
		t.Fatalf("failed reserve leaked pages: seq has %d, %d free", len(b.Pages), c.FreePages())
	}
	seen := map[int32]bool{}
	for pos := 0; pos < 9; pos++ {
		s := a.Slot(4, pos)
		if seen[s] || s < 0 || s >= 20 {
			t.Fatalf("slot %d for position %d repeated or out of range", s, pos)
		}
		seen[s] = true
	}
	c.Truncate(&a, 4)
	if len(a.Pages) != 1 || c.FreePages() != 4 {
		t.Fatalf("after truncating to 4 tokens: %d pages, %d free", len(a.Pages), c.FreePages())
	}
	c.Truncate(&a, 0)
	if c.FreePages() != 5 {
		t.Fatalf("all pages should be free, %d are", c.FreePages())
	}
}
