#!/usr/bin/env bash
# Runs on the GPU machine (device tool), in the repository's copy, with .gpu.tar.xz carried:
#   scripts/device/checks.sh SECTION...   sections: info tests plugins verify shared mpi quick perf scaling suite
#                                         cp strategies peers fp8 striped ab ab2 exchange builds kernels
# Every command has its own time limit so one hang cannot eat the call; logs go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
[ -d .gpu ] || tar -xJf .gpu.tar.xz
A=$PWD/.gpu/bin/attnhost
export ATTNHOST_TEST_PLUGIN_DIR=$PWD/.gpu/lib/attnhost/plugins
gpus=$(nvidia-smi -L | wc -l)
step() { echo; echo "=== $1 ($(date +%T))"; }
run() { local limit=$1; shift; timeout "$limit" "$@"; local rc=$?; [ $rc -eq 0 ] || echo "!!! rc=$rc: $*"; return 0; }

for section in "$@"; do
  case $section in
    info)
      step info
      nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv
      run 60 "$A" info ;;
    tests)
      step "GPU tests"
      run 300 .gpu/tests/test_core_gpu
      for t in test_core_engine test_core_cudnn; do [ -x .gpu/tests/$t ] && run 300 .gpu/tests/$t; done
      run 300 .gpu/tests/attnhost_host_tests -ts=gpu
      run 300 .gpu/tests/attnhost_plugin_tests -ts=gpu ;;
    verify)
      step "verify ${VERIFY:-ring zigzag} ${VERIFY_ARGS:-} (world sizes 1..$gpus)"
      run 400 "$A" verify ${VERIFY:-ring zigzag} ${VERIFY_ARGS:-} --quiet ;;
    shared)
      step "every distributed plugin at world sizes 1..$((4 * gpus)), four ranks sharing each GPU (checks, not timings)"
      run 400 "$A" verify ring zigzag ulysses usp allgather varlen dilated blocksparse --ranks-per-gpu 4 --quiet
      run 200 "$A" verify striped --plugin .gpu/lib/attnhost/striped/libstriped.so --ranks-per-gpu 4 --quiet
      run 200 "$A" verify ring zigzag --dtype fp8_e4m3 --ranks-per-gpu 2 --quiet ;;
    mpi)
      step "the example plugin's two-rank suite: threads + NCCL, then mpirun -np 2 (NCCL id over MPI)"
      run 200 "$A" run .gpu/tests/two_ranks.toml --device cuda --quiet --format console
      run 200 mpirun --allow-run-as-root --oversubscribe -np 2 -x NCCL_NVLS_ENABLE "$A" run .gpu/tests/two_ranks.toml --device cuda --quiet --format console ;;
    quick)
      step "the quick suite"
      run 300 "$A" run quick --quiet --out "$OUT/quick" ;;
    perf)
      step "ring vs zigzag, world sizes 1 and 2"
      run 900 "$A" run .gpu/share/attnhost/configs/suites/ring_vs_zigzag.toml ${PERF_ARGS:-} --out "$OUT/ring_vs_zigzag" --format console,json,csv,markdown
      ;;
    scaling)
      step "scaling study: ring and zigzag at world sizes 1..$gpus (unchecked: verify covers correctness)"
      run ${SCALING_LIMIT:-300} "$A" run .gpu/share/attnhost/configs/suites/scaling_gpus.toml --no-check --out "$OUT/scaling" --format console,json,csv,markdown
      if [ "$gpus" -ge 4 ]; then
        step "PyTorch context parallel ($gpus GPUs)"
        run 200 python3 -m torch.distributed.run --nproc_per_node=$gpus .gpu/peers/torch_cp.py --out "$OUT/torch_cp$gpus.json" \
          4,24,32768,128,1 1,32,131072,128,1
      fi ;;
    plugins)
      step "the plugins' GPU tests"
      run 300 .gpu/tests/attnhost_plugin_tests -ts=gpu ${PLUGIN_TESTS:+-tc="$PLUGIN_TESTS"} ;;
    cp)
      # The whole suite at world sizes 1 and 2 takes longer than one 600 s call on two H200s: split it
      # by preset, each part with the PyTorch shapes it is compared with, e.g.
      #   CP_ARGS="--case medium --case large" CP_PEERS="4,24,8192,128,1 4,32,16384,128,1"
      #   CP_ARGS="--case large_seq --case large_full" CP_PEERS="4,24,32768,128,1 4,32,16384,128,0"
      ws=${CP_WS:-1,2}; n=${ws##*,}
      step "context-parallel strategies at world sizes $ws"
      run ${CP_LIMIT:-400} "$A" run .gpu/share/attnhost/configs/suites/cp_strategies.toml --world-sizes "$ws" ${CP_ARGS:-} \
        --out "$OUT/cp$n" --format console,json,csv,markdown --quiet
      step "PyTorch context parallel ($n GPUs), the same problems"
      run 300 python3 -m torch.distributed.run --nproc_per_node="$n" .gpu/peers/torch_cp.py --out "$OUT/torch_cp$n.json" \
        ${CP_PEERS:-4,24,8192,128,1 4,32,16384,128,1 4,24,32768,128,1 4,32,16384,128,0} ;;
    strategies)
      # PERFORMANCE.md's two-GPU command (a): the strategies side by side at world sizes 1 and all
      # GPUs, adaptive after 20 warm-ups, then PyTorch's context parallelism on the same shapes.
      ws="1,$gpus"
      declare -A shape=([medium]=4,24,8192,128,1 [large]=4,32,16384,128,1 [large_seq]=4,24,32768,128,1)
      peers=""
      for p in ${STRATEGY_PRESETS:-medium large}; do
        step "compare ${STRATEGIES:-zigzag ulysses allgather} --config $p, world sizes $ws"
        run 250 "$A" compare ${STRATEGIES:-zigzag ulysses allgather} --config "$p" --world-sizes "$ws" \
          --timing-method adaptive --warmup-runs 20 --quiet --format console,json --out "$OUT/strategies_$p"
        peers+=" ${shape[$p]}"
      done
      step "PyTorch context parallel ($gpus GPUs), the same shapes"
      run 300 python3 -m torch.distributed.run --nproc_per_node="$gpus" .gpu/peers/torch_cp.py \
        --out "$OUT/torch_cp$gpus.json" $peers ;;
    suite)
      step "suite ${SUITE}"
      run ${SUITE_LIMIT:-300} "$A" run .gpu/share/attnhost/configs/suites/${SUITE}.toml ${SUITE_ARGS:-} --out "$OUT/${SUITE}" --format console,json,csv,markdown ;;
    peers)
      step "PyTorch SDPA (one GPU)"
      run 300 python3 .gpu/peers/torch_sdpa.py --out "$OUT/torch_sdpa.json" 4,32,32,16384,128,1 4,32,32,16384,128,0
      if [ "$gpus" -ge 2 ]; then
        step "PyTorch context parallel (2 GPUs)"
        run 400 python3 -m torch.distributed.run --nproc_per_node=2 .gpu/peers/torch_cp.py --out "$OUT/torch_cp.json" \
          4,24,8192,128,1 4,32,16384,128,1 4,24,32768,128,1 4,32,16384,128,0
      fi ;;
    fp8)
      ws=$(seq -s, 1 "$gpus")
      step "FP8 e4m3 against bf16 through ring and zigzag, world sizes $ws (float64 check, amax)"
      for dt in fp8_e4m3 bf16; do
        run 400 "$A" compare ring zigzag --config ${FP8_CONFIG:-large} --dtype $dt --world-sizes "$ws" \
          --out "$OUT/fp8_$dt" --format console,json
      done ;;
    striped)
      ws=$(seq -s, 1 "$gpus")
      P=$PWD/.gpu/lib/attnhost/striped/libstriped.so
      step "striped, built out of tree: verify and compare with zigzag, world sizes $ws"
      run 300 "$A" verify striped --plugin "$P" --quiet
      run 400 "$A" compare zigzag striped --plugin "$P" --config large --world-sizes "$ws" --out "$OUT/striped" \
        --format console,json,markdown ;;
    ab)
      # Each schedule choice against the setting that undoes it, alternating, same world size: the
      # forward's own batch slices (batch_slices=4 cuts both passes as before; 2, both passes in
      # calls of two entries, past the memory rule) and the tapered pipeline.
      step "A/B at world size $gpus (adaptive timing after 20 warm-ups, unchecked: verify covers correctness)"
      T="--world-sizes $gpus --timing-method adaptive --warmup-runs 20 --no-check --quiet --format console --force"
      for p in medium large; do
        for v in batch_slices=4 batch_slices=0 batch_slices=2 batch_slices=4 batch_slices=0 batch_slices=2; do
          echo "--- zigzag ring $p $v"; run 120 "$A" compare zigzag ring --config $p --param $v $T --out "$OUT/ab"
        done
      done
      for v in taper=off taper=on taper=off taper=on; do
        echo "--- ulysses usp medium $v"; run 120 "$A" compare ulysses usp --config medium --param $v $T --out "$OUT/ab"
      done ;;
    ab2)
      # GQA 16:1 at d64, where slices starved the backward's grid (auto now keeps it whole), and the
      # windowed ring with its calls on cuDNN against auto's choice.
      step "A/B at world size $gpus: GQA 16:1 slices, the windowed ring's engine"
      T="--world-sizes $gpus --timing-method adaptive --warmup-runs 20 --no-check --quiet --format console --force"
      G="--batch 2 --seqlen 16384 --heads 32 --kv-heads 2 --head-dim 64"
      for v in batch_slices=0 batch_slices=2 batch_slices=0 batch_slices=2; do
        echo "--- zigzag GQA 16:1 d64 $v"; run 120 "$A" compare zigzag --config medium $G --param $v $T --out "$OUT/ab"
      done
      for v in engine=auto engine=cudnn engine=auto engine=cudnn; do
        echo "--- ring zigzag medium_window $v"; run 120 "$A" compare ring zigzag --config medium_window --param $v $T --out "$OUT/ab"
      done ;;
    exchange)
      # The all-to-alls' blocks moved as they lie (copy engines, no pack kernels) against packed
      # messages, alternating, same world size: ulysses (timed at 00c2e59) and allgather.
      step "A/B at world size $gpus: exchange=auto against packed"
      T="--world-sizes $gpus --timing-method adaptive --warmup-runs 20 --no-check --quiet --format console --force"
      for p in medium large; do
        for v in auto packed auto packed; do
          echo "--- ulysses allgather $p exchange=$v"; run 150 "$A" compare ulysses allgather --config $p --param exchange=$v $T --out "$OUT/ab"
        done
      done
      # allgather's forward in fewer groups than its backward (auto) against the backward's count in both.
      for v in head_groups=0 head_groups=12 head_groups=0 head_groups=12; do
        echo "--- allgather medium $v"; run 150 "$A" compare allgather --config medium --param $v $T --out "$OUT/ab"
      done ;;
    builds)
      # This build against another, carried as .gpu-base.tar.xz (pack it first, then copy it there),
      # alternating, at world size BUILDS_WS (default: every GPU; a kernel change wants 1 too);
      # BUILDS_CASES holds compares separated by '|', e.g.
      #   BUILDS_WS=1 BUILDS_CASES="zigzag ring --config medium|ulysses allgather --config large" checks.sh builds
      [ -d base/.gpu ] || { mkdir -p base && tar -xJf .gpu-base.tar.xz -C base; }
      step "A/B at world size ${BUILDS_WS:-$gpus}: this build (new) against .gpu-base.tar.xz (base)"
      T="--world-sizes ${BUILDS_WS:-$gpus} --timing-method adaptive --warmup-runs 20 --no-check --quiet --format console --force"
      IFS='|' read -ra compares <<< "${BUILDS_CASES:-zigzag ring --config medium}"
      for c in "${compares[@]}"; do
        for round in 1 2; do
          for build in new base; do
            bin=$A; [ $build = base ] && bin=$PWD/base/.gpu/bin/attnhost
            echo "--- $build, round $round: $c"; run 150 "$bin" compare $c $T --out "$OUT/builds_$build"
          done
        done
      done ;;
    kernels)
      # Every kernel and copy of a short run, per GPU and stream (scripts/device/kernel_trace.cpp):
      # what fills the time between the trace's ranges. KERNELS_CASE picks the compare. The timeline
      # comes back as kernels.tsv.xz (two plugins' runs pass the 16 MiB a file the device tool
      # returns), which scripts/device/kernel_gaps.py reads as it is. Five warm-ups and no sustained
      # second (compare's GPU default), which would put a few hundred more passes in the file.
      step "kernel timelines at world size $gpus: ${KERNELS_CASE:-zigzag ulysses --config medium}"
      CUDA_INJECTION64_PATH=$PWD/.gpu/tests/kernel_trace.so KERNEL_TRACE_OUT="$OUT/kernels.tsv" \
        run 200 "$A" compare ${KERNELS_CASE:-zigzag ulysses --config medium} --world-sizes "$gpus" \
        --timing-method adaptive --warmup-runs 5 --warmup-seconds 0 --no-check --quiet --format console,trace --force --out "$OUT/kernels"
      [ -f "$OUT/kernels.tsv" ] && xz -T0 -f "$OUT/kernels.tsv" ;;
    *) echo "unknown section $section" ;;
  esac
done
