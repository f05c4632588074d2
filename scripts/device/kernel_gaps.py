#!/usr/bin/env python3
"""Prints the records of kernel_trace.cpp's file around the last backward kernel of GPU 0: one line a
kernel, copy or memset, both GPUs, in start order, times in us from the window's first record. Then,
per GPU, how much of its last backward pass (the core's backward kernels, from the first after a 1.5 ms
pause to the last) some attention kernel ran, and some kernel or memset: a pass whose calls leave
the GPU idle shows it there, one whose calls run slowly does not.
    scripts/device/kernel_gaps.py kernels.tsv[.xz] [milliseconds before the last backward kernel, 6]"""
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


def main():
    path = sys.argv[1]
    span_ms = float(sys.argv[2]) if len(sys.argv) > 2 else 6.0
    records = []
    with (lzma.open(path, "rt") if path.endswith(".xz") else open(path)) as f:
        for line in f:
            kind, device, stream, start, end, size, name = line.rstrip("\n").split("\t", 6)
            records.append((int(start), int(end), kind, int(device), int(stream), int(size), name))
    records.sort()
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
