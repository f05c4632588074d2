#!/usr/bin/env bash
# Sets up, builds and runs the quick suite: on the GPU when there is one, else on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-debian.sh
cmake --preset default
cmake --build --preset default
exec build/bin/attnhost run quick "$@"
