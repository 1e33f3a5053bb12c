//go:build goexperiment.simd && amd64

#include "textflag.h"

// rowMajor reorders the 16 sums from lane 4r+s (weight row r, x row s) to
// lane 4s+r, so each x row's four sums are one 128-bit lane.
DATA rowMajor<>+0(SB)/4, $0
DATA rowMajor<>+4(SB)/4, $4
DATA rowMajor<>+8(SB)/4, $8
DATA rowMajor<>+12(SB)/4, $12
DATA rowMajor<>+16(SB)/4, $1
DATA rowMajor<>+20(SB)/4, $5
DATA rowMajor<>+24(SB)/4, $9
DATA rowMajor<>+28(SB)/4, $13
DATA rowMajor<>+32(SB)/4, $2
DATA rowMajor<>+36(SB)/4, $6
DATA rowMajor<>+40(SB)/4, $10
DATA rowMajor<>+44(SB)/4, $14
DATA rowMajor<>+48(SB)/4, $3
DATA rowMajor<>+52(SB)/4, $7
DATA rowMajor<>+56(SB)/4, $11
DATA rowMajor<>+60(SB)/4, $15
GLOBL rowMajor<>(SB), RODATA|NOPTR, $64

// ZERO_ACCUMULATORS clears Z0-Z15.
#define ZERO_ACCUMULATORS \
	VPXORD Z0, Z0, Z0; \
	VPXORD Z1, Z1, Z1; \
	VPXORD Z2, Z2, Z2; \
	VPXORD Z3, Z3, Z3; \
	VPXORD Z4, Z4, Z4; \
	VPXORD Z5, Z5, Z5; \
	VPXORD Z6, Z6, Z6; \
	VPXORD Z7, Z7, Z7; \
	VPXORD Z8, Z8, Z8; \
	VPXORD Z9, Z9, Z9; \
	VPXORD Z10, Z10, Z10; \
	VPXORD Z11, Z11, Z11; \
	VPXORD Z12, Z12, Z12; \
	VPXORD Z13, Z13, Z13; \
	VPXORD Z14, Z14, Z14; \
	VPXORD Z15, Z15, Z15

// LOAD_ARGS loads the arguments of dot4x4BF16 and dot4x4F32 (weight rows
// R8-R11, x rows SI, R12-R14, k CX, out DI, its row stride in bytes BX),
// clears the accumulators and AX (the element index) and tests k.
#define LOAD_ARGS \
	MOVQ p0+0(FP), R8; \
	MOVQ p1+8(FP), R9; \
	MOVQ p2+16(FP), R10; \
	MOVQ p3+24(FP), R11; \
	MOVQ x+32(FP), SI; \
	MOVQ k+40(FP), CX; \
	MOVQ out+48(FP), DI; \
	MOVQ outStride+56(FP), BX; \
	SHLQ $2, BX; \
	LEAQ (SI)(CX*4), R12; \
	LEAQ (R12)(CX*4), R13; \
	LEAQ (R13)(CX*4), R14; \
	ZERO_ACCUMULATORS; \
	XORQ AX, AX; \
	TESTQ CX, CX

// FMA_4X4 multiplies the 16 elements at AX of the four x rows by the four
// weight vectors in Z16-Z19 into accumulator Z(4s+r) for x row s, weight row r.
#define FMA_4X4 \
	VMOVUPS (SI)(AX*4), Z20; \
	VFMADD231PS Z20, Z16, Z0; \
	VFMADD231PS Z20, Z17, Z1; \
	VFMADD231PS Z20, Z18, Z2; \
	VFMADD231PS Z20, Z19, Z3; \
	VMOVUPS (R12)(AX*4), Z21; \
	VFMADD231PS Z21, Z16, Z4; \
	VFMADD231PS Z21, Z17, Z5; \
	VFMADD231PS Z21, Z18, Z6; \
	VFMADD231PS Z21, Z19, Z7; \
	VMOVUPS (R13)(AX*4), Z22; \
	VFMADD231PS Z22, Z16, Z8; \
	VFMADD231PS Z22, Z17, Z9; \
	VFMADD231PS Z22, Z18, Z10; \
	VFMADD231PS Z22, Z19, Z11; \
	VMOVUPS (R14)(AX*4), Z23; \
	VFMADD231PS Z23, Z16, Z12; \
	VFMADD231PS Z23, Z17, Z13; \
	VFMADD231PS Z23, Z18, Z14; \
	VFMADD231PS Z23, Z19, Z15

