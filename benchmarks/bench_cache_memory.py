"""Memory over many input sizes (issue 36, item 1): resident memory (RSS) of torch and of rawconv's
modules fed ``--sizes`` different inputs, and what :func:`rawconv.clear_caches` gives back.

Each row runs in its own process (a fresh heap): a model of two ``Conv2d(16, 16, 3, padding=1)``
with a ReLU between (``module``: one ``rawconv.nn.Conv2d``) gets x = (1, 16, 64 + 2 i, 64) for
i < ``--sizes``, under ``torch.no_grad()`` (``--grad``: forward and backward). Printed per row, in
MB: ``start`` (after one call on the first size, then ``clear_caches()``: the libraries loaded),
``peak`` (the largest RSS seen after a call), ``end``, ``cleared`` (after ``clear_caches()``), the
peak's growth over start as a ratio to torch's, and rawconv's :func:`rawconv.cache_info` at the end.

* ``torch``: the model itself (torch's ``F.conv2d``);
* ``module``: one ``rawconv.nn.Conv2d``;
* ``convert``: ``rawconv.nn.convert(model)``;
* ``fuse``: ``rawconv.nn.convert(model.eval(), fuse=True)`` (frozen fused modules);
* ``autotuned``: ``convert(model, autotune=x0, autotune_new="search")``: every new size searched.

Run against two trees to compare them::

    PYTHONPATH=/path/to/before python benchmarks/bench_cache_memory.py
    PYTHONPATH=/path/to/after  python benchmarks/bench_cache_memory.py
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = ("torch", "module", "convert", "fuse", "autotuned")


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _gpu_mb() -> float:
    import torch
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated() / 2**20


def child(mode: str, sizes: int, grad: bool, threads: int, device: str = "cpu") -> dict:
    import gc
    import warnings

    import torch

    if __package__ in (None, "") and not os.environ.get("PYTHONPATH"):
        sys.path.insert(0, os.path.join(HERE, ".."))
    import rawconv
    import rawconv.nn as rnn

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(16, 16, 3, padding=1))
    x0 = torch.randn(1, 16, 64, 64, device=device)
    model = model.to(device)
    warnings.simplefilter("ignore")
    if mode == "module":
        model = rnn.Conv2d(16, 16, 3, padding=1).to(device)
    elif mode == "convert":
        model = rnn.convert(model)
    elif mode == "fuse":
        model = rnn.convert(model.eval(), fuse=True)
    elif mode == "autotuned":
        model = rnn.convert(model, autotune=x0, autotune_new="search", autotune_budget_s=0.02)

    def step(x):
        if grad:
            x.requires_grad_(True)
            model(x).sum().backward()
        else:
            with torch.no_grad():
                model(x)

    step(x0)
    clear = getattr(rawconv, "clear_caches", lambda: None)
    if mode != "torch":
        clear()
    gc.collect()
    gpu = device == "cuda"
    start = peak = _rss_mb()
    gstart = _gpu_mb() if gpu else 0.0
    if gpu:   # the peaks inside calls too (workspaces, buffers made and freed during one)
        torch.cuda.reset_peak_memory_stats()
    for i in range(sizes):
        step(torch.randn(1, 16, 64 + 2 * i, 64, device=device))
        peak = max(peak, _rss_mb())
    end = _rss_mb()
    gend = _gpu_mb() if gpu else 0.0
    gpeak = torch.cuda.max_memory_allocated() / 2**20 if gpu else 0.0
    greserved = torch.cuda.max_memory_reserved() / 2**20 if gpu else 0.0
    info = getattr(rawconv, "cache_info", lambda: None)()
    clear()
    gc.collect()
    out = {"mode": mode, "start": start, "peak": peak, "end": end, "cleared": _rss_mb(), "cache_info": info,
           "rawconv": os.path.dirname(rawconv.__file__)}
    if gpu:   # torch.cuda.memory_allocated: the tensors alive (workspaces, buffers), not the allocator's cache
        out.update(gpu_start=gstart, gpu_peak=gpeak, gpu_end=gend, gpu_cleared=_gpu_mb(), gpu_reserved_peak=greserved)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, default=700)
    ap.add_argument("--grad", action="store_true", help="forward and backward (default: no_grad forward)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--modes", default="torch,module,convert,fuse",
                    help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cuda: the model and inputs on the GPU; GPU memory allocated is printed beside RSS")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.sizes, args.grad, args.threads, args.device)))
        return
    rows = []
    for mode in args.modes.split(","):
        if mode not in MODES:
            ap.error(f"unknown mode {mode!r}")
        cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--sizes", str(args.sizes),
               "--threads", str(args.threads), "--device", args.device] + (["--grad"] if args.grad else [])
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode:
            print(f"{mode}: failed: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}")
            continue
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    if not rows:
        return
    print(f"rawconv from {rows[-1]['rawconv']}; {args.sizes} sizes of (1, 16, 64 + 2i, 64), "
          f"{'forward + backward' if args.grad else 'no_grad forward'}, {args.threads} threads, {args.device}; RSS in MB"
          + ("; gpu: torch.cuda.memory_allocated in MB (start/peak/end/cleared; peak: max_memory_allocated, in "
             "calls too), peak growth over start as a ratio to torch's, and the allocator's peak reserved"
             if args.device == "cuda" else ""))
    base = next((r for r in rows if r["mode"] == "torch"), None)
    print(f"{'mode':<10} {'start':>7} {'peak':>7} {'end':>7} {'cleared':>8} {'peak/torch':>11} {'cleared-start':>14}"
          "  cache_info")
    for r in rows:
        ratio = f"{r['peak'] / base['peak']:.2f}" if base else "-"
        info = r["cache_info"]
        held = "" if not info else ("held " + (", ".join(f"{d} {n / 2**20:.0f}" for d, n in info["bytes"].items()) or "0")
                                    + f" MB (limit {info['limit'] / 2**20:.0f} per device), {info['evictions']} released")
        gpu = ""
        if "gpu_peak" in r:
            grow = r["gpu_peak"] - r["gpu_start"]
            gbase = None if base is None or "gpu_peak" not in base else base["gpu_peak"] - base["gpu_start"]
            gratio = f"{grow / gbase:.2f}x torch" if gbase else "-"
            gpu = (f"  gpu {r['gpu_start']:.0f}/{r['gpu_peak']:.0f}/{r['gpu_end']:.0f}/{r['gpu_cleared']:.0f} "
                   f"(+{grow:.0f}, {gratio}; reserved peak {r['gpu_reserved_peak']:.0f})")
        print(f"{r['mode']:<10} {r['start']:7.0f} {r['peak']:7.0f} {r['end']:7.0f} {r['cleared']:8.0f} {ratio:>11} "
              f"{r['cleared'] - r['start']:14.0f}  {held}{gpu}")


if __name__ == "__main__":
    main()
