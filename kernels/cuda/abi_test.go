//go:build cgo

package cuda

import (
	"encoding/binary"
	"math"
	"reflect"
	"testing"
	"unsafe"

	"ddflash/kernels"
)

// These tests need no GPU: they check the host side of every launch
// against the kernels' signatures in the embedded PTX.

func TestPTXArchsAgree(t *testing.T) {
	for _, cc := range []int{89, 90, 120} {
		if arch := ptxArch(cc); !reflect.DeepEqual(parsePTXParams("ptx/"+arch), kernelParams) {
			t.Errorf("the sm_80 and %s PTX (compute capability %d) declare different kernels or parameters", arch, cc)
		}
	}
	if len(kernelParams) < 30 {
		t.Errorf("only %d kernels in the embedded PTX", len(kernelParams))
	}
}

// TestLaunchArguments issues every op, in every weight-dtype variant, on a
// Backend without a device: each launch checks its arguments against the
// kernel's PTX parameters (checkArgs) before it needs the driver, and then
// stops with "kernels not loaded".
func TestLaunchArguments(t *testing.T) {
	be := &Backend{sms: 4, scratch: allocation{ptr: 1 << 20, bytes: 1 << 40}}
	fake := func(dt kernels.DType, n int) kernels.Buffer {
		return &buffer{mem: &allocation{ptr: 1 << 30, bytes: n * dt.Size()}, n: n, dt: dt}
	}
	f32 := func(n int) kernels.Buffer { return fake(kernels.F32, n) }
	i32 := func(n int) kernels.Buffer { return fake(kernels.I32, n) }
	floats := []kernels.DType{kernels.F32, kernels.BF16, kernels.F16}
	gdn := kernels.GDNShape{KeyHeads: 2, ValueHeads: 4, KeyDim: 16, ValueDim: 8}
	attn := kernels.AttnShape{NumHeads: 4, NumKVHeads: 2, HeadDim: 16, PageSize: 4, Scale: 0.25}
	table := i32(attnTableLen(1))
	ops := map[string]func(){
		"Copy F32":   func() { be.Copy(f32(20), f32(20), 2, 3, 4, 5) },
		"Copy BF16":  func() { be.Copy(fake(kernels.BF16, 20), fake(kernels.BF16, 20), 2, 3, 4, 5) },
		"Fill":       func() { be.Fill(f32(9), 1) },
		"Fill BF16":  func() { be.Fill(fake(kernels.BF16, 9), 1) },
		"Add":        func() { be.Add(f32(9), f32(9), f32(9), 9) },
		"SwiGLU":     func() { be.SwiGLU(f32(9), f32(9), f32(9), 9) },
		"MulSigmoid": func() { be.MulSigmoid(f32(9), f32(9), 9) },
		"L2Norm":     func() { be.L2Norm(f32(32), 2, 16, 1e-6, 1) },
		"RoPE":       func() { be.RoPE(f32(64), i32(2), f32(4), 2, 2, 16, 8, 1) },
		"WriteKV":    func() { be.WriteKV(f32(320), f32(320), f32(64), f32(64), i32(2), 2, 32) },
		"WriteKV BF16": func() {
			be.WriteKV(fake(kernels.BF16, 320), fake(kernels.BF16, 320), f32(64), f32(64), i32(2), 2, 32)
		},
		"MoveKV":      func() { be.MoveKV(f32(320), f32(320), i32(2), i32(2), 2, 32) },
		"MoveKV BF16": func() { be.MoveKV(fake(kernels.BF16, 320), fake(kernels.BF16, 320), i32(2), i32(2), 2, 32) },
		"Attention BF16 cache": func() {
			be.AttentionTable(f32(128), f32(128), fake(kernels.BF16, 320), fake(kernels.BF16, 320), attn, []kernels.AttnSeq{{QueryLen: 2, Prefix: 3, Pages: i32(2)}}, table, 5)
		},
		"Attention causal": func() {
			be.AttentionTable(f32(128), f32(128), f32(320), f32(320), attn, []kernels.AttnSeq{{QueryLen: 2, Prefix: 3, Pages: i32(2)}}, table, 5)
		},
		"Attention masked": func() {
			be.AttentionTable(f32(128), f32(128), f32(320), f32(320), attn, []kernels.AttnSeq{{QueryLen: 2, Prefix: 3, Pages: i32(2), Mask: i32(4), Window: 2}}, table, 5)
		},
		"Attention split": func() {
			be.AttentionTable(f32(64), f32(64), f32(32*3000), f32(32*3000), attn, []kernels.AttnSeq{{QueryLen: 1, Prefix: 2999, Pages: i32(750)}}, table, 3000)
		},
		"attention_merge": func() {
			be.launch("attention_merge", d1(1), d1(32), 0, f32(64), devPtr(0), devPtr(0), int32(4), int32(16), int32(8))
		},
		"ConvCommit tree": func() { be.ConvCommit(f32(30), f32(40), i32(4), 3, 10, 4) },
		"ConvCommit":      func() { be.ConvCommit(f32(30), f32(40), nil, 3, 10, 4) },
		"ConvCommit BF16": func() { be.ConvCommit(fake(kernels.BF16, 30), f32(40), nil, 3, 10, 4) },
		"CausalConv BF16 state": func() {
			be.CausalConv(f32(40), f32(40), fake(kernels.BF16, 30), f32(40), nil, 4, 10, 4)
		},
		"GDNChain": func() {
			be.GDNRecurrence(f32(96), f32(96), f32(96), f32(96), f32(12), f32(12), f32(512), f32(512), nil, nil, 3, gdn)
		},
		"GDNTree": func() {
			be.GDNRecurrence(nil, f32(96), f32(96), f32(96), f32(12), f32(12), f32(512), nil, f32(1536), i32(3), 3, gdn)
		},
		"GDNRecurrences": func() {
			be.GDNRecurrences(f32(96), f32(96), f32(96), f32(96), f32(12), f32(12), []kernels.GDNSeq{
				{Start: 0, Rows: 1, State: f32(512), StateOut: f32(512)}, {Start: 1, Rows: 2, State: f32(512), NodeStates: f32(1024), Parents: i32(2)},
			}, gdn)
		},
		"GDNChunked": func() {
			be.GDNChunked(f32(96), f32(96), f32(96), f32(96), f32(12), f32(12), f32(512), f32(512), 3, 64, gdn)
		},
		"GDNChunked wide keys": func() { // above gdnChunkedMaxKeyDim: the token recurrence
			wide := kernels.GDNShape{KeyHeads: 1, ValueHeads: 1, KeyDim: 160, ValueDim: 8}
			be.GDNChunked(f32(24), f32(480), f32(480), f32(24), f32(3), f32(3), f32(1280), f32(1280), 3, 64, wide)
		},
		"LogSoftmax": func() { be.LogSoftmax(f32(20), 2, 10) },
		"TopK":       func() { be.TopK(f32(6), i32(6), f32(20), 2, 10, 3) },
		"split_bf16": func() { be.launch("split_bf16", d1(1), d1(32), 0, devPtr(0), f32(8), int64(8), int32(2)) },
		"sum_parts":  func() { be.launch("sum_parts", d1(1), d1(32), 0, f32(8), devPtr(0), int64(8), int32(2)) },
	}
	for _, dt := range floats {
		w := func(n int) kernels.Buffer { return fake(dt, n) }
		ops["Embedding "+dt.String()] = func() { be.Embedding(f32(32), w(64), i32(2), 2, 16) }
		ops["MatMul "+dt.String()] = func() { be.MatMul(f32(20), f32(64), w(320), 2, 10, 32) }
		ops["RMSNorm "+dt.String()] = func() { be.RMSNorm(f32(32), f32(32), w(16), 2, 16, 1e-6, true) }
		ops["AddRMSNorm "+dt.String()] = func() { be.AddRMSNorm(f32(32), f32(32), f32(32), w(16), 2, 16, 1e-6, true) }
		for _, cdt := range []kernels.DType{kernels.F32, kernels.BF16} {
			ops["AttnInputs "+cdt.String()+" cache "+dt.String()] = func() {
				be.AttnInputs(f32(128), f32(256), f32(128), f32(64), f32(64), w(16), w(16), i32(2), f32(4), fake(cdt, 320), fake(cdt, 320), i32(2), 2,
					kernels.AttnInputShape{Heads: 4, KVHeads: 2, HeadDim: 16, RotDim: 8, Eps: 1e-6, RoPEScale: 1})
			}
		}
		ops["GatedRMSNorm "+dt.String()] = func() { be.GatedRMSNorm(f32(32), f32(32), f32(32), w(16), 2, 16, 1e-6) }
		ops["CausalConv "+dt.String()] = func() { be.CausalConv(f32(40), f32(40), f32(30), w(40), nil, 4, 10, 4) }
		ops["CausalConv tree "+dt.String()] = func() { be.CausalConv(f32(40), f32(40), f32(30), w(40), i32(4), 4, 10, 4) }
		ops["GDNGates "+dt.String()] = func() { be.GDNGates(f32(12), f32(12), w(4), w(4), 3, 4) }
		ops["GDNConvInputs "+dt.String()] = func() {
			be.GDNConvInputs(f32(96), f32(96), f32(96), f32(12), f32(12), f32(288), w(384), w(4), w(4),
				[]kernels.GDNConvSeq{{Rows: 1, State: f32(288), Commit: true}, {Rows: 2, State: fake(kernels.BF16, 288), Parents: i32(2)}}, 4, gdn, 1e-6, 0.25)
		}
		ops["MatMulParts "+dt.String()] = func() {
			be.MatMulParts(f32(64), 2, 32, []kernels.MatMulPart{{W: w(320), Out: f32(20), N: 10}, {W: w(64), Out: f32(4), N: 2}})
		}
		ops["MatMulGLU "+dt.String()] = func() { be.MatMulGLU(f32(20), f32(20), f32(64), w(320), w(320), 2, 10, 32) }
	}
	for name, op := range ops {
		func() {
			defer func() {
				if r := recover(); r != "cuda: kernels not loaded" {
					t.Errorf("%s: %v", name, r)
				}
			}()
			op()
		}()
	}
}

