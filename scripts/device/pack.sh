#!/usr/bin/env bash
# Builds for Hopper only (sm_90a) in build-gpu/, installs into .gpu/ and packs it with the test
# binaries into .gpu.tar.xz (the device tool carries at most 64 MiB; the fatbins compress well).
#   scripts/device/pack.sh            then carry [".gpu.tar.xz"] and run scripts/device/checks.sh there
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a > /dev/null
cmake --build build-gpu -j"$(nproc)"
rm -rf .gpu && cmake --install build-gpu --prefix .gpu > /dev/null
# The striped example, built out of tree against the install as a plugin author would; beside the
# library (lib/attnhost/striped/), so that its RPATH $ORIGIN/.. finds libattncore there too:
#   attnhost verify striped --plugin .gpu/lib/attnhost/striped/libstriped.so
cmake -S examples/striped -B build-gpu/striped -G Ninja -DCMAKE_PREFIX_PATH="$PWD/.gpu" \
  -DCMAKE_BUILD_RPATH='$ORIGIN/..' > /dev/null
cmake --build build-gpu/striped > /dev/null
mkdir -p .gpu/lib/attnhost/striped && cp build-gpu/striped/libstriped.so .gpu/lib/attnhost/striped/
mkdir -p .gpu/tests
cp build-gpu/bin/attnhost_*_tests build-gpu/bin/test_core_* .gpu/tests/ 2>/dev/null || true
[ -x build-gpu/bin/bench_core ] && cp build-gpu/bin/bench_core .gpu/tests/
cp -r tests/integration/two_ranks.toml .gpu/tests/
mkdir -p .gpu/peers && cp ../shared/peers/*.py .gpu/peers/
# The CUPTI timeline of a run (checks.sh kernels): an injection library the CUDA driver loads.
cuda=$(dirname "$(dirname "$(command -v nvcc)")")
g++ -O2 -shared -fPIC -std=c++17 scripts/device/kernel_trace.cpp -I"$cuda/include" -L"$cuda/lib64" -lcupti \
  -o .gpu/tests/kernel_trace.so
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
for d in /.gpu/ /.gpu.tar.xz /.gpu-base.tar.xz /base/ /build-gpu/; do grep -qxF "$d" "$exclude" 2>/dev/null || echo "$d" >> "$exclude"; done
tar -cJf .gpu.tar.xz .gpu
echo "pack: .gpu.tar.xz $(du -m .gpu.tar.xz | cut -f1) MiB (unpacked $(du -sm .gpu | cut -f1) MiB)"
