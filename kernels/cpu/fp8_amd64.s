//go:build goexperiment.simd && amd64

#include "textflag.h"

// The E4M3 → float32 widening below, 16 weights at a time: sign-extend
// the bytes to 16 bits and shift left by 7, which puts the sign in bit 15
// and exponent and mantissa in bits 13…7; clear bit 14; convert as half
// precision (exact, subnormals included, and unlike float32 subnormals
// free of microcode assists) and multiply by 256·scale, which rounds to the
// float32 of the dequantised weight (see half.E4M3ToF16). The caller keeps
// scales below 2^8 so that 256·scale·448 stays far from overflow.

// func fp8Dot4x1(p0, p1, p2, p3, sp, x unsafe.Pointer, n int, acc *[4][16]float32, ahead uintptr)
//
// Each iteration prefetches the cache line at ahead + 4·l: over the loop,
// 4·n bytes, a whole next tile of four rows.
TEXT ·fp8Dot4x1(SB), NOSPLIT, $0-72
	MOVQ p0+0(FP), R8
	MOVQ p1+8(FP), R9
	MOVQ p2+16(FP), R10
	MOVQ p3+24(FP), R11
	MOVQ sp+32(FP), DX
	MOVQ x+40(FP), SI
	MOVQ n+48(FP), CX
	MOVQ ahead+64(FP), R12
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
	PREFETCHT0 (R12)(AX*4)
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

// func fp8Widen(p, sp unsafe.Pointer, n int, dst unsafe.Pointer, ahead uintptr)
//
// dst[l] = the float32 of weight l of the E4M3 row at p, scaled by its
// block's scale (sp, one per 128 elements), for the first n elements (a
// multiple of 16): the same values the kernels above multiply.
// Each iteration prefetches the line at ahead + l: the n bytes from ahead on.
TEXT ·fp8Widen(SB), NOSPLIT, $0-40
	MOVQ p+0(FP), R8
	MOVQ sp+8(FP), DX
	MOVQ n+16(FP), CX
	MOVQ dst+24(FP), DI
	MOVQ ahead+32(FP), R12
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
	PREFETCHT0 (R12)(AX*1)
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

// func fp8Dot4x4(p0, p1, p2, p3, x unsafe.Pointer, n, stride int, acc *[16][16]float32)
//
// acc[4s+r] += the per-lane partial sums of x row s (x, rows stride floats
// apart) times the float32 weight row r (p0…p3, widened by fp8Widen) over
// the first n elements (a multiple of 16): one FMA per 16 elements in k
// order, as fp8Dot4x1 accumulates, continuing the chains held in acc. Each
// weight vector loaded feeds four x rows.
TEXT ·fp8Dot4x4(SB), NOSPLIT, $0-64
	MOVQ p0+0(FP), R8
	MOVQ p1+8(FP), R9
	MOVQ p2+16(FP), R10
	MOVQ p3+24(FP), R11
	MOVQ x+32(FP), SI
	MOVQ n+40(FP), CX
	MOVQ stride+48(FP), DI
	MOVQ acc+56(FP), DX
	LEAQ (SI)(DI*4), R12
	LEAQ (R12)(DI*4), R13
	LEAQ (R13)(DI*4), R14
	VMOVUPS 0(DX), Z0
	VMOVUPS 64(DX), Z1
	VMOVUPS 128(DX), Z2
	VMOVUPS 192(DX), Z3
	VMOVUPS 256(DX), Z4
	VMOVUPS 320(DX), Z5
	VMOVUPS 384(DX), Z6
	VMOVUPS 448(DX), Z7
	VMOVUPS 512(DX), Z8
	VMOVUPS 576(DX), Z9
	VMOVUPS 640(DX), Z10
	VMOVUPS 704(DX), Z11
	VMOVUPS 768(DX), Z12
	VMOVUPS 832(DX), Z13
	VMOVUPS 896(DX), Z14
	VMOVUPS 960(DX), Z15
	XORQ AX, AX
	TESTQ CX, CX
	JZ done44

loop44:
	VMOVUPS (R8)(AX*4), Z16
	VMOVUPS (R9)(AX*4), Z17
	VMOVUPS (R10)(AX*4), Z18
	VMOVUPS (R11)(AX*4), Z19
	VMOVUPS (SI)(AX*4), Z20
	VFMADD231PS Z20, Z16, Z0
	VFMADD231PS Z20, Z17, Z1
	VFMADD231PS Z20, Z18, Z2
	VFMADD231PS Z20, Z19, Z3
	VMOVUPS (R12)(AX*4), Z21
	VFMADD231PS Z21, Z16, Z4
	VFMADD231PS Z21, Z17, Z5
	VFMADD231PS Z21, Z18, Z6
	VFMADD231PS Z21, Z19, Z7
	VMOVUPS (R13)(AX*4), Z22
	VFMADD231PS Z22, Z16, Z8
	VFMADD231PS Z22, Z17, Z9
	VFMADD231PS Z22, Z18, Z10
	VFMADD231PS Z22, Z19, Z11
	VMOVUPS (R14)(AX*4), Z23
	VFMADD231PS Z23, Z16, Z12
	VFMADD231PS Z23, Z17, Z13
	VFMADD231PS Z23, Z18, Z14
	VFMADD231PS Z23, Z19, Z15
	ADDQ $16, AX
	CMPQ AX, CX
	JLT loop44

done44:
	MOVQ acc+56(FP), DI
	VMOVUPS Z0, 0(DI)
	VMOVUPS Z1, 64(DI)
	VMOVUPS Z2, 128(DI)
	VMOVUPS Z3, 192(DI)
	VMOVUPS Z4, 256(DI)
	VMOVUPS Z5, 320(DI)
	VMOVUPS Z6, 384(DI)
	VMOVUPS Z7, 448(DI)
	VMOVUPS Z8, 512(DI)
	VMOVUPS Z9, 576(DI)
	VMOVUPS Z10, 640(DI)
	VMOVUPS Z11, 704(DI)
	VMOVUPS Z12, 768(DI)
	VMOVUPS Z13, 832(DI)
	VMOVUPS Z14, 896(DI)
	VMOVUPS Z15, 960(DI)
	VZEROUPPER
	RET
