//go:build goexperiment.simd && amd64

#include "textflag.h"

// The AVX2 kernels (simd_avx2_amd64.go) hold each of the AVX-512 kernels'
// 16-lane accumulators as two 8-lane halves, Y(2r) for lanes 0-7 and
// Y(2r+1) for lanes 8-15 of weight row r, and store them to acc[r] in
// lane order: every lane runs the AVX-512 kernels' FMA chain.

// BF16_FMA widens the 8 bfloat16s at off(row) (element AX) into w and adds
// them times x to acc.
#define BF16_FMA(off, row, x, w, acc) \
	VPMOVZXWD off(row)(AX*2), w; \
	VPSLLD $16, w, w; \
	VFMADD231PS x, w, acc

// STORE_ACC stores Y0-Y7 to the [4][16]float32 at DI.
#define STORE_ACC \
	VMOVUPS Y0, 0(DI); \
	VMOVUPS Y1, 32(DI); \
	VMOVUPS Y2, 64(DI); \
	VMOVUPS Y3, 96(DI); \
	VMOVUPS Y4, 128(DI); \
	VMOVUPS Y5, 160(DI); \
	VMOVUPS Y6, 192(DI); \
	VMOVUPS Y7, 224(DI)

// ZERO_ACC clears Y0-Y7.
#define ZERO_ACC \
	VXORPS Y0, Y0, Y0; \
	VXORPS Y1, Y1, Y1; \
	VXORPS Y2, Y2, Y2; \
	VXORPS Y3, Y3, Y3; \
	VXORPS Y4, Y4, Y4; \
	VXORPS Y5, Y5, Y5; \
	VXORPS Y6, Y6, Y6; \
	VXORPS Y7, Y7, Y7

// func dot4x1BF16AVX2(p0, p1, p2, p3, q unsafe.Pointer, n int, next uintptr, acc *[4][16]float32)
//
// dot4x1BF16 (dot_amd64.s) on 8-lane halves: acc[r] = the 16 lane partial
// sums of bfloat16 weight row r times the x row q over n elements (a
// multiple of 16), prefetching the 8·n bytes at next into L2 as it goes.
TEXT ·dot4x1BF16AVX2(SB), NOSPLIT, $0-64
	MOVQ p0+0(FP), R8
	MOVQ p1+8(FP), R9
	MOVQ p2+16(FP), R10
	MOVQ p3+24(FP), R11
	MOVQ q+32(FP), SI
	MOVQ n+40(FP), CX
	MOVQ next+48(FP), DX
	MOVQ acc+56(FP), DI
	ZERO_ACC
	XORQ AX, AX
	TESTQ CX, CX
	JZ storeBF16

loopBF16:
	PREFETCHT1 (DX)(AX*8)
	PREFETCHT1 64(DX)(AX*8)
	VMOVUPS (SI)(AX*4), Y8
	VMOVUPS 32(SI)(AX*4), Y9
	BF16_FMA(0, R8, Y8, Y10, Y0)
	BF16_FMA(16, R8, Y9, Y11, Y1)
	BF16_FMA(0, R9, Y8, Y12, Y2)
	BF16_FMA(16, R9, Y9, Y13, Y3)
	BF16_FMA(0, R10, Y8, Y10, Y4)
	BF16_FMA(16, R10, Y9, Y11, Y5)
	BF16_FMA(0, R11, Y8, Y12, Y6)
	BF16_FMA(16, R11, Y9, Y13, Y7)
	ADDQ $16, AX
	CMPQ AX, CX
	JLT loopBF16

storeBF16:
	STORE_ACC
	VZEROUPPER
	RET

