set -u
tar -xJf .gpu.tar.xz
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-} ATTNHOST_TEST_PLUGIN_DIR=$PWD/.gpu/lib/attnhost/plugins
A=.gpu/bin/attnhost
row() { grep -A2 "^plugin (ws=$1)" | tail -1; }
cmp() { timeout 150 $A compare allgather --timing-method adaptive --warmup-runs 20 --no-check --quiet --format console --force "$@" 2>&1 | row 2; }
on=0; off=0
for i in 1 2 3; do for t in on off; do
  l=$(cmp --config medium --world-sizes 2 --param taper=$t); echo "== medium taper $t"; echo "$l"
  v=$(echo "$l" | awk '{print $6}'); if [ $t = on ]; then on=$(awk "BEGIN{print $on + $v}"); else off=$(awk "BEGIN{print $off + $v}"); fi
done; done
for i in 1 2; do for t in on off; do echo "== large taper $t"; cmp --config large --world-sizes 2 --param taper=$t; done; done
best=$(awk "BEGIN{print ($off < $on) ? \"off\" : \"on\"}"); echo "== medium sums on $on off $off: taper=$best"
for p in medium large; do
  echo "=== strategies $p taper=$best"
  timeout 250 $A compare allgather --config $p --world-sizes 1,2 --param taper=$best --timing-method adaptive --warmup-runs 20 --quiet --format console,json --out $OUT/strategies_$p 2>&1 | grep -A3 "^plugin"
done
timeout 300 python3 -m torch.distributed.run --nproc_per_node=2 .gpu/peers/torch_cp.py --out $OUT/torch_cp2.json 4,24,8192,128,1 4,32,16384,128,1 2>&1 | tail -4
for p in medium_window large_window; do echo "=== $p"; timeout 150 $A compare allgather --config $p --world-sizes 1,2 --param taper=$best --timing-method adaptive --warmup-runs 20 --no-check --quiet --format console --force 2>&1 | grep -A2 "^plugin" ; done
