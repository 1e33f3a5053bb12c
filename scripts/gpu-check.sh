#!/usr/bin/env bash
# gpu-check: the CUDA backend's one prepared GPU run (well under 5 minutes).
#
# It runs the cuda-tagged tests of kernels/cuda on the first GPU: the
# kernels.Backend conformance suite (kernels/kerneltest) and MatMul at model
# widths against the CPU backend, CUDA graph replay, whole-model logits of
# the tiny and small presets against the CPU backend, greedy speculative
# decoding (DFlash linear, DDTree 8 and 16) against the CPU backend, NCCL
# collectives and tensor parallelism over the GPUs there (when libnccl.so.2
# is found; TP 2/4/8 as the GPU count allows), and the
# step-time benchmark (decode and verify at budgets 8/16/32/64 through one
# attention and one GDN layer with their MLPs at Qwen3.6-27B shapes, against
# the HBM bandwidth floor). It prints a short table last.
#
# The GPU machine needs the NVIDIA driver (libcuda.so.1) and, for the
# cuBLASLt path of MatMul, libcublasLt (searched in the usual CUDA and pip
# locations below). It needs no Go: the tests run from a prebuilt binary.
# On the build machine:
#     make gpu-check-bin          # bin/gpu-check/cuda.test (bin/ is git-ignored)
# then on the GPU machine, from the repository root (with the device tool:
# run command "bash scripts/gpu-check.sh", carry ["bin/gpu-check"]):
#     bash scripts/gpu-check.sh
# Where Go is installed and the binary is missing, the script builds it.
# Logs and the step-time table go to $OUT (default /tmp/gpu-check).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu-check}
mkdir -p "$out"
bin=$PWD/bin/gpu-check/cuda.test

if [ ! -x "$bin" ]; then
	if command -v go >/dev/null 2>&1; then
		make gpu-check-bin || exit 1
	else
		echo "gpu-check: $bin is missing and there is no Go here: run 'make gpu-check-bin' where Go is and carry bin/gpu-check" >&2
		exit 1
	fi
fi

# cuBLASLt: add its folder to the loader path when the loader cannot find it.
cublas="found by the loader"
if ! ldconfig -p 2>/dev/null | grep -q 'libcublasLt\.so'; then
	cublas="not found: MatMul uses its own kernel at every size"
	for d in /usr/local/cuda/lib64 /usr/local/cuda-*/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
		/opt/*/.venv/lib/python3*/site-packages/nvidia/cu13/lib \
		/opt/*/.venv/lib/python3*/site-packages/nvidia/cublas/lib \
		/usr/local/lib/python3*/dist-packages/nvidia/cublas/lib \
		/usr/lib/python3/dist-packages/nvidia/cublas/lib; do
		if ls "$d"/libcublasLt.so* >/dev/null 2>&1; then
			export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
			cublas=$d
			break
		fi
	done
fi
echo "libcublasLt: $cublas"

# NCCL (tensor parallelism): TestTensorParallel runs when libnccl.so.2 is
# found; on one GPU it checks the binding with a one-rank communicator.
nccl=""
if ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2'; then
	nccl="found by the loader"
else
	for d in /usr/local/cuda/lib64 /usr/local/cuda-*/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
		/opt/*/.venv/lib/python3*/site-packages/nvidia/nccl/lib \
		/usr/local/lib/python3*/dist-packages/nvidia/nccl/lib \
		/usr/lib/python3/dist-packages/nvidia/nccl/lib; do
		if [ -e "$d/libnccl.so.2" ]; then
			export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
			nccl=$d
			break
		fi
	done
fi
tests='TestConformance|TestMatMulAgainstCPU|TestGraphReplay|TestModelLogits|TestSpecGeneration'
if [ -n "$nccl" ]; then
	tests="$tests|TestTensorParallel"
	echo "libnccl.so.2: $nccl"
else
	echo "libnccl.so.2: not found: tensor parallelism not checked"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv,noheader 2>&1 | tee "$out/gpu.txt"

cd kernels/cuda # the tests' package folder, as go test runs them
start=$(date +%s)
timeout 180 "$bin" -test.v -test.timeout 170s \
	-test.run "$tests" \
	>"$out/conformance.log" 2>&1
conformance=$?
DDFLASH_STEP_TABLE="$out/steptime.txt" timeout 100 "$bin" -test.v -test.timeout 90s -test.run 'TestStepTime' \
	>"$out/steptime.log" 2>&1
steptime=$?
tail -n 40 "$out/conformance.log"
tail -n 5 "$out/steptime.log"

echo
echo "== gpu-check ($(($(date +%s) - start)) s; logs in $out) =="
printf '%-40s %s\n' "test" "result"
grep -E '^\s*--- (PASS|FAIL|SKIP)' "$out/conformance.log" "$out/steptime.log" -h |
	awk '{ res=$2; sub(/:$/, "", res); depth=(match($0, /[^ ]/)-1)/4
		if (depth == 0 || res != "PASS") printf "%-40s %s %s\n", substr("        ", 1, 2*depth) $3, res, $4 }'
[ "$conformance" -ne 0 ] && echo "conformance run exited with $conformance (see $out/conformance.log)"
[ "$steptime" -ne 0 ] && echo "step-time run exited with $steptime (see $out/steptime.log)"
cat "$out/steptime.txt" 2>/dev/null || echo "no step-time table"
[ "$conformance" -eq 0 ] && [ "$steptime" -eq 0 ]
