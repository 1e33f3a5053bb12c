package opprofile

import (
	"strings"
	"testing"

	"ddflash/kernels"
	"ddflash/kernels/cpu"
)

// TestProfileRecordsOps checks that the wrapper computes what the backend
// does, records each call under its shape with the bytes it moves, and
// records nothing while stopped.
func TestProfileRecordsOps(t *testing.T) {
	p := New(cpu.New(1))
	const m, n, k = 2, 3, 4
	alloc := func(dt kernels.DType, v []float32) kernels.Buffer {
		b, err := p.Alloc(dt, len(v))
		if err != nil {
			t.Fatal(err)
		}
		if err := p.UploadF32(b, 0, v); err != nil {
			t.Fatal(err)
		}
		return b
	}
	x := alloc(kernels.F32, []float32{1, 2, 3, 4, 5, 6, 7, 8})
	w := alloc(kernels.F32, []float32{1, 0, 0, 0, 0, 1, 0, 0, 1, 1, 1, 1})
	out := alloc(kernels.F32, make([]float32, m*n))
	p.MatMul(out, x, w, m, n, k) // not profiled
	p.Start()
	for range 2 {
		p.MatMul(out, x, w, m, n, k)
	}
	p.Add(out, out, out, m*n)
	p.Stop()
	p.Add(out, out, out, m*n) // not profiled
	got := make([]float32, m*n)
	if err := p.DownloadF32(out, 0, got); err != nil {
		t.Fatal(err)
	}
	want := []float32{4, 8, 40, 20, 24, 104} // (x·wᵀ)·4
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("out = %v, want %v", got, want)
		}
	}
	ops := p.Ops()
	if len(ops) != 2 {
		t.Fatalf("profile has %d rows, want MatMul and Add: %+v", len(ops), ops)
	}
	byKey := map[string]Op{}
	for _, o := range ops {
		byKey[o.Key] = o
	}
	mm, add := byKey["MatMul F32 4→3"], byKey["Add"]
	if mm.Calls != 2 || mm.Bytes != 2*4*(n*k+m*k+m*n) || mm.Time <= 0 {
		t.Errorf("MatMul row %+v: want 2 calls of %d bytes", mm, 4*(n*k+m*k+m*n))
	}
	if add.Calls != 1 || add.Bytes != 12*m*n {
		t.Errorf("Add row %+v: want 1 call of %d bytes", add, 12*m*n)
	}
	var table strings.Builder
	Write(&table, ops, 1, mm.Time+add.Time)
	if !strings.Contains(table.String(), "| MatMul F32 4→3 | 2 |") {
		t.Errorf("table does not list the MatMul row:\n%s", table.String())
	}
}