func TestCheckArgsRejectsMismatches(t *testing.T) {
	for _, args := range [][]any{
		{devPtr(0), devPtr(0), int64(1)},           // too few
		{devPtr(0), devPtr(0), int64(1), int32(2)}, // too many
		{devPtr(0), devPtr(0), int32(1)},           // i64 parameter given an int32
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("checkArgs(add_f32, %v) accepted", args)
				}
			}()
			checkArgs("add_f32", args)
		}()
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Errorf("checkArgs accepted an int32 for fill_f32's float parameter")
			}
		}()
		checkArgs("fill_f32", []any{devPtr(0), int64(3), int32(1)})
	}()
}

// TestArgPacker checks the pointer array and the values it points to.
func TestArgPacker(t *testing.T) {
	var p argPacker
	blob := []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	args := []any{int32(-7), int64(1 << 40), float32(1.5), nil, blob, devPtr(0xdeadbeef)}
	ptrs := unsafe.Slice(p.pack(args), len(args))
	read := func(i, n int) []byte { return unsafe.Slice((*byte)(ptrs[i]), n) }
	if v := int32(binary.LittleEndian.Uint32(read(0, 4))); v != -7 {
		t.Errorf("int32 arg = %d", v)
	}
	if v := binary.LittleEndian.Uint64(read(1, 8)); v != 1<<40 {
		t.Errorf("int64 arg = %d", v)
	}
	if v := math.Float32frombits(binary.LittleEndian.Uint32(read(2, 4))); v != 1.5 {
		t.Errorf("float32 arg = %g", v)
	}
	if v := binary.LittleEndian.Uint64(read(3, 8)); v != 0 {
		t.Errorf("nil arg = %#x, want a null pointer", v)
	}
	if v := read(4, len(blob)); string(v) != string(blob) {
		t.Errorf("blob arg = %v", v)
	}
	if v := binary.LittleEndian.Uint64(read(5, 8)); v != 0xdeadbeef {
		t.Errorf("devPtr arg = %#x", v)
	}
	for i := range ptrs {
		if uintptr(ptrs[i])%8 != 0 {
			t.Errorf("arg %d at %p is not 8-byte aligned", i, ptrs[i])
		}
	}
}