// REDUCE_STORE adds each accumulator Z(4s+r)'s lanes by sum4's tree and
// stores x row s's four sums to DI + s·BX (BX the row stride in bytes):
// 256-bit halves (Z16+i = [acc 2i | acc 2i+1]), then 128-bit halves (Zq =
// accs 4q…4q+3), then adjacent pairs twice (lane 4g+c ends up holding acc
// 4c+g), then rowMajor puts each x row's four sums in one 128-bit lane.
#define REDUCE_STORE \
	VSHUFF32X4 $0x44, Z1, Z0, Z24; \
	VSHUFF32X4 $0xEE, Z1, Z0, Z25; \
	VADDPS Z25, Z24, Z16; \
	VSHUFF32X4 $0x44, Z3, Z2, Z24; \
	VSHUFF32X4 $0xEE, Z3, Z2, Z25; \
	VADDPS Z25, Z24, Z17; \
	VSHUFF32X4 $0x44, Z5, Z4, Z24; \
	VSHUFF32X4 $0xEE, Z5, Z4, Z25; \
	VADDPS Z25, Z24, Z18; \
	VSHUFF32X4 $0x44, Z7, Z6, Z24; \
	VSHUFF32X4 $0xEE, Z7, Z6, Z25; \
	VADDPS Z25, Z24, Z19; \
	VSHUFF32X4 $0x44, Z9, Z8, Z24; \
	VSHUFF32X4 $0xEE, Z9, Z8, Z25; \
	VADDPS Z25, Z24, Z20; \
	VSHUFF32X4 $0x44, Z11, Z10, Z24; \
	VSHUFF32X4 $0xEE, Z11, Z10, Z25; \
	VADDPS Z25, Z24, Z21; \
	VSHUFF32X4 $0x44, Z13, Z12, Z24; \
	VSHUFF32X4 $0xEE, Z13, Z12, Z25; \
	VADDPS Z25, Z24, Z22; \
	VSHUFF32X4 $0x44, Z15, Z14, Z24; \
	VSHUFF32X4 $0xEE, Z15, Z14, Z25; \
	VADDPS Z25, Z24, Z23; \
	VSHUFF32X4 $0x88, Z17, Z16, Z24; \
	VSHUFF32X4 $0xDD, Z17, Z16, Z25; \
	VADDPS Z25, Z24, Z0; \
	VSHUFF32X4 $0x88, Z19, Z18, Z24; \
	VSHUFF32X4 $0xDD, Z19, Z18, Z25; \
	VADDPS Z25, Z24, Z1; \
	VSHUFF32X4 $0x88, Z21, Z20, Z24; \
	VSHUFF32X4 $0xDD, Z21, Z20, Z25; \
	VADDPS Z25, Z24, Z2; \
	VSHUFF32X4 $0x88, Z23, Z22, Z24; \
	VSHUFF32X4 $0xDD, Z23, Z22, Z25; \
	VADDPS Z25, Z24, Z3; \
	VSHUFPS $0x88, Z1, Z0, Z24; \
	VSHUFPS $0xDD, Z1, Z0, Z25; \
	VADDPS Z25, Z24, Z4; \
	VSHUFPS $0x88, Z3, Z2, Z24; \
	VSHUFPS $0xDD, Z3, Z2, Z25; \
	VADDPS Z25, Z24, Z5; \
	VSHUFPS $0x88, Z5, Z4, Z24; \
	VSHUFPS $0xDD, Z5, Z4, Z25; \
	VADDPS Z25, Z24, Z6; \
	VMOVUPS rowMajor<>(SB), Z26; \
	VPERMPS Z6, Z26, Z7; \
	VEXTRACTF32X4 $0, Z7, (DI); \
	ADDQ BX, DI; \
	VEXTRACTF32X4 $1, Z7, (DI); \
	ADDQ BX, DI; \
	VEXTRACTF32X4 $2, Z7, (DI); \
	ADDQ BX, DI; \
	VEXTRACTF32X4 $3, Z7, (DI)

