#!/usr/bin/env bash
# Installs what tools/train and tools/reference need (sourced by fixtures.sh and train-demo.sh):
# Debian's torch and numpy; OpenBLAS (it replaces the reference libblas.so.3, 10-25x faster
# matmuls); the regex module (the tokenizer's \p{...} classes); the King James Bible text.
packages=(python3-torch python3-numpy python3-regex libopenblas0-pthread bible-kjv)
missing=()
for package in "${packages[@]}"; do
	dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if ((${#missing[@]})); then
	sudo=""
	[ "$(id -u)" -eq 0 ] || sudo=sudo
	$sudo apt-get update
	$sudo apt-get install -y --no-install-recommends "${missing[@]}"
fi
echo "BLAS: $(update-alternatives --query libblas.so.3-x86_64-linux-gnu | sed -n 's/^Value: //p')"
