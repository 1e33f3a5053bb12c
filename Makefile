# ddflash build and test entry points. `make run` and `make test` do all set-up.
GO ?= go
export GOFLAGS ?= -trimpath
# The CPU backend's AVX-512 kernels need Go's SIMD experiment; they check the
# CPU at run time and fall back to the portable kernels, which test-portable
# keeps covered.
export GOEXPERIMENT ?= simd
# go-nvml's vendored nvml.h marks many functions deprecated; keep cgo builds quiet.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

.PHONY: all build run test test-portable deps vet fmt-check bench fixtures

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

test: deps build vet fmt-check test-portable
	$(GO) test -timeout 20m ./...

# The kernels once more without the SIMD experiment: the portable twins.
test-portable:
	GOEXPERIMENT= $(GO) test -timeout 10m ./kernels/... ./engine/

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

bench:
	$(GO) test -run '^$$' -bench . -benchtime 3x ./...

# fixtures retrains the default pair and regenerates the float64 goldens from
# scratch (Debian python3-torch, CPU only; about an hour on 2 cores).
fixtures:
	bash scripts/fixtures.sh
