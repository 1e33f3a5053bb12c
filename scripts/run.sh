#!/usr/bin/env bash
# The README's main job. For now: generate from a tiny random test model.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
bin/ddflash testmodel --out "$dir/tiny" --preset tiny --seed 1
bin/ddflash generate --model "$dir/tiny" --tokens 1,2,3 --max-tokens 16 --json
