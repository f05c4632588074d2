set -u
tar -xJf .gpu.tar.xz; mkdir -p base && tar -xJf .gpu-base.tar.xz -C base
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
row() { grep -A2 "^plugin (ws=$1)" | tail -1; }
cmp() { local dir=$1; shift; ATTNHOST_TEST_PLUGIN_DIR=$dir/lib/attnhost/plugins timeout 150 $dir/bin/attnhost compare allgather --timing-method adaptive --warmup-runs 20 --no-check --quiet --format console --force "$@" 2>&1 | row 2; }
for i in 1 2 3; do echo "== medium new"; cmp .gpu --config medium --world-sizes 2; echo "== medium base"; cmp base/.gpu --config medium --world-sizes 2; done
for i in 1 2; do echo "== large new"; cmp .gpu --config large --world-sizes 2; echo "== large base"; cmp base/.gpu --config large --world-sizes 2; done
export ATTNHOST_TEST_PLUGIN_DIR=$PWD/.gpu/lib/attnhost/plugins
echo "== verify"; timeout 200 .gpu/bin/attnhost verify allgather --quiet 2>&1 | tail -2
KERNELS_CASE="allgather --config medium" OUT=$OUT bash scripts/device/checks.sh kernels 2>&1 | grep -A2 "^plugin"
