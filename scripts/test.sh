#!/usr/bin/env bash
# Sets up, builds everything (CUDA code too when nvcc is found) and runs the tests. On a machine
# with a GPU the GPU tests (CTest label gpu) run as well.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-debian.sh
cmake --preset default
cmake --build --preset default
if command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1; then
  ctest --test-dir build --output-on-failure
else
  ctest --preset default
fi
