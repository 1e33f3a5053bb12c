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

// func fp8Dot2x8(p0, p1, sp, x unsafe.Pointer, n, stride int, acc unsafe.Pointer)
//
// Eight x rows (stride floats apart) against two weight rows: each widened
// weight vector feeds eight FMAs. The sum of x row s and weight row r goes
// to acc + 256·s + 64·r (rows of [4][16]float32).
TEXT ·fp8Dot2x8(SB), NOSPLIT, $0-56
	MOVQ p0+0(FP), R8
	MOVQ p1+8(FP), R9
	MOVQ sp+16(FP), DX
	MOVQ x+24(FP), SI
	MOVQ n+32(FP), CX
	MOVQ stride+40(FP), DI
	SHLQ $2, DI
	LEAQ (DI)(DI*2), R11
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4
	VPXORD Z5, Z5, Z5
	VPXORD Z6, Z6, Z6
	VPXORD Z7, Z7, Z7
	VPXORD Z8, Z8, Z8
	VPXORD Z9, Z9, Z9
	VPXORD Z10, Z10, Z10
	VPXORD Z11, Z11, Z11
	VPXORD Z12, Z12, Z12
	VPXORD Z13, Z13, Z13
	VPXORD Z14, Z14, Z14
	VPXORD Z15, Z15, Z15
	MOVL $0xBFFFBFFF, BX // clears bit 14: the sign's copy that the shift leaves there
	VPBROADCASTD BX, Y25
	MOVL $0x43800000, BX // 256.0: half's exponent bias is 8 above E4M3's
	VPBROADCASTD BX, Z26
	XORQ AX, AX
	TESTQ CX, CX
	JZ done8

block8:
	VBROADCASTSS (DX), Z24
	VMULPS Z26, Z24, Z24
	ADDQ $4, DX
	LEAQ 128(AX), BX
	CMPQ BX, CX
	CMOVQGT CX, BX

loop8:
	LEAQ (SI)(DI*4), R13
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
	VMOVUPS (SI), Z18
	VFMADD231PS Z18, Z16, Z0
	VFMADD231PS Z18, Z17, Z1
	VMOVUPS (SI)(DI*1), Z18
	VFMADD231PS Z18, Z16, Z2
	VFMADD231PS Z18, Z17, Z3
	VMOVUPS (SI)(DI*2), Z18
	VFMADD231PS Z18, Z16, Z4
	VFMADD231PS Z18, Z17, Z5
	VMOVUPS (SI)(R11*1), Z18
	VFMADD231PS Z18, Z16, Z6
	VFMADD231PS Z18, Z17, Z7
	VMOVUPS (R13), Z18
	VFMADD231PS Z18, Z16, Z8
	VFMADD231PS Z18, Z17, Z9
	VMOVUPS (R13)(DI*1), Z18
	VFMADD231PS Z18, Z16, Z10
	VFMADD231PS Z18, Z17, Z11
	VMOVUPS (R13)(DI*2), Z18
	VFMADD231PS Z18, Z16, Z12
	VFMADD231PS Z18, Z17, Z13
	VMOVUPS (R13)(R11*1), Z18
	VFMADD231PS Z18, Z16, Z14
	VFMADD231PS Z18, Z17, Z15
	ADDQ $64, SI
	ADDQ $16, AX
	CMPQ AX, BX
	JLT loop8
	CMPQ AX, CX
	JLT block8

done8:
	MOVQ acc+48(FP), DI
	VMOVUPS Z0, 0(DI)
	VMOVUPS Z1, 64(DI)
	VMOVUPS Z2, 256(DI)
	VMOVUPS Z3, 320(DI)
	VMOVUPS Z4, 512(DI)
	VMOVUPS Z5, 576(DI)
	VMOVUPS Z6, 768(DI)
	VMOVUPS Z7, 832(DI)
	VMOVUPS Z8, 1024(DI)
	VMOVUPS Z9, 1088(DI)
	VMOVUPS Z10, 1280(DI)
	VMOVUPS Z11, 1344(DI)
	VMOVUPS Z12, 1536(DI)
	VMOVUPS Z13, 1600(DI)
	VMOVUPS Z14, 1792(DI)
	VMOVUPS Z15, 1856(DI)
	VZEROUPPER
	RET

