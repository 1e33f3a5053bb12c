#!/usr/bin/env bash
# Installs everything the tests need on a fresh Debian machine. Idempotent:
# each step checks before it installs. Sections are owned by the features that need them.
set -euo pipefail
cd "$(dirname "$0")/.."

# Go modules.
go mod download

# tmux (owner: plan/tune): cmd/ddflash/tune_test.go drives `ddflash tune` in a
# detached tmux session and reads the screen back.
if ! command -v tmux >/dev/null 2>&1; then
	as_root=""
	if [ "$(id -u)" -ne 0 ]; then as_root="sudo"; fi
	$as_root apt-get update -qq
	$as_root apt-get install -y -qq tmux
fi
