set -u
tar -xJf .gpu.tar.xz
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-} ATTNHOST_TEST_PLUGIN_DIR=$PWD/.gpu/lib/attnhost/plugins
row() { grep -A2 "^plugin (ws=$1)" | tail -1; }
cmp() { timeout 150 .gpu/bin/attnhost compare allgather --timing-method adaptive --warmup-runs 20 --no-check --quiet --format console --force "$@" 2>&1 | row 2; }
for i in 1 2 3; do for t in on off; do echo "== medium taper $t"; cmp --config medium --world-sizes 2 --param taper=$t; done; done
for i in 1 2; do for t in on off; do echo "== large taper $t"; cmp --config large --world-sizes 2 --param taper=$t; done; done
echo "== verify"; timeout 200 .gpu/bin/attnhost verify allgather --quiet 2>&1 | tail -1
echo "== gpu tests"; timeout 300 .gpu/tests/attnhost_plugin_tests -ts=gpu -tc="*allgather*" 2>&1 | tail -3
KERNELS_CASE="allgather --config medium" OUT=$OUT bash scripts/device/checks.sh kernels 2>&1 | grep -A2 "^plugin"
