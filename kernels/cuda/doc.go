// Package cuda is the CUDA backend: a thin Go layer over the CUDA driver
// API and cuBLASLt, both loaded at run time with dlopen, running kernels
// written in CUDA C++ (kernels/*.cu) that are compiled to PTX by clang
// (gen.sh, `make cuda`) and embedded in the binary (ptx/).
//
// Building needs neither CUDA headers nor libraries: a machine without an
// NVIDIA driver builds and vets everything, and New then reports which
// library is missing. The driver JIT-compiles the embedded PTX for the GPU
// at New (sm_80 PTX for Ampere, sm_89 for Ada, sm_90 for Hopper and newer).
//
// Semantics follow the CPU reference backend (kernels/cpu) op by op;
// kernels/kerneltest is the conformance suite, run against this backend by
// the tests under the build tag cuda (scripts/gpu-check.sh). Activations are
// F32; KV caches and GDN states F32 or BF16 (widened in registers, rounded
// to nearest even on store). MatMul keeps F32 accuracy: decode-sized matmuls (up to
// gemvMaxRows rows) run a kernel that widens BF16/F16/F32 weights exactly
// and accumulates in F32; larger ones with BF16 weights run on cuBLASLt's
// bf16 tensor cores with each F32 activation split into two bf16 terms
// (three when k < 64), whose products with the weights are exact and whose
// residual stays below the F32 accumulation error: the same tolerance as
// the CPU backend, at two (or three) times the tensor-core work of a plain
// bf16 GEMM. (Rounding the activations to bf16 alone would be hundreds of
// times less accurate.)
//
// Without a GPU, the tests still run the whole backend: emu/ is a
// stand-in libcuda and libcublasLt that runs the kernels, compiled as C++,
// on the CPU (TestEmulator), so CI checks every kernel's logic against the
// conformance suite and whole models against the CPU backend.
//
// Ops are queued on one stream per Backend and run asynchronously; the
// Download calls and Sync wait. An op that fails at launch, or a kernel
// that traps on an out-of-range index (the CPU backend panics there), is
// reported by the next Sync or Download. BeginCapture, EndCapture and
// Launch record a sequence of ops as a CUDA graph and replay it.
//
// Tensor-parallel ranks on several GPUs meet in NCCL (nccl.go, libnccl.so.2
// loaded with dlopen like the rest): Connect makes one communicator per
// engine, and the collectives are queued on each rank's stream like any op.
package cuda
