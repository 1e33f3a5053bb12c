//go:build goexperiment.simd && amd64

#include "textflag.h"

// The E4M3 → float32 widening below, 16 weights at a time: sign-extend
// the bytes to 16 bits and shift left by 7, which puts the sign in bit 15
// and exponent and mantissa in bits 13…7; clear bit 14; convert as half
// precision (exact, subnormals included, and unlike float32 subnormals
// free of microcode assists) and multiply by 256·scale, which rounds to the
// float32 of the dequantised weight (see half.E4M3ToF16). The caller keeps
// scales below 2^8 so that 256·scale·448 stays far from overflow.

// func fp8Dot4x1(p0, p1, p2, p3, sp, x unsafe.Pointer, n int, acc *[4][16]float32)
TEXT ·fp8Dot4x1(SB), NOSPLIT, $0-64
	MOVQ p0+0(FP), R8
	MOVQ p1+8(FP), R9
	MOVQ p2+16(FP), R10
	MOVQ p3+24(FP), R11
	MOVQ sp+32(FP), DX
	MOVQ x+40(FP), SI
	MOVQ n+48(FP), CX
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	MOVL $0xBFFFBFFF, BX // clears bit 14: the sign's copy that the shift leaves there
	VPBROADCASTD BX, Y25
	MOVL $0x43800000, BX // 256.0: half's exponent bias is 8 above E4M3's
	VPBROADCASTD BX, Z26
	XORQ AX, AX
	TESTQ CX, CX
	JZ done1

block1:
	VBROADCASTSS (DX), Z24
	VMULPS Z26, Z24, Z24
	ADDQ $4, DX
	LEAQ 128(AX), BX
	CMPQ BX, CX
	CMOVQGT CX, BX

loop1:
	VPMOVSXBW (R8)(AX*1), Y16
	VPSLLW $7, Y16, Y16
	VPANDD Y25, Y16, Y16
	VCVTPH2PS Y16, Z16
	VMULPS Z24, Z16, Z16
	VPMOVSXBW (R9)(AX*1), Y17
	VPSLLW $7, Y17, Y17
	VPANDD Y25, Y17, Y17
	VCVTPH2PS Y17, Z17
	VMULPS Z24, Z17, Z17
	VPMOVSXBW (R10)(AX*1), Y18
	VPSLLW $7, Y18, Y18
	VPANDD Y25, Y18, Y18
	VCVTPH2PS Y18, Z18
	VMULPS Z24, Z18, Z18
	VPMOVSXBW (R11)(AX*1), Y19
	VPSLLW $7, Y19, Y19
	VPANDD Y25, Y19, Y19
	VCVTPH2PS Y19, Z19
	VMULPS Z24, Z19, Z19
	VMOVUPS (SI)(AX*4), Z20
	VFMADD231PS Z20, Z16, Z0
	VFMADD231PS Z20, Z17, Z1
	VFMADD231PS Z20, Z18, Z2
	VFMADD231PS Z20, Z19, Z3
	ADDQ $16, AX
	CMPQ AX, BX
	JLT loop1
	CMPQ AX, CX
	JLT block1

done1:
	MOVQ acc+56(FP), DI
	VMOVUPS Z0, 0(DI)
	VMOVUPS Z1, 64(DI)
	VMOVUPS Z2, 128(DI)
	VMOVUPS Z3, 192(DI)
	VZEROUPPER
	RET

// func fp8Widen(p, sp unsafe.Pointer, n int, dst unsafe.Pointer)
//
// dst[l] = the float32 of weight l of the E4M3 row at p, scaled by its
// block's scale (sp, one per 128 elements), for the first n elements (a
// multiple of 16): the same values the kernels above multiply.
TEXT ·fp8Widen(SB), NOSPLIT, $0-32
	MOVQ p+0(FP), R8
	MOVQ sp+8(FP), DX
	MOVQ n+16(FP), CX
	MOVQ dst+24(FP), DI
	MOVL $0xBFFFBFFF, BX
	VPBROADCASTD BX, Y25
	MOVL $0x43800000, BX
	VPBROADCASTD BX, Z26
	XORQ AX, AX
	TESTQ CX, CX
	JZ donew

blockw:
	VBROADCASTSS (DX), Z24
	VMULPS Z26, Z24, Z24
	ADDQ $4, DX
	LEAQ 128(AX), BX
	CMPQ BX, CX
	CMOVQGT CX, BX

loopw:
	VPMOVSXBW (R8)(AX*1), Y16
	VPSLLW $7, Y16, Y16
	VPANDD Y25, Y16, Y16
	VCVTPH2PS Y16, Z16
	VMULPS Z24, Z16, Z16
	VMOVUPS Z16, (DI)(AX*4)
	ADDQ $16, AX
	CMPQ AX, BX
	JLT loopw
	CMPQ AX, CX
	JLT blockw

donew:
	VZEROUPPER
	RET
