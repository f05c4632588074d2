#!/usr/bin/env python3
"""PyTorch SDPA forward (cuDNN, then flash) under sustained load, for power and clock records.

Run on the GPU machine beside `nvidia-smi --query-gpu=timestamp,power.draw,clocks.sm,... -lms 50`:
  python3 scripts/device/sdpa_sustained.py B H S D RUNS
Each (backend, causal) runs RUNS forwards (twice as many causal), back to back, each between CUDA events, and
prints its start and end wall-clock times and the median of the second half: the figure the GPU holds once it
has settled at its power limit, where torch_sdpa.py's 13 calls a figure run partly in the boost clock.
"""
import sys, time
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend


def stamp():
    t = time.time()
    return time.strftime("%H:%M:%S", time.localtime(t)) + ("%.3f" % (t % 1))[1:]


B, H, S, D, runs = (int(x) for x in sys.argv[1:6])
q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
for backend in ("CUDNN_ATTENTION", "FLASH_ATTENTION"):
    for causal in (0, 1):
        flops = 4 * B * H * S * S * D * (0.5 if causal else 1.0)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(runs * (2 if causal else 1))]
        with sdpa_kernel(getattr(SDPBackend, backend)):
            torch.cuda.synchronize()
            t0 = stamp()
            for a, b in events:
                a.record()
                F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
                b.record()
            torch.cuda.synchronize()
            t1 = stamp()
        settled = sorted(a.elapsed_time(b) for a, b in events[len(events) // 2:])
        ms = settled[len(settled) // 2]
        print(f"{backend.lower()} causal={causal} {t0} {t1} median {ms:.3f} ms {flops / ms / 1e9:.1f} TFLOP/s", flush=True)
        time.sleep(3)  # idle between phases, so that each one's power is its own
