#!/usr/bin/env bash
# Compiles the CUDA kernels (kernels/*.cu) to PTX with clang, into
# ptx/<arch>/<name>.ptx, which the Go package embeds. No CUDA toolkit is
# needed: clang emits PTX by itself, and the driver compiles that PTX for the
# GPU it runs on (sm_80 PTX serves Ampere, sm_89 PTX Ada, sm_90 PTX Hopper
# and newer). Machine code (cubin/fatbin with SASS) would need NVIDIA's ptxas.
#
#   gen.sh          regenerate ptx/ (make cuda)
#   gen.sh check    fail unless every kernel compiles, the committed PTX is
#                   exactly what this clang produces, and the kernels' math
#                   (kernels/math.cuh) matches libm on the host (make test, CI)
set -euo pipefail
cd "$(dirname "$0")"
CLANG=${CLANG:-clang-16}
if ! command -v "$CLANG" >/dev/null 2>&1; then
	echo "kernels/cuda/gen.sh: $CLANG not found (scripts/deps.sh installs it; or set CLANG)" >&2
	exit 1
fi
# arch:PTX ISA version. Without a CUDA install clang must be told the PTX
# version; these are the lowest that support each arch (CUDA 11.0 and 11.8
# drivers). sm_89 (Ada) has its own PTX for the hardware E4M3 conversion.
archs="sm_80:ptx70 sm_89:ptx78 sm_90:ptx78"

out=ptx
if [ "${1:-}" = check ]; then
	out=$(mktemp -d)
	trap 'rm -rf "$out"' EXIT
fi
for a in $archs; do
	arch=${a%%:*} isa=${a##*:}
	mkdir -p "$out/$arch"
	for src in kernels/*.cu; do
		name=$(basename "$src" .cu)
		"$CLANG" -x cuda --cuda-device-only --cuda-gpu-arch="$arch" -nocudainc -nocudalib \
			-Xclang -target-feature -Xclang "+$isa" -O3 -Wall -Werror -S \
			-o "$out/$arch/$name.ptx" "$src"
	done
done
if [ "${1:-}" = check ]; then
	"$CLANG" -x c++ -O2 -o "$out/mathcheck" kernels/mathcheck.cc -lm
	"$out/mathcheck"
	rm "$out/mathcheck"
	if ! diff -r ptx "$out" >/dev/null; then
		diff -r ptx "$out" | head -20 >&2
		echo "kernels/cuda/ptx is stale: run 'make cuda' and commit the result" >&2
		exit 1
	fi
	echo "kernels/cuda: every kernel compiles; the embedded PTX is current"
fi