// func dot4x1F32AVX2(p0, p1, p2, p3, x unsafe.Pointer, n int, acc *[4][16]float32)
//
// acc[r] += the lane partial sums of float32 weight row r (p0…p3) times the
// x row over n elements (a multiple of 16), continuing the chains in acc:
// chunks of k run one after another give the chains of whole rows.
TEXT ·dot4x1F32AVX2(SB), NOSPLIT, $0-56
	MOVQ p0+0(FP), R8
	MOVQ p1+8(FP), R9
	MOVQ p2+16(FP), R10
	MOVQ p3+24(FP), R11
	MOVQ x+32(FP), SI
	MOVQ n+40(FP), CX
	MOVQ acc+48(FP), DI
	VMOVUPS 0(DI), Y0
	VMOVUPS 32(DI), Y1
	VMOVUPS 64(DI), Y2
	VMOVUPS 96(DI), Y3
	VMOVUPS 128(DI), Y4
	VMOVUPS 160(DI), Y5
	VMOVUPS 192(DI), Y6
	VMOVUPS 224(DI), Y7
	XORQ AX, AX
	TESTQ CX, CX
	JZ doneF32

loopF32:
	VMOVUPS (SI)(AX*4), Y8
	VMOVUPS 32(SI)(AX*4), Y9
	VFMADD231PS (R8)(AX*4), Y8, Y0
	VFMADD231PS 32(R8)(AX*4), Y9, Y1
	VFMADD231PS (R9)(AX*4), Y8, Y2
	VFMADD231PS 32(R9)(AX*4), Y9, Y3
	VFMADD231PS (R10)(AX*4), Y8, Y4
	VFMADD231PS 32(R10)(AX*4), Y9, Y5
	VFMADD231PS (R11)(AX*4), Y8, Y6
	VFMADD231PS 32(R11)(AX*4), Y9, Y7
	ADDQ $16, AX
	CMPQ AX, CX
	JLT loopF32

doneF32:
	STORE_ACC
	VZEROUPPER
	RET

// func sums4AVX2(acc unsafe.Pointer, m int, out unsafe.Pointer, outStride int)
//
// For the m [4][16]float32 chains at acc, stores the four lane sums of
// each, by sum4's tree, to out + i·outStride floats: halves of 256 bits
// (lanes i and i+8), then of 128 bits (i and i+4), then adjacent pairs
// twice (VHADDPS, as AddPairs).
TEXT ·sums4AVX2(SB), NOSPLIT, $0-32
	MOVQ acc+0(FP), SI
	MOVQ m+8(FP), CX
	MOVQ out+16(FP), DI
	MOVQ outStride+24(FP), BX
	SHLQ $2, BX
	TESTQ CX, CX
	JZ doneSums

loopSums:
	VMOVUPS 0(SI), Y0
	VADDPS 32(SI), Y0, Y0
	VMOVUPS 64(SI), Y2
	VADDPS 96(SI), Y2, Y2
	VMOVUPS 128(SI), Y4
	VADDPS 160(SI), Y4, Y4
	VMOVUPS 192(SI), Y6
	VADDPS 224(SI), Y6, Y6
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VEXTRACTF128 $1, Y2, X3
	VADDPS X3, X2, X2
	VEXTRACTF128 $1, Y4, X5
	VADDPS X5, X4, X4
	VEXTRACTF128 $1, Y6, X7
	VADDPS X7, X6, X6
	VHADDPS X2, X0, X0
	VHADDPS X6, X4, X4
	VHADDPS X4, X0, X0
	VMOVUPS X0, (DI)
	ADDQ $256, SI
	ADDQ BX, DI
	DECQ CX
	JNZ loopSums

doneSums:
	VZEROUPPER
	RET

