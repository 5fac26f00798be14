"""Which oneDNN implementation is fastest for each ResNet-50 layer INSIDE the model, against what
``rawconv.nn.convert(fuse=True, autotune=x)`` picks by timing each candidate alone.

The question behind it: the CPU autotune times every implementation of a layer on the same example
tensors again and again (hot caches); in the model a layer reads an input the previous layer just
wrote and weights last touched a whole forward pass ago. Does that change the ranking, and what is
the best the model can reach with oneDNN 3.2's implementations?

Steps (one process, ``--threads`` OpenMP threads):
  1. convert(fuse=True, autotune=x) on channels_last input (the shipped search).
  2. Every fused conv module timed in the model (perf_counter around the module's call, which on
     the CPU is synchronous), with every module pinned to its r-th candidate in round r; rounds
     repeated ``--passes`` times. A module's in-model time per candidate: the min over passes of
     the median over ``--batches``.
  3. Each distinct problem's candidates timed alone: hot (same tensors, back to back) and cold (a
     buffer larger than the caches written between calls, not timed).
  4. The model with the in-model best per layer ("oracle"), with the autotune's choices, and
     torch.compile with freezing, taking turns batch by batch.

    python benchmarks/diag_cpu_in_model.py --threads 8
    python benchmarks/diag_cpu_in_model.py --threads 2 --base-width 16 --size 64 --no-compile   # smoke
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

import torch

if __package__ in (None, ""):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import rawconv.nn as rnn  # noqa: E402
from rawconv import bench, fused  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_resnet50 import build_resnet50, time_cpu_interleaved  # noqa: E402


def fused_modules(model):
    return [(n, m) for n, m in model.named_modules() if isinstance(m, rnn._ConvBiasAct)]


def capture_args(model, mods, x):
    """module -> (x, residual) of one forward (clones)."""
    got = {}
    hooks = []
    for _, m in mods:
        def pre(mod, args, kwargs, _m=m):
            xin = args[0]
            r = args[1] if len(args) > 1 else kwargs.get("residual")
            got[id(_m)] = (xin.detach().clone(memory_format=torch.preserve_format),
                           None if r is None else r.detach().clone(memory_format=torch.preserve_format))
        hooks.append(m.register_forward_pre_hook(pre, with_kwargs=True))
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return got


def plan_of(m, xin, r):
    w, b = m._buffers[fused.FROZEN_WEIGHT], m._buffers[fused.FROZEN_BIAS]
    return fused.FusedConvolution(xin, w, b, m.stride, m.padding, m.dilation, m.groups, residual=r is not None,
                                  activation=m.activation, fpmath=m.precision, prepack=True)


def candidates(plan):
    return [f"{i.name}@{i.layouts}" for i in plan.implementations if not i.name.startswith("ref")]


def in_model_times(model, mods, cands, x, batches: int, passes: int, log) -> dict:
    """{module id: {candidate: ms}}: each module's own time in the model, per candidate."""
    t = {}
    times = {id(m): [] for _, m in mods}
    hooks = []
    for _, m in mods:
        def pre(mod, args, kwargs, _m=m):
            t[id(_m)] = time.perf_counter()

        def post(mod, args, kwargs, out, _m=m):
            times[id(_m)].append((time.perf_counter() - t[id(_m)]) * 1e3)
        hooks.append(m.register_forward_pre_hook(pre, with_kwargs=True))
        hooks.append(m.register_forward_hook(post, with_kwargs=True))
    rounds = max(len(c) for c in cands.values())
    res = {id(m): {} for _, m in mods}
    try:
        for p in range(passes):
            order = list(range(rounds)) if p % 2 == 0 else list(reversed(range(rounds)))
            for r in order:
                pinned = {}
                for _, m in mods:
                    c = cands[id(m)]
                    m.choice = pinned[id(m)] = c[r % len(c)]
                with torch.no_grad():
                    model(x)   # builds the plans of this round (not timed)
                    for v in times.values():
                        v.clear()
                    for _ in range(batches):
                        model(x)
                for _, m in mods:
                    med = statistics.median(times[id(m)])
                    prev = res[id(m)].get(pinned[id(m)])
                    res[id(m)][pinned[id(m)]] = med if prev is None else min(prev, med)
            log(f"  in-model pass {p + 1}/{passes} done")
    finally:
        for h in hooks:
            h.remove()
    return res


