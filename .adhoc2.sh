set -u
tar -xJf .gpu.tar.xz
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-} ATTNHOST_TEST_PLUGIN_DIR=$PWD/.gpu/lib/attnhost/plugins
A=.gpu/bin/attnhost
C="$A compare allgather --timing-method adaptive --warmup-runs 20 --no-check --quiet --format console --force"
row() { grep -A2 "^plugin (ws=$1)" | tail -1; }
KERNELS_CASE="allgather --config medium" OUT=$OUT bash scripts/device/checks.sh kernels 2>&1 | tail -8
for hg in 4 8 6 12 4 8; do echo "== medium keys hg=$hg"; timeout 120 $C --config medium --world-sizes 2 --param head_groups=$hg 2>&1 | row 2; done
echo "== medium rows"; timeout 120 $C --config medium --world-sizes 2 --param backward=rows 2>&1 | row 2
for cfg in medium_window large_window; do for b in keys rows; do echo "== $cfg $b"; timeout 120 $C --config $cfg --world-sizes 2 --param backward=$b 2>&1 | row 2; done; done
echo "== large ws1 keys"; timeout 150 $C --config large --world-sizes 1 2>&1 | row 1
ls -la $OUT