// STEP_4X4_BF16 widens 16 elements at AX of the four bfloat16 weight rows
// into Z16-Z19, runs FMA_4X4 and moves AX to the next 16.
#define STEP_4X4_BF16 \
	VPMOVZXWD (R8)(AX*2), Z16; \
	VPSLLD $16, Z16, Z16; \
	VPMOVZXWD (R9)(AX*2), Z17; \
	VPSLLD $16, Z17, Z17; \
	VPMOVZXWD (R10)(AX*2), Z18; \
	VPSLLD $16, Z18, Z18; \
	VPMOVZXWD (R11)(AX*2), Z19; \
	VPSLLD $16, Z19, Z19; \
	FMA_4X4; \
	ADDQ $16, AX

// func dot4x4BF16(p0, p1, p2, p3, x unsafe.Pointer, k int, out unsafe.Pointer, outStride int, next uintptr)
//
// out[s*outStride+r] = bfloat16 weight row r (p0…p3, widened exactly) · x row
// s (x, rows k floats apart), k a multiple of 16. Each of the 16 products is
// accumulated lane by lane, one FMA per 16 elements in k order (Z0-Z15,
// Z(4s+r)), then its lanes are added by sum4's tree: halves of 256, then of
// 128 bits, then adjacent pairs twice. That is exactly what the single-row
// kernel computes, so every row stays bit-identical to the row alone.
// With next set, each 16 elements also prefetch the next 32 of the 2·k
// bytes there into L2 (half a line: each line is asked for twice, which
// costs less than a branch): the four calls of a tile's first 16 x rows
// fetch the next tile at an even rate.
TEXT ·dot4x4BF16(SB), NOSPLIT, $0-72
	LOAD_ARGS
	JZ reduce
	MOVQ next+64(FP), DX
	TESTQ DX, DX
	JZ loop

loopPrefetch:
	PREFETCHT1 (DX)(AX*2)
	STEP_4X4_BF16
	CMPQ AX, CX
	JLT loopPrefetch
	JMP reduce

loop:
	STEP_4X4_BF16
	CMPQ AX, CX
	JLT loop

reduce:
	REDUCE_STORE
	VZEROUPPER
	RET

// STEP_4X4_F32 loads 16 elements at AX of the four float32 weight rows
// into Z16-Z19, runs FMA_4X4 and moves AX to the next 16.
#define STEP_4X4_F32 \
	VMOVUPS (R8)(AX*4), Z16; \
	VMOVUPS (R9)(AX*4), Z17; \
	VMOVUPS (R10)(AX*4), Z18; \
	VMOVUPS (R11)(AX*4), Z19; \
	FMA_4X4; \
	ADDQ $16, AX

// func dot4x4F32(p0, p1, p2, p3, x unsafe.Pointer, k int, out unsafe.Pointer, outStride int, next uintptr)
//
// dot4x4BF16 for float32 weight rows (a prefill's BF16 tiles widened once):
// the same FMA chains and the same tree, with 8 loads and no widening per
// 16 FMAs, and the same prefetch of next.
TEXT ·dot4x4F32(SB), NOSPLIT, $0-72
	LOAD_ARGS
	JZ reduceF32
	MOVQ next+64(FP), DX
	TESTQ DX, DX
	JZ loopF32