def flusher(nbytes: int):
    buf = torch.empty(nbytes // 4, dtype=torch.float32)
    k = [0.0]

    def flush():
        k[0] += 1.0
        buf.fill_(k[0])
    return flush


def cache_bytes() -> int:
    """L2 + L3 of the caches the CPU reports (sysfs, each shared cache counted once)."""
    seen, total = set(), 0
    base = "/sys/devices/system/cpu"
    for cpu in os.listdir(base):
        d = os.path.join(base, cpu, "cache")
        if not (cpu.startswith("cpu") and cpu[3:].isdigit() and os.path.isdir(d)):
            continue
        for idx in os.listdir(d):
            try:
                level = int(open(os.path.join(d, idx, "level")).read())
                if level < 2:
                    continue
                shared = open(os.path.join(d, idx, "shared_cpu_list")).read().strip()
                size = open(os.path.join(d, idx, "size")).read().strip()
            except (OSError, ValueError):
                continue
            if (level, shared) in seen:
                continue
            seen.add((level, shared))
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1], 1)
            total += int(size.rstrip("KMG")) * mult
    return total or (64 << 20)


def alone_times(plan, cands, xin, r, iterations: int, flush) -> dict:
    """{candidate: (hot ms, cold ms)} of the plan's candidates ``cands``, each timed alone."""
    out = {}
    y = torch.empty_like(r) if r is not None else None
    for c in cands:
        plan.select(c)

        def call():
            if r is not None:
                y.copy_(r)
                return plan.run(xin, None, None, y, inplace=True)
            return plan.run(xin)
        call()
        hot = bench.time_cpu(call, iterations=iterations, warmup=2).median_ms
        cold_t = []
        for _ in range(iterations):
            flush()
            t0 = time.perf_counter()
            call()
            cold_t.append((time.perf_counter() - t0) * 1e3)
        out[c] = (hot, statistics.median(cold_t))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--base-width", type=int, default=64)
    ap.add_argument("--batches", type=int, default=3, help="timed batches per round (in-model)")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--alone-iterations", type=int, default=10)
    ap.add_argument("--alone-top", type=int, default=6, help="candidates timed alone per problem (the best in the model)")
    ap.add_argument("--flush-max-mib", type=int, default=1024)
    ap.add_argument("--final-rounds", type=int, default=20)
    ap.add_argument("--no-compile", action="store_true")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    log = lambda s: print(s, flush=True)  # noqa: E731
    model, source = build_resnet50(args.base_width)
    x = torch.randn(args.batch, 3, args.size, args.size, generator=torch.Generator().manual_seed(123))
    xc = x.to(memory_format=torch.channels_last)
    log(f"ResNet-50 ({source}), cpu, batch {args.batch}, {args.size}x{args.size}, float32, threads "
        f"{torch.get_num_threads()}, torch {torch.__version__}; caches (L2+L3) {cache_bytes() / 2**20:.0f} MiB")
    t0 = time.perf_counter()
    rm = rnn.convert(model, fuse=True, autotune=xc)
    log(f"convert(fuse=True, autotune=x): {time.perf_counter() - t0:.1f} s")
    mods = fused_modules(rm)
    pinned = rnn.pinned_choices(rm)   # the autotune's pick per layer (pinned to its problem)
    tuned = {id(m): pinned[name]["choice"] for name, m in mods}
    got = capture_args(rm, mods, xc)
    plans, cands, problems = {}, {}, {}
    for name, m in mods:
        xin, r = got[id(m)]
        p = plan_of(m, xin, r)
        plans[id(m)] = p
        cands[id(m)] = candidates(p)
        if tuned[id(m)] not in cands[id(m)]:
            cands[id(m)].append(tuned[id(m)])
        problems[id(m)] = (p.problem.describe(), r is not None)
    log(f"{len(mods)} fused modules, candidates per module: {sorted(set(len(c) for c in cands.values()))}")

    res = in_model_times(rm, mods, cands, xc, args.batches, args.passes, log)
    flush = flusher(min(2 * cache_bytes(), args.flush_max_mib << 20))
    alone = {}
    for name, m in mods:
        key = problems[id(m)]
        if key not in alone:
            xin, r = got[id(m)]
            t = res[id(m)]   # the best few in the model, and the autotune's pick
            top = sorted(t, key=t.get)[:args.alone_top]
            if tuned[id(m)] not in top:
                top.append(tuned[id(m)])
            alone[key] = alone_times(plans[id(m)], top, xin, r, args.alone_iterations, flush)

    tot = {"autotune": 0.0, "oracle": 0.0, "hot-best": 0.0, "cold-best": 0.0}
    agree = {"autotune": 0, "hot-best": 0, "cold-best": 0}
    log("\nper layer (ms in the model): autotune's pick | in-model best | alone hot best | alone cold best")
    oracle = {}
    for name, m in mods:
        t = res[id(m)]
        a = alone[problems[id(m)]]
        best = min(t, key=t.get)
        hot_best = min(a, key=lambda c: a[c][0])
        cold_best = min(a, key=lambda c: a[c][1])
        oracle[id(m)] = best
        picks = {"autotune": tuned[id(m)], "hot-best": hot_best, "cold-best": cold_best}
        for k, c in picks.items():
            tot[k] += t[c]
            agree[k] += c == best
        tot["oracle"] += t[best]
        log(f"  {name:<22} {problems[id(m)][0][:60]:<60} res={int(problems[id(m)][1])} "
            f"| {tuned[id(m)]:<28} {t[tuned[id(m)]]:7.3f} | {best:<28} {t[best]:7.3f} "
            f"| {hot_best:<28} {t[hot_best]:7.3f} | {cold_best:<28} {t[cold_best]:7.3f}")
        nan = (float("nan"), float("nan"))
        for c in sorted(t, key=t.get):
            if c in a or c == best:
                log(f"      {c:<32} in-model {t[c]:7.3f}  alone hot {a.get(c, nan)[0]:7.3f}  cold {a.get(c, nan)[1]:7.3f}")
    n = len(mods)
    log("\nsum of the fused modules' in-model ms per batch:")
    for k, v in tot.items():
        log(f"  {k:<10} {v:8.2f} ms" + (f"   ({agree[k]}/{n} layers the in-model best)" if k in agree else ""))

    fns = {}
    if not args.no_compile:
        import torch._inductor.config as icfg
        cm = torch.compile(copy.deepcopy(model).to(memory_format=torch.channels_last), options={"freezing": True})
        t0 = time.perf_counter()
        with icfg.patch(freezing=True), torch.no_grad():
            cm(xc)
        log(f"compile_freezing ready ({time.perf_counter() - t0:.1f} s)")
        fns["compile_freezing"] = lambda: cm(xc)
    # the converted model pinned two ways: the autotune's choices, and a copy with the in-model best
    for _, m in mods:
        m.choice = tuned[id(m)]
    ro = copy.deepcopy(rm)
    for (_, m), (_, mo) in zip(mods, fused_modules(ro)):
        mo.choice = oracle[id(m)]
    fns["rawconv_autotune"] = lambda: rm(xc)
    fns["rawconv_oracle"] = lambda: ro(xc)
    with torch.no_grad():
        y_a, y_o = fns["rawconv_autotune"](), fns["rawconv_oracle"]()
        y_ref = model(x)
    err = lambda y: ((y - y_ref).abs().max() / y_ref.abs().max()).item()  # noqa: E731
    log(f"err vs eager: autotune {err(y_a):.2e}, oracle {err(y_o):.2e}")
    stats = time_cpu_interleaved(fns, args.final_rounds, warmup=2)
    ref = stats.get("compile_freezing", (None,))[0]
    log("\nvariant              median ms   min ms   vs compile_freezing (median)")
    for k, (med, mn) in stats.items():
        log(f"  {k:<18} {med:9.3f} {mn:8.3f}   " + (f"{ref / med:.3f}x" if ref else "-"))


if __name__ == "__main__":
    main()