// func dot4x2F32AVX2(p0, p1, p2, p3, x0, x1 unsafe.Pointer, n int, acc0, acc1 *[4][16]float32)
//
// dot4x1F32AVX2 for two x rows at once: acc0[r] and acc1[r]
// continue their chains over n elements (a multiple of 16). Sixteen 8-lane
// accumulators do not fit beside their operands, so it runs lanes 0-7 of
// every 16 elements, then lanes 8-15: each pass holds 8 accumulators, and
// each weight vector loaded feeds both x rows (6 loads per 8 FMAs, where
// dot4x1F32AVX2 takes 10). Each lane's chain is the same either way.
TEXT ·dot4x2F32AVX2(SB), NOSPLIT, $0-72
	MOVQ p0+0(FP), R8
	MOVQ p1+8(FP), R9
	MOVQ p2+16(FP), R10
	MOVQ p3+24(FP), R11
	MOVQ x0+32(FP), SI
	MOVQ x1+40(FP), R12
	MOVQ n+48(FP), CX
	MOVQ acc0+56(FP), DI
	MOVQ acc1+64(FP), R13
	VMOVUPS 0(DI), Y0
	VMOVUPS 64(DI), Y1
	VMOVUPS 128(DI), Y2
	VMOVUPS 192(DI), Y3
	VMOVUPS 0(R13), Y4
	VMOVUPS 64(R13), Y5
	VMOVUPS 128(R13), Y6
	VMOVUPS 192(R13), Y7
	XORQ AX, AX
	TESTQ CX, CX
	JZ hiPass
loopLo:
	VMOVUPS (SI)(AX*4), Y8
	VMOVUPS (R12)(AX*4), Y9
	VMOVUPS (R8)(AX*4), Y10
	VFMADD231PS Y8, Y10, Y0
	VFMADD231PS Y9, Y10, Y4
	VMOVUPS (R9)(AX*4), Y11
	VFMADD231PS Y8, Y11, Y1
	VFMADD231PS Y9, Y11, Y5
	VMOVUPS (R10)(AX*4), Y12
	VFMADD231PS Y8, Y12, Y2
	VFMADD231PS Y9, Y12, Y6
	VMOVUPS (R11)(AX*4), Y13
	VFMADD231PS Y8, Y13, Y3
	VFMADD231PS Y9, Y13, Y7
	ADDQ $16, AX
	CMPQ AX, CX
	JLT loopLo

hiPass:
	VMOVUPS Y0, 0(DI)
	VMOVUPS Y1, 64(DI)
	VMOVUPS Y2, 128(DI)
	VMOVUPS Y3, 192(DI)
	VMOVUPS Y4, 0(R13)
	VMOVUPS Y5, 64(R13)
	VMOVUPS Y6, 128(R13)
	VMOVUPS Y7, 192(R13)
	VMOVUPS 32(DI), Y0
	VMOVUPS 96(DI), Y1
	VMOVUPS 160(DI), Y2
	VMOVUPS 224(DI), Y3
	VMOVUPS 32(R13), Y4
	VMOVUPS 96(R13), Y5
	VMOVUPS 160(R13), Y6
	VMOVUPS 224(R13), Y7
	XORQ AX, AX
	TESTQ CX, CX
	JZ done4x2
loopHi:
	VMOVUPS 32(SI)(AX*4), Y8
	VMOVUPS 32(R12)(AX*4), Y9
	VMOVUPS 32(R8)(AX*4), Y10
	VFMADD231PS Y8, Y10, Y0
	VFMADD231PS Y9, Y10, Y4
	VMOVUPS 32(R9)(AX*4), Y11
	VFMADD231PS Y8, Y11, Y1
	VFMADD231PS Y9, Y11, Y5
	VMOVUPS 32(R10)(AX*4), Y12
	VFMADD231PS Y8, Y12, Y2
	VFMADD231PS Y9, Y12, Y6
	VMOVUPS 32(R11)(AX*4), Y13
	VFMADD231PS Y8, Y13, Y3
	VFMADD231PS Y9, Y13, Y7
	ADDQ $16, AX
	CMPQ AX, CX
	JLT loopHi

done4x2:
	VMOVUPS Y0, 32(DI)
	VMOVUPS Y1, 96(DI)
	VMOVUPS Y2, 160(DI)
	VMOVUPS Y3, 224(DI)
	VMOVUPS Y4, 32(R13)
	VMOVUPS Y5, 96(R13)
	VMOVUPS Y6, 160(R13)
	VMOVUPS Y7, 224(R13)
	VZEROUPPER
	RET