loopF32Prefetch:
	PREFETCHT1 (DX)(AX*2)
	STEP_4X4_F32
	CMPQ AX, CX
	JLT loopF32Prefetch
	JMP reduceF32

loopF32:
	STEP_4X4_F32
	CMPQ AX, CX
	JLT loopF32

reduceF32:
	REDUCE_STORE
	VZEROUPPER
	RET

// FMA_BF16 widens the 16 bfloat16s at element AX of row into w and adds
// them times the x vector Z4 to acc.
#define FMA_BF16(row, w, acc) \
	VPMOVZXWD (row)(AX*2), w; \
	VPSLLD $16, w, w; \
	VFMADD231PS Z4, w, acc

// func dot4x1BF16(p0, p1, p2, p3, q unsafe.Pointer, n int, next uintptr, acc *[4][16]float32)
//
// acc[r] = the lane partial sums of bfloat16 weight row r (p0…p3, widened
// exactly) times the x row q over n elements (a multiple of 16), one FMA
// per 16 elements in order. A decode step streams its weights from memory
// once, so while it reads these four rows it prefetches the 8·n bytes at
// next (the following tile of four rows) into L2, two lines per 16
// elements: the memory latency of the next tile overlaps this one's FMAs.
TEXT ·dot4x1BF16(SB), NOSPLIT, $0-64
	MOVQ p0+0(FP), R8
	MOVQ p1+8(FP), R9
	MOVQ p2+16(FP), R10
	MOVQ p3+24(FP), R11
	MOVQ q+32(FP), SI
	MOVQ n+40(FP), CX
	MOVQ next+48(FP), DX
	MOVQ acc+56(FP), DI
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	XORQ AX, AX
	TESTQ CX, CX
	JZ store1

loop1:
	PREFETCHT1 (DX)(AX*8)
	PREFETCHT1 64(DX)(AX*8)
	VMOVUPS (SI)(AX*4), Z4
	FMA_BF16(R8, Z5, Z0)
	FMA_BF16(R9, Z6, Z1)
	FMA_BF16(R10, Z7, Z2)
	FMA_BF16(R11, Z8, Z3)
	ADDQ $16, AX
	CMPQ AX, CX
	JLT loop1

store1:
	VMOVUPS Z0, (DI)
	VMOVUPS Z1, 64(DI)
	VMOVUPS Z2, 128(DI)
	VMOVUPS Z3, 192(DI)
	VZEROUPPER
	RET

// MIX_CHUNK adds the 16 values at off(SI) times the three broadcast
// weights Z24-Z26 to one accumulator of each of three rows.
#define MIX_CHUNK(off, a, b, c) \
	VMOVUPS off(SI), Z27; \
	VFMADD231PS Z24, Z27, a; \
	VFMADD231PS Z25, Z27, b; \
	VFMADD231PS Z26, Z27, c

// MIX_KEY broadcasts the weights of key AX of the three rows (R8, R10, R9)
// and adds them times the key's 128 values at SI to Z0-Z7, Z8-Z15, Z16-Z23.
#define MIX_KEY \
	VBROADCASTSS (R8)(AX*4), Z24; \
	VBROADCASTSS (R10)(AX*4), Z25; \
	VBROADCASTSS (R9)(AX*4), Z26; \
	MIX_CHUNK(0, Z0, Z8, Z16); \
	MIX_CHUNK(64, Z1, Z9, Z17); \
	MIX_CHUNK(128, Z2, Z10, Z18); \
	MIX_CHUNK(192, Z3, Z11, Z19); \
	MIX_CHUNK(256, Z4, Z12, Z20); \
	MIX_CHUNK(320, Z5, Z13, Z21); \
	MIX_CHUNK(384, Z6, Z14, Z22); \
	MIX_CHUNK(448, Z7, Z15, Z23)