// func fp8Dot1x16(p0, sp, x unsafe.Pointer, n, stride int, acc unsafe.Pointer)
//
// Sixteen x rows (stride floats apart) against one weight row over n
// elements, starting on a scale block: each widened weight vector feeds
// sixteen FMAs, which makes a verify block's products cheaper per output
// than the bfloat16 kernel's. The sum of x row s continues from, and goes
// back to, acc + 256·s (rows of [4][16]float32), so that callers can walk
// k in chunks whose sixteen x rows stay in L1 for all four weight rows.
TEXT ·fp8Dot1x16(SB), NOSPLIT, $0-48
	MOVQ p0+0(FP), R8
	MOVQ sp+8(FP), DX
	MOVQ x+16(FP), SI
	MOVQ n+24(FP), CX
	MOVQ stride+32(FP), DI
	SHLQ $2, DI
	LEAQ (DI)(DI*2), R11
	MOVQ acc+40(FP), R9
	VMOVUPS 0(R9), Z0
	VMOVUPS 256(R9), Z1
	VMOVUPS 512(R9), Z2
	VMOVUPS 768(R9), Z3
	VMOVUPS 1024(R9), Z4
	VMOVUPS 1280(R9), Z5
	VMOVUPS 1536(R9), Z6
	VMOVUPS 1792(R9), Z7
	VMOVUPS 2048(R9), Z8
	VMOVUPS 2304(R9), Z9
	VMOVUPS 2560(R9), Z10
	VMOVUPS 2816(R9), Z11
	VMOVUPS 3072(R9), Z12
	VMOVUPS 3328(R9), Z13
	VMOVUPS 3584(R9), Z14
	VMOVUPS 3840(R9), Z15
	MOVL $0xBFFFBFFF, BX // clears bit 14: the sign's copy that the shift leaves there
	VPBROADCASTD BX, Y25
	MOVL $0x43800000, BX // 256.0: half's exponent bias is 8 above E4M3's
	VPBROADCASTD BX, Z26
	XORQ AX, AX
	TESTQ CX, CX
	JZ done16

block16:
	VBROADCASTSS (DX), Z24
	VMULPS Z26, Z24, Z24
	ADDQ $4, DX
	LEAQ 128(AX), BX
	CMPQ BX, CX
	CMOVQGT CX, BX

loop16:
	LEAQ (SI)(DI*4), R12
	LEAQ (R12)(DI*4), R13
	LEAQ (R13)(DI*4), R14
	VPMOVSXBW (R8)(AX*1), Y16
	VPSLLW $7, Y16, Y16
	VPANDD Y25, Y16, Y16
	VCVTPH2PS Y16, Z16
	VMULPS Z24, Z16, Z16
	VFMADD231PS (SI), Z16, Z0
	VFMADD231PS (SI)(DI*1), Z16, Z1
	VFMADD231PS (SI)(DI*2), Z16, Z2
	VFMADD231PS (SI)(R11*1), Z16, Z3
	VFMADD231PS (R12), Z16, Z4
	VFMADD231PS (R12)(DI*1), Z16, Z5
	VFMADD231PS (R12)(DI*2), Z16, Z6
	VFMADD231PS (R12)(R11*1), Z16, Z7
	VFMADD231PS (R13), Z16, Z8
	VFMADD231PS (R13)(DI*1), Z16, Z9
	VFMADD231PS (R13)(DI*2), Z16, Z10
	VFMADD231PS (R13)(R11*1), Z16, Z11
	VFMADD231PS (R14), Z16, Z12
	VFMADD231PS (R14)(DI*1), Z16, Z13
	VFMADD231PS (R14)(DI*2), Z16, Z14
	VFMADD231PS (R14)(R11*1), Z16, Z15
	ADDQ $64, SI
	ADDQ $16, AX
	CMPQ AX, BX
	JLT loop16
	CMPQ AX, CX
	JLT block16

done16:
	MOVQ acc+40(FP), DI
	VMOVUPS Z0, 0(DI)
	VMOVUPS Z1, 256(DI)
	VMOVUPS Z2, 512(DI)
	VMOVUPS Z3, 768(DI)
	VMOVUPS Z4, 1024(DI)
	VMOVUPS Z5, 1280(DI)
	VMOVUPS Z6, 1536(DI)
	VMOVUPS Z7, 1792(DI)
	VMOVUPS Z8, 2048(DI)
	VMOVUPS Z9, 2304(DI)
	VMOVUPS Z10, 2560(DI)
	VMOVUPS Z11, 2816(DI)
	VMOVUPS Z12, 3072(DI)
	VMOVUPS Z13, 3328(DI)
	VMOVUPS Z14, 3584(DI)
	VMOVUPS Z15, 3840(DI)
	VZEROUPPER
	RET