// TestAttnSeqsLayout checks the packing of attention.cu's AttnSeqs.
func TestAttnSeqsLayout(t *testing.T) {
	pages := &buffer{mem: &allocation{ptr: 0x1000, bytes: 400}, off: 4, n: 96, dt: kernels.I32}
	mask := &buffer{mem: &allocation{ptr: 0x8000, bytes: 64}, n: 16, dt: kernels.I32}
	b, rows := attnSeqs([]kernels.AttnSeq{
		{QueryStart: 0, QueryLen: 1, Prefix: 30, Pages: pages},
		{QueryStart: 1, QueryLen: 4, Prefix: 7, Pages: pages, Mask: mask, Window: 5},
	}, 16)
	if len(b) != attnSeqsLen || rows != 5 {
		t.Fatalf("%d bytes, %d rows", len(b), rows)
	}
	u64 := func(off int) uint64 { return binary.LittleEndian.Uint64(b[off:]) }
	u32 := func(off int) uint32 { return binary.LittleEndian.Uint32(b[off:]) }
	if u64(0) != 0x1010 || u64(8) != 0 || u32(16) != 0 || u32(20) != 1 || u32(24) != 30 || u32(28) != 0 {
		t.Errorf("first descriptor % x", b[:32])
	}
	if u64(32) != 0x1010 || u64(40) != 0x8000 || u32(48) != 1 || u32(52) != 4 || u32(56) != 7 || u32(60) != 5 {
		t.Errorf("second descriptor % x", b[32:64])
	}
	if u32(maxAttnSeqs*attnSeqDescLen) != 2 {
		t.Errorf("count = %d", u32(maxAttnSeqs*attnSeqDescLen))
	}
	if attnTableLen(33)*4 != 2*attnSeqsLen {
		t.Errorf("a table for 33 sequences has %d elements, want two AttnSeqs", attnTableLen(33))
	}
}
