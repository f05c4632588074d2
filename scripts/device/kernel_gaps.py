#!/usr/bin/env python3
"""Prints the records of kernel_trace.cpp's file around the last backward kernel of GPU 0: one line a
kernel, copy or memset, both GPUs, in start order, times in us from the window's first record. Then,
per GPU, how much of its last backward pass (the core's backward kernels, from the first after a 1.5 ms
pause to the last) some attention kernel ran, and some kernel or memset: a pass whose calls leave
the GPU idle shows it there, one whose calls run slowly does not.
    scripts/device/kernel_gaps.py kernels.tsv[.xz] [milliseconds before the last backward kernel, 6]
With --passes [N], instead the last N timed passes (8), one line each: per GPU, when its first
attention kernel starts and its last record ends, in us from the end of its L2 flush (the host's
memset before every sample), and how much later the last GPU ends than the first: which rank sets a
pass's pace, and whether it starts late or runs slowly.
    scripts/device/kernel_gaps.py kernels.tsv[.xz] --passes [N]"""
import lzma
import sys


def short(name):
    """A mangled name's last component (its function), else the name as given."""
    if not name.startswith("_ZN"):
        return name[:48]
    parts, i = [], 3
    while i < len(name) and name[i].isdigit():
        j = i
        while name[j].isdigit():
            j += 1
        n = int(name[i:j])
        parts.append(name[j:j + n])
        i = j + n
    return parts[-1][:48] if parts else name[:48]


# The host's L2 flush on an H200: a memset of twice its 60 MiB L2 (host/runtime/cuda_device.cu).
FLUSH_BYTES = 125829120


def attention(name):
    """Whether a kernel is an attention call's: the core's kernels or cuDNN's."""
    return "forward_sm" in name or "backward_sm" in name or "_sm80_kernel" in name or "cudnn" in name


def passes(records, count):
    """The last `count` timed passes: a line each, per GPU its first attention kernel and its end."""
    devices = sorted({r[3] for r in records})
    bounds = {}  # per GPU, the (flush end, next flush start) of each sample
    for device in devices:
        flushes = [r for r in records if r[3] == device and r[2] == "S" and r[5] == FLUSH_BYTES]
        bounds[device] = list(zip([f[1] for f in flushes], [f[0] for f in flushes[1:]] + [float("inf")]))
    n = min(len(b) for b in bounds.values())
    if n == 0:
        sys.exit(f"no L2 flush ({FLUSH_BYTES}-byte memset) on some GPU")
    print("pass      " + "".join(f"GPU {d}: first call     end   " for d in devices) + "last end after first")
    for i in range(max(0, n - count), n):
        ends, line, kinds = [], "", set()
        for device in devices:
            t0, t1 = bounds[device][len(bounds[device]) - n + i]
            inside = [r for r in records if r[3] == device and t0 <= r[0] < t1 and r[2] in "KSP"]
            calls = [r for r in inside if r[2] == "K" and attention(r[6])]
            kinds |= {"bwd" if "backward" in r[6] or "bprop" in r[6] else "fwd" for r in calls}
            if not calls:
                line += "        -           -     "
                continue
            end = max(r[1] for r in inside)
            ends.append(end - t0)
            line += f"   {(calls[0][0] - t0) / 1e3:9.1f} {(end - t0) / 1e3:9.1f}     "
        kind = "/".join(sorted(kinds)) or "-"
        spread = f"{(max(ends) - min(ends)) / 1e3:9.1f}" if len(ends) > 1 else "        -"
        print(f"{i:4} {kind:7}" + line + spread)


def main():
    path = sys.argv[1]
    records = []
    with (lzma.open(path, "rt") if path.endswith(".xz") else open(path)) as f:
        for line in f:
            kind, device, stream, start, end, size, name = line.rstrip("\n").split("\t", 6)
            records.append((int(start), int(end), kind, int(device), int(stream), int(size), name))
    records.sort()
    if len(sys.argv) > 2 and sys.argv[2] == "--passes":
        return passes(records, int(sys.argv[3]) if len(sys.argv) > 3 else 8)
    span_ms = float(sys.argv[2]) if len(sys.argv) > 2 else 6.0
    backward = [r for r in records if r[3] == 0 and r[2] == "K" and "backward" in r[6]]
    if not backward:
        sys.exit("no backward kernel on GPU 0 in " + path)
    last = backward[-1][0]
    window = [r for r in records if last - span_ms * 1e6 < r[0] <= last + 1e6]
    base = window[0][0]
    print("kind gpu stream    start      end     us  bytes  name")
    for start, end, kind, device, stream, size, name in window:
        print(f"{kind:4} {device:3} {stream:6} {(start - base) / 1e3:9.1f} {(end - base) / 1e3:9.1f} "
              f"{(end - start) / 1e3:7.1f} {size or '':>10} {short(name)}")
    print()
    for device in sorted({r[3] for r in records}):
        print(busy(records, device))


def covered(intervals):
    """The time a set of (start, end) intervals covers, overlaps counted once."""
    total, last_end = 0, None
    for start, end in sorted(intervals):
        if last_end is None or start > last_end:
            total += end - start
            last_end = end
        elif end > last_end:
            total += end - last_end
            last_end = end
    return total


def busy(records, device):
    """A line: GPU `device`'s last backward pass, and how much of it attention and any kernel ran."""
    calls = [r for r in records if r[3] == device and r[2] == "K" and "backward" in r[6]]
    if not calls:
        return f"GPU {device}: no backward kernel"
    first = len(calls) - 1
    while first > 0 and calls[first][0] - calls[first - 1][1] < 1.5e6:
        first -= 1
    t0, t1 = calls[first][0], calls[-1][1]
    inside = [(max(r[0], t0), min(r[1], t1)) for r in records
              if r[3] == device and r[2] in "KS" and r[1] > t0 and r[0] < t1]
    attention = covered([(max(r[0], t0), min(r[1], t1)) for r in calls[first:]])
    return (f"GPU {device}: backward {(t1 - t0) / 1e3:.1f} us, {len(calls) - first} attention calls; attention ran "
            f"{attention / 1e3:.1f} us ({100 * attention / (t1 - t0):.1f}%), any kernel {covered(inside) / 1e3:.1f} us")


if __name__ == "__main__":
    main()
