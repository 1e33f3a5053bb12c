# ddflash build and test entry points. `make run` and `make test` do all set-up.
GO ?= go
export GOFLAGS ?= -trimpath
# The CPU backend's AVX-512 and AVX2 kernels need Go's SIMD experiment; they check the
# CPU at run time and fall back to the portable kernels, which test-portable
# keeps covered.
export GOEXPERIMENT ?= simd
# go-nvml's vendored nvml.h marks many functions deprecated; keep cgo builds quiet.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

.PHONY: all build run test test-portable deps vet fmt-check bench fixtures cuda cuda-check gpu-check-bin

all: build

# The commit goes into every benchmark record (this workplace builds with -buildvcs=false).
build:
	$(GO) build -ldflags "-X ddflash/bench.Commit=$$(git rev-parse HEAD 2>/dev/null)" -o bin/ddflash ./cmd/ddflash

# deps installs what the tests need on a fresh machine (system packages, npm
# oracles, Go modules). Each step is idempotent.
deps:
	bash scripts/deps.sh

run: build
	bash scripts/run.sh

test: deps build vet fmt-check cuda-check test-portable
	$(GO) test -timeout 20m ./...

# The kernels once more without the SIMD experiment: the portable twins
# (-short: the long-context test runs once, in the SIMD pass).
test-portable:
	GOEXPERIMENT= $(GO) test -short -timeout 10m ./kernels/cpu/ ./engine/

# vet runs without -trimpath: with it, a cgo package's cached output can name the
# source folder of an earlier build of the same files (another clone or worktree),
# and vet fails opening files there once that folder is gone.
vet:
	GOFLAGS= $(GO) vet ./...
	GOFLAGS= $(GO) vet -tags cuda ./kernels/cuda/...

# cuda compiles the CUDA kernels (kernels/cuda/kernels/*.cu) to the PTX that
# kernels/cuda embeds, with clang (no CUDA toolkit needed); commit the result.
cuda:
	bash kernels/cuda/gen.sh

# cuda-check fails when a kernel does not compile, when the committed PTX is
# not what `make cuda` produces, or when the kernels' math drifts from libm.
cuda-check:
	bash kernels/cuda/gen.sh check

# gpu-check-bin builds the CUDA conformance and step-time tests into
# bin/gpu-check, for scripts/gpu-check.sh on a GPU machine without Go.
gpu-check-bin:
	$(GO) test -c -tags cuda -o bin/gpu-check/cuda.test ./kernels/cuda

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

bench:
	$(GO) test -run '^$$' -bench . -benchtime 3x ./...

# fixtures retrains the default pair and regenerates the float64 goldens from
# scratch (Debian python3-torch, CPU only; about an hour on 2 cores).
fixtures:
	bash scripts/fixtures.sh