// func widenBF16AVX2(p unsafe.Pointer, n int, dst unsafe.Pointer, ahead uintptr)
//
// dst[l] = the bfloat16 at p + 2·l widened, for n elements (a multiple of
// 16), prefetching the 2·n bytes from ahead on (the row of the next tile:
// a verify block's weights come from memory, and the widening of a chunk
// would otherwise wait for each line while the FMAs wait for it).
TEXT ·widenBF16AVX2(SB), NOSPLIT, $0-32
	MOVQ p+0(FP), R8
	MOVQ n+8(FP), CX
	MOVQ dst+16(FP), DI
	MOVQ ahead+24(FP), R12
	XORQ AX, AX
	TESTQ CX, CX
	JZ doneBF16Widen

loopBF16Widen:
	PREFETCHT0 (R12)(AX*2)
	VPMOVZXWD (R8)(AX*2), Y0
	VPSLLD $16, Y0, Y0
	VMOVUPS Y0, (DI)(AX*4)
	VPMOVZXWD 16(R8)(AX*2), Y1
	VPSLLD $16, Y1, Y1
	VMOVUPS Y1, 32(DI)(AX*4)
	ADDQ $16, AX
	CMPQ AX, CX
	JLT loopBF16Widen

doneBF16Widen:
	VZEROUPPER
	RET

// The E4M3 → float32 widening of fp8_amd64.s, 8 weights at a time (F16C):
// sign-extend the bytes to 16 bits, shift left by 7, clear bit 14, convert
// as half precision (exact, subnormals included: float32 subnormals would
// cost microcode assists) and multiply by 256·scale.

// FP8_WIDEN widens the 8 bytes at off(row) (element AX) into w (its X form
// wx), times Y12.
#define FP8_WIDEN(off, row, wx, w) \
	VPMOVSXBW off(row)(AX*1), wx; \
	VPSLLW $7, wx, wx; \
	VPAND X14, wx, wx; \
	VCVTPH2PS wx, w; \
	VMULPS Y12, w, w

// FP8_CONSTS loads the widening's mask (X14) and 256.0 (Y13).
#define FP8_CONSTS \
	MOVL $0xBFFFBFFF, BX; \
	MOVQ BX, X14; \
	VPBROADCASTD X14, X14; \
	MOVL $0x43800000, BX; \
	MOVQ BX, X13; \
	VPBROADCASTD X13, Y13

// FP8_BLOCK sets Y12 to 256 times the next scale at DX and BX to the end
// of its 128 elements (n at most).
#define FP8_BLOCK \
	VBROADCASTSS (DX), Y12; \
	VMULPS Y13, Y12, Y12; \
	ADDQ $4, DX; \
	LEAQ 128(AX), BX; \
	CMPQ BX, CX; \
	CMOVQGT CX, BX

// func fp8Dot4x1AVX2(p0, p1, p2, p3, sp, x unsafe.Pointer, n int, acc *[4][16]float32, ahead uintptr)
//
// fp8Dot4x1 (fp8_amd64.s) on 8-lane halves, with the same prefetch.
TEXT ·fp8Dot4x1AVX2(SB), NOSPLIT, $0-72
	MOVQ p0+0(FP), R8
	MOVQ p1+8(FP), R9
	MOVQ p2+16(FP), R10
	MOVQ p3+24(FP), R11
	MOVQ sp+32(FP), DX
	MOVQ x+40(FP), SI
	MOVQ n+48(FP), CX
	MOVQ ahead+64(FP), R12
	ZERO_ACC
	FP8_CONSTS
	XORQ AX, AX
	TESTQ CX, CX
	JZ doneFP8

blockFP8:
	FP8_BLOCK

