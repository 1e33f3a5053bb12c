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

// func dot4x4BF16(p0, p1, p2, p3, x unsafe.Pointer, k int, out unsafe.Pointer, outStride int)
//
// out[s*outStride+r] = bfloat16 weight row r (p0…p3, widened exactly) · x row
// s (x, rows k floats apart), k a multiple of 16. Each of the 16 products is
// accumulated lane by lane, one FMA per 16 elements in k order (Z0-Z15,
// Z(4s+r)), then its lanes are added by sum4's tree: halves of 256, then of
// 128 bits, then adjacent pairs twice. That is exactly what the single-row
// kernel computes, so every row stays bit-identical to the row alone.
TEXT ·dot4x4BF16(SB), NOSPLIT, $0-64
	LOAD_ARGS
	JZ reduce

loop:
	VPMOVZXWD (R8)(AX*2), Z16
	VPSLLD $16, Z16, Z16
	VPMOVZXWD (R9)(AX*2), Z17
	VPSLLD $16, Z17, Z17
	VPMOVZXWD (R10)(AX*2), Z18
	VPSLLD $16, Z18, Z18
	VPMOVZXWD (R11)(AX*2), Z19
	VPSLLD $16, Z19, Z19
	FMA_4X4
	ADDQ $16, AX
	CMPQ AX, CX
	JLT loop

reduce:
	REDUCE_STORE
	VZEROUPPER
	RET

// func dot4x4F32(p0, p1, p2, p3, x unsafe.Pointer, k int, out unsafe.Pointer, outStride int)
//
// dot4x4BF16 for float32 weight rows (a prefill's BF16 tiles widened once):
// the same FMA chains and the same tree, with 8 loads and no widening per
// 16 FMAs.
TEXT ·dot4x4F32(SB), NOSPLIT, $0-64
	LOAD_ARGS
	JZ reduceF32

loopF32:
	VMOVUPS (R8)(AX*4), Z16
	VMOVUPS (R9)(AX*4), Z17
	VMOVUPS (R10)(AX*4), Z18
	VMOVUPS (R11)(AX*4), Z19
	FMA_4X4
	ADDQ $16, AX
	CMPQ AX, CX
	JLT loopF32

reduceF32:
	REDUCE_STORE
	VZEROUPPER
	RET