// func mix3x128(acc unsafe.Pointer, accStride int, w unsafe.Pointer, wStride int, v unsafe.Pointer, vStride, n int, sums unsafe.Pointer)
//
// See mixRowsAVX512: three rows of 128 accumulator lanes stay in Z0-Z23
// while the n value rows stream past, one FMA per lane and key in key
// order; the weight sums (Z28-Z30, when sums is not nil) add the weights
// in key order.
TEXT ·mix3x128(SB), NOSPLIT, $0-64
	MOVQ acc+0(FP), DI
	MOVQ accStride+8(FP), BX
	SHLQ $2, BX
	MOVQ w+16(FP), R8
	MOVQ wStride+24(FP), R9
	SHLQ $2, R9
	LEAQ (R8)(R9*1), R10
	LEAQ (R10)(R9*1), R9
	MOVQ v+32(FP), SI
	MOVQ vStride+40(FP), DX
	SHLQ $2, DX
	MOVQ n+48(FP), CX
	MOVQ sums+56(FP), R11
	LEAQ (DI)(BX*1), R12
	LEAQ (R12)(BX*1), R13
	VMOVUPS 0(DI), Z0
	VMOVUPS 64(DI), Z1
	VMOVUPS 128(DI), Z2
	VMOVUPS 192(DI), Z3
	VMOVUPS 256(DI), Z4
	VMOVUPS 320(DI), Z5
	VMOVUPS 384(DI), Z6
	VMOVUPS 448(DI), Z7
	VMOVUPS 0(R12), Z8
	VMOVUPS 64(R12), Z9
	VMOVUPS 128(R12), Z10
	VMOVUPS 192(R12), Z11
	VMOVUPS 256(R12), Z12
	VMOVUPS 320(R12), Z13
	VMOVUPS 384(R12), Z14
	VMOVUPS 448(R12), Z15
	VMOVUPS 0(R13), Z16
	VMOVUPS 64(R13), Z17
	VMOVUPS 128(R13), Z18
	VMOVUPS 192(R13), Z19
	VMOVUPS 256(R13), Z20
	VMOVUPS 320(R13), Z21
	VMOVUPS 384(R13), Z22
	VMOVUPS 448(R13), Z23
	XORQ AX, AX
	TESTQ R11, R11
	JZ plain

	VBROADCASTSS 0(R11), Z28
	VBROADCASTSS 64(R11), Z29
	VBROADCASTSS 128(R11), Z30

summing:
	MIX_KEY
	VADDPS Z24, Z28, Z28
	VADDPS Z25, Z29, Z29
	VADDPS Z26, Z30, Z30
	ADDQ DX, SI
	INCQ AX
	CMPQ AX, CX
	JLT summing
	VMOVUPS Z28, 0(R11)
	VMOVUPS Z29, 64(R11)
	VMOVUPS Z30, 128(R11)
	JMP store

plain:
	MIX_KEY
	ADDQ DX, SI
	INCQ AX
	CMPQ AX, CX
	JLT plain

store:
	VMOVUPS Z0, 0(DI)
	VMOVUPS Z1, 64(DI)
	VMOVUPS Z2, 128(DI)
	VMOVUPS Z3, 192(DI)
	VMOVUPS Z4, 256(DI)
	VMOVUPS Z5, 320(DI)
	VMOVUPS Z6, 384(DI)
	VMOVUPS Z7, 448(DI)
	VMOVUPS Z8, 0(R12)
	VMOVUPS Z9, 64(R12)
	VMOVUPS Z10, 128(R12)
	VMOVUPS Z11, 192(R12)
	VMOVUPS Z12, 256(R12)
	VMOVUPS Z13, 320(R12)
	VMOVUPS Z14, 384(R12)
	VMOVUPS Z15, 448(R12)
	VMOVUPS Z16, 0(R13)
	VMOVUPS Z17, 64(R13)
	VMOVUPS Z18, 128(R13)
	VMOVUPS Z19, 192(R13)
	VMOVUPS Z20, 256(R13)
	VMOVUPS Z21, 320(R13)
	VMOVUPS Z22, 384(R13)
	VMOVUPS Z23, 448(R13)
	VZEROUPPER
	RET