loopFP8:
	PREFETCHT0 (R12)(AX*4)
	VMOVUPS (SI)(AX*4), Y8
	VMOVUPS 32(SI)(AX*4), Y9
	FP8_WIDEN(0, R8, X10, Y10)
	VFMADD231PS Y8, Y10, Y0
	FP8_WIDEN(8, R8, X11, Y11)
	VFMADD231PS Y9, Y11, Y1
	FP8_WIDEN(0, R9, X10, Y10)
	VFMADD231PS Y8, Y10, Y2
	FP8_WIDEN(8, R9, X11, Y11)
	VFMADD231PS Y9, Y11, Y3
	FP8_WIDEN(0, R10, X10, Y10)
	VFMADD231PS Y8, Y10, Y4
	FP8_WIDEN(8, R10, X11, Y11)
	VFMADD231PS Y9, Y11, Y5
	FP8_WIDEN(0, R11, X10, Y10)
	VFMADD231PS Y8, Y10, Y6
	FP8_WIDEN(8, R11, X11, Y11)
	VFMADD231PS Y9, Y11, Y7
	ADDQ $16, AX
	CMPQ AX, BX
	JLT loopFP8
	CMPQ AX, CX
	JLT blockFP8

doneFP8:
	MOVQ acc+56(FP), DI
	STORE_ACC
	VZEROUPPER
	RET

// func fp8WidenAVX2(p, sp unsafe.Pointer, n int, dst unsafe.Pointer, ahead uintptr)
//
// fp8Widen (fp8_amd64.s) on 8-lane halves.
TEXT ·fp8WidenAVX2(SB), NOSPLIT, $0-40
	MOVQ p+0(FP), R8
	MOVQ sp+8(FP), DX
	MOVQ n+16(FP), CX
	MOVQ dst+24(FP), DI
	MOVQ ahead+32(FP), R12
	FP8_CONSTS
	XORQ AX, AX
	TESTQ CX, CX
	JZ doneWiden

blockWiden:
	FP8_BLOCK

loopWiden:
	PREFETCHT0 (R12)(AX*1)
	FP8_WIDEN(0, R8, X10, Y10)
	VMOVUPS Y10, (DI)(AX*4)
	FP8_WIDEN(8, R8, X11, Y11)
	VMOVUPS Y11, 32(DI)(AX*4)
	ADDQ $16, AX
	CMPQ AX, BX
	JLT loopWiden
	CMPQ AX, CX
	JLT blockWiden

doneWiden:
	VZEROUPPER
	RET

// func cpuHasF16C() bool
//
// Reports CPUID leaf 1's F16C bit (ECX bit 29), which archsimd does not.
TEXT ·cpuHasF16C(SB), NOSPLIT, $0-1
	MOVL $1, AX
	XORL CX, CX
	CPUID
	SHRL $29, CX
	ANDL $1, CX
	MOVB CX, ret+0(FP)
	RET

// BF16_FMA3 widens the 8 bfloat16s at addr into Y15 and adds them times
// the x vectors Y12-Y14 to acc0-acc2.
#define BF16_FMA3(addr, acc0, acc1, acc2) \
	VPMOVZXWD addr, Y15; \
	VPSLLD $16, Y15, Y15; \
	VFMADD231PS Y12, Y15, acc0; \
	VFMADD231PS Y13, Y15, acc1; \
	VFMADD231PS Y14, Y15, acc2

// ACC3_LOAD and ACC3_STORE move one half (off: 0 for lanes 0-7, 32 for
// lanes 8-15) of the four rows of the chains at DI, BX and AX (x rows 0,
// 1, 2) from or to Y0-Y11: Y(r + 4i) is weight row r, x row i.
#define ACC3_LOAD(off) \
	VMOVUPS off+0(DI), Y0; \
	VMOVUPS off+64(DI), Y1; \
	VMOVUPS off+128(DI), Y2; \
	VMOVUPS off+192(DI), Y3; \
	VMOVUPS off+0(BX), Y4; \
	VMOVUPS off+64(BX), Y5; \
	VMOVUPS off+128(BX), Y6; \
	VMOVUPS off+192(BX), Y7; \
	VMOVUPS off+0(AX), Y8; \
	VMOVUPS off+64(AX), Y9; \
	VMOVUPS off+128(AX), Y10; \
	VMOVUPS off+192(AX), Y11

