set -u
tar -xJf .gpu.tar.xz
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-} ATTNHOST_TEST_PLUGIN_DIR=$PWD/.gpu/lib/attnhost/plugins
A=.gpu/bin/attnhost
echo "== verify keys (auto)"; timeout 200 $A verify allgather --quiet 2>&1 | tail -12
echo "== verify rows"; timeout 200 $A verify allgather --param backward=rows --quiet 2>&1 | tail -4
C="$A compare allgather --timing-method adaptive --warmup-runs 20 --no-check --quiet --format console --force"
row() { grep -A2 "^plugin (ws=$1)" | tail -1; }
for i in 1 2; do for b in keys rows; do echo "== medium $b"; timeout 120 $C --config medium --world-sizes 2 --param backward=$b 2>&1 | row 2; done; done
for b in keys rows; do echo "== large $b"; timeout 150 $C --config large --world-sizes 2 --param backward=$b 2>&1 | row 2; done
for b in keys rows; do echo "== medium ws1 $b"; timeout 120 $C --config medium --world-sizes 1 --param backward=$b 2>&1 | row 1; done
echo "== tests"
timeout 300 .gpu/tests/test_core_engine 2>&1 | tail -4
timeout 400 .gpu/tests/attnhost_plugin_tests -ts=gpu 2>&1 | tail -15
