#!/usr/bin/env bash
# Installs everything the tests need on a fresh Debian machine. Idempotent:
# each step checks before it installs. Sections are owned by the features that need them.
set -euo pipefail
cd "$(dirname "$0")/.."

# Go modules.
go mod download