#define ACC3_STORE(off) \
	VMOVUPS Y0, off+0(DI); \
	VMOVUPS Y1, off+64(DI); \
	VMOVUPS Y2, off+128(DI); \
	VMOVUPS Y3, off+192(DI); \
	VMOVUPS Y4, off+0(BX); \
	VMOVUPS Y5, off+64(BX); \
	VMOVUPS Y6, off+128(BX); \
	VMOVUPS Y7, off+192(BX); \
	VMOVUPS Y8, off+0(AX); \
	VMOVUPS Y9, off+64(AX); \
	VMOVUPS Y10, off+128(AX); \
	VMOVUPS Y11, off+192(AX)

// STEP3 runs one half (off: 0 or 16 bytes into the weights' 16 elements,
// twice that into x's) of 16 elements: weight rows 0-2 at R8 through the
// stride R9, row 3 at R10, x rows at SI, R11 and R12; then it moves every
// pointer on by 16 elements and counts them off CX.
#define STEP3(off) \
	VMOVUPS 2*off(SI), Y12; \
	VMOVUPS 2*off(R11), Y13; \
	VMOVUPS 2*off(R12), Y14; \
	BF16_FMA3(off(R8), Y0, Y4, Y8); \
	BF16_FMA3(off(R8)(R9*1), Y1, Y5, Y9); \
	BF16_FMA3(off(R8)(R9*2), Y2, Y6, Y10); \
	BF16_FMA3(off(R10), Y3, Y7, Y11); \
	ADDQ $32, R8; \
	ADDQ $32, R10; \
	ADDQ $64, SI; \
	ADDQ $64, R11; \
	ADDQ $64, R12; \
	SUBQ $16, CX

// func dot4x3BF16AVX2(w unsafe.Pointer, wStride uintptr, x0, x1, x2 unsafe.Pointer, n int, next uintptr, acc0, acc1, acc2 *[4][16]float32)
//
// dot4x1BF16AVX2 for three x rows at once, continuing the chains in acc0,
// acc1 and acc2: the four bfloat16 weight rows at w, w+wStride, … are
// widened in registers, each widened vector feeding all three x rows
// (8 widening instructions per 12 FMAs, where dot4x1BF16AVX2 needs 8 per
// 8). Twelve accumulators, three x vectors and one weight vector fill the
// sixteen registers, so it runs lanes 0-7 of every 16 elements over n
// (a multiple of 16), then lanes 8-15 (from L1 by then); each lane's
// chain is the same either way. The first pass prefetches the 8·n bytes
// at next into L2 (the next tile), as dot4x1BF16AVX2 does.
TEXT ·dot4x3BF16AVX2(SB), NOSPLIT, $0-80
	MOVQ w+0(FP), R8
	MOVQ wStride+8(FP), R9
	LEAQ (R8)(R9*2), R10
	ADDQ R9, R10 // row 3
	MOVQ x0+16(FP), SI
	MOVQ x1+24(FP), R11
	MOVQ x2+32(FP), R12
	MOVQ n+40(FP), R13
	MOVQ next+48(FP), DX
	MOVQ acc0+56(FP), DI
	MOVQ acc1+64(FP), BX
	MOVQ acc2+72(FP), AX
	ACC3_LOAD(0)
	MOVQ R13, CX
	TESTQ CX, CX
	JZ lo3Done
lo3Loop:
	PREFETCHT1 (DX)
	PREFETCHT1 64(DX)
	ADDQ $128, DX
	STEP3(0)
	JNZ lo3Loop
lo3Done:
	ACC3_STORE(0)
	ACC3_LOAD(32)
	MOVQ R13, CX // back to the first element: 2n bytes of weights, 4n of x
	SHLQ $1, CX
	SUBQ CX, R8
	SUBQ CX, R10
	SHLQ $1, CX
	SUBQ CX, SI
	SUBQ CX, R11
	SUBQ CX, R12
	MOVQ R13, CX
	TESTQ CX, CX
	JZ hi3Done
hi3Loop:
	STEP3(16)
	JNZ hi3Loop
hi3Done:
	ACC3_STORE(32)
	VZEROUPPER
	RET
