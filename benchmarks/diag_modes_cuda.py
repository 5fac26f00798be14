"""Execution modes of a converted ResNet-50 on the GPU: CUDA-graph capture and replay, reduce-overhead,
autocast and a training step, each checked against eager; plus where a training step's host time goes.

    python benchmarks/diag_modes_cuda.py capture [--batch 8]     # the capture matrix
    python benchmarks/diag_modes_cuda.py train [--batch 16]      # training: step times, host profile, kernels
    python benchmarks/diag_modes_cuda.py host                    # per-call host cost, and its parts

capture: for convert(fuse=False), convert(fuse=True), convert(fuse=True, autotune=x) (and the graph backend
unfused): eager output, then a CUDA graph (warm-up on a side stream) replayed (1) at once, (2) after
allocating and filling 4 x 256 MiB of other tensors, (3) after eager calls in between, (4) beside a second
graph of the same model, and (5) torch.compile(mode="reduce-overhead"), each as max relative error against
the eager output of the same model (the same kernels: expect ~0).
"""
from __future__ import annotations

import argparse
import copy
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
import traceback

import torch

if __package__ in (None, ""):
    sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))   # after PYTHONPATH

import rawconv  # noqa: E402
import rawconv.nn as rnn  # noqa: E402
from bench_resnet50 import build_resnet50, graph_capture as capture, rel_err  # noqa: E402


def churn():
    """Allocate and fill 4 x 256 MiB (then free): memory a graph does not own gets overwritten."""
    junk = [torch.full((64 << 20,), 1e4 * (i + 1), device="cuda") for i in range(4)]
    torch.cuda.synchronize()
    del junk


def capture_case(name, model, x, log, reduce_overhead=True):
    with torch.no_grad():
        ref = model(x).clone()
    res = {}
    try:
        g, out = capture(model, x)
        g.replay()
        torch.cuda.synchronize()
        res["replay"] = rel_err(out, ref)
        churn()
        g.replay()
        torch.cuda.synchronize()
        res["after_churn"] = rel_err(out, ref)
        with torch.no_grad():
            for _ in range(2):
                model(x)
        churn()
        g.replay()
        torch.cuda.synchronize()
        res["after_eager"] = rel_err(out, ref)
        g2, out2 = capture(model, x)
        churn()
        g.replay()
        g2.replay()
        torch.cuda.synchronize()
        res["two_graphs"] = max(rel_err(out, ref), rel_err(out2, ref))
        x2 = torch.randn_like(x)
        x.copy_(x2)   # new input into the static tensor
        with torch.no_grad():
            ref2 = model(x).clone()
        g.replay()
        torch.cuda.synchronize()
        res["new_input"] = rel_err(out, ref2)
        del g, g2
    except Exception as exc:  # noqa: BLE001
        res["capture_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        traceback.print_exc()
    try:
        if not reduce_overhead:
            raise NotImplementedError("not run")
        torch._dynamo.reset()
        cm = torch.compile(model, mode="reduce-overhead")
        with torch.no_grad():
            for _ in range(3):
                y = cm(x)
            churn()
            y = cm(x).clone()
            torch.cuda.synchronize()
        with torch.no_grad():
            ref3 = model(x)
        res["reduce_overhead"] = rel_err(y, ref3)
    except Exception as exc:  # noqa: BLE001
        res["reduce_overhead_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    log(f"{name:28s} " + "  ".join(f"{k}={v:.2e}" if isinstance(v, float) else f"{k}={v}" for k, v in res.items()))
    return res


def run_capture(args, log):
    base, src = build_resnet50()
    base = base.cuda().half().to(memory_format=torch.channels_last)
    x = torch.randn(args.batch, 3, 224, 224, device="cuda", dtype=torch.half).contiguous(
        memory_format=torch.channels_last)
    log(f"model: {src}, batch {args.batch}, fp16 channels_last; rawconv from {rawconv.__file__}")
    cases = [("unfused", dict(fuse=False)), ("unfused_autotune", dict(fuse=False, autotune=x, autotune_budget_s=0.3)),
             ("fused", dict(fuse=True)), ("fused_autotune", dict(fuse=True, autotune=x, autotune_budget_s=0.3))]
    if args.only:
        cases = [c for c in cases if c[0] in args.only.split(",")]
    for name, kw in cases:
        t0 = time.perf_counter()
        try:
            m = rnn.convert(copy.deepcopy(base), **kw)
        except Exception as exc:  # noqa: BLE001
            log(f"{name}: convert failed {type(exc).__name__}: {exc}")
            continue
        capture_case(name, m, x.clone(), log, name in args.ro.split(","))
        log(f"   ({time.perf_counter() - t0:.1f} s)")


def _plan_of(m, x, residual):
    """What a fused module's call runs (the cached plan of rawconv.fused), as text."""
    import rawconv.fused as F
    w = m._buffers.get(F.FROZEN_WEIGHT, m.weight)
    b = m._buffers.get(F.FROZEN_BIAS, m.bias)
    stride, pads, dilation = m._op_args()
    nd = w.dim() - 2
    try:
        plan = F.plan_for(x, w, b, residual, stride, F._pad_arg(pads, nd), dilation, m.groups,
                          activation=m.activation, backend=m.backend, choice=m.choice, precision=m.precision)
    except Exception as exc:  # noqa: BLE001
        return f"plan_for failed: {exc}"
    if isinstance(plan, F._CudaFallback):
        return "CudaFallback (legacy)"
    try:
        b = plan._current()
        ec = b.config
        return (f"{type(plan).__name__} {ec.name} ws={b.workspace_bytes} num={ec.numerical_notes} "
                f"beh={ec.behavior_notes}")
    except Exception as exc:  # noqa: BLE001
        return f"{type(plan).__name__} ?: {exc}"


def run_layers(args, log):
    """Per fused layer: eager twice (determinism), a capture of that layer alone replayed, against eager."""
    base, src = build_resnet50()
    base = base.cuda().half().to(memory_format=torch.channels_last)
    x = torch.randn(args.batch, 3, 224, 224, device="cuda", dtype=torch.half).contiguous(
        memory_format=torch.channels_last)
    m = rnn.convert(copy.deepcopy(base), fuse=True)
    with torch.no_grad():
        yt = base(x)
        y1 = m(x).clone()
        y2 = m(x).clone()
    log(f"whole model: eager vs eager {rel_err(y2, y1):.2e}, eager vs torch {rel_err(y1, yt):.2e}")
    calls = []

    def hook(mod, inp, out):
        calls.append((mod, tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in inp), out.clone()))
    hs = [mod.register_forward_hook(hook) for mod in m.modules() if isinstance(mod, rnn._ConvBiasAct)]
    with torch.no_grad():
        m(x)
    for h in hs:
        h.remove()
    names = {mod: n for n, mod in m.named_modules()}
    bad = 0
    for mod, inp, out in calls:
        with torch.no_grad():
            e1 = mod(*inp)
            e2 = mod(*inp)
        static = [t.clone() for t in inp]
        try:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s), torch.no_grad():
                for _ in range(2):
                    mod(*static)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g), torch.no_grad():
                o = mod(*static)
            g.replay()
            torch.cuda.synchronize()
            r1 = rel_err(o, e1)
            churn()
            g.replay()
            torch.cuda.synchronize()
            r2 = rel_err(o, e1)
        except Exception as exc:  # noqa: BLE001
            r1 = r2 = float("nan")
            log(f"  capture failed: {exc}")
        ee = rel_err(e2, e1)
        flag = "BAD" if max(r1, r2) > 1e-3 or ee > 1e-3 else "ok "
        bad += flag == "BAD"
        desc = _plan_of(mod, inp[0], inp[1] if len(inp) > 1 else None)
        log(f"{flag} {names.get(mod, '?'):28s} eager/eager {ee:.1e} replay {r1:.1e} churn {r2:.1e} "
            f"res={len(inp) > 1} {desc}")
    log(f"{bad} of {len(calls)} layers differ")


def run_inmodel(args, log):
    """The whole fused model captured; every fused module's input and output cloned (hooks) in eager
    and in the capture; after a replay, the first module whose replayed input or output differs."""
    base, src = build_resnet50()
    base = base.cuda().half().to(memory_format=torch.channels_last)
    x = torch.randn(args.batch, 3, 224, 224, device="cuda", dtype=torch.half).contiguous(
        memory_format=torch.channels_last)
    m = rnn.convert(copy.deepcopy(base), fuse=True)
    names = {mod: n for n, mod in m.named_modules()}
    rec = []

    def hook(mod, inp, out):
        rec.append((names[mod], [t.clone() for t in inp if isinstance(t, torch.Tensor)], out.clone()))
    mods = [mod for mod in m.modules() if isinstance(mod, rnn._ConvBiasAct)]
    hs = [mod.register_forward_hook(hook) for mod in mods]
    with torch.no_grad():
        m(x)
    eager = list(rec)
    rec.clear()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(3):
            m(x)
    torch.cuda.current_stream().wait_stream(s)
    rec.clear()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g), torch.no_grad():
        out = m(x)
    captured = list(rec)
    for h in hs:
        h.remove()
    g.replay()
    torch.cuda.synchronize()
    shown = 0
    for (n, ie, oe), (_, ic, oc) in zip(eager, captured):
        ei = max(rel_err(a, b) for a, b in zip(ic, ie))
        eo = rel_err(oc, oe)
        strides = [tuple(t.stride()) for t in ic]
        if ei > 1e-3 or eo > 1e-3 or shown < 3:
            log(f"{n:28s} input err {ei:.1e} output err {eo:.1e} strides {strides} vs eager "
                f"{[tuple(t.stride()) for t in ie]}")
            shown += 1
        if shown > 12:
            break
    with torch.no_grad():
        log(f"model output err {rel_err(out, m(x)):.2e}")


def run_bisect(args, log):
    """The fused model's whole capture under variations, each against eager: what makes it right?"""
    import gc

    import rawconv.cudnn_graph as G
    import rawconv.fused as F
    base, src = build_resnet50()
    base = base.cuda().half().to(memory_format=torch.channels_last)
    x = torch.randn(args.batch, 3, 224, 224, device="cuda", dtype=torch.half).contiguous(
        memory_format=torch.channels_last)

    def once(label, setup=lambda m: None, teardown=lambda m: None):
        F.clear_cache()
        m = rnn.convert(copy.deepcopy(base), fuse=True)
        setup(m)
        with torch.no_grad():
            ref = m(x).clone()
        g, out = capture(m, x)
        g.replay()
        torch.cuda.synchronize()
        e1 = rel_err(out, ref)
        with torch.no_grad():
            m(x)
        g.replay()
        torch.cuda.synchronize()
        log(f"{label:44s} replay {e1:.1e}  after eager {rel_err(out, ref):.1e}")
        teardown(m)

    once("baseline")
    gc.disable()
    once("gc disabled")
    gc.enable()
    old = G._VPS_KEPT
    G._VPS_KEPT = 10 ** 9
    once("variant packs never dropped")
    G._VPS_KEPT = old
    hooks = []
    keep = []
    once("no-op forward hooks", lambda m: hooks.extend(mod.register_forward_hook(lambda *a: None)
                                                       for mod in m.modules() if isinstance(mod, rnn._ConvBiasAct)))
    for h in hooks:
        h.remove()
    hooks.clear()
    once("hooks keeping inputs alive", lambda m: hooks.extend(
        mod.register_forward_hook(lambda md, i, o: keep.append(i)) for mod in m.modules()
        if isinstance(mod, rnn._ConvBiasAct)))
    for h in hooks:
        h.remove()
    keep.clear()
    once("residual_inplace off", lambda m: [mod.__dict__.pop("residual_inplace", None) for mod in m.modules()])
    real = rnn._autocasting
    rnn._autocasting = lambda: True   # the modules then call the operator (the dispatcher), not the kernel
    once("through the operator, not the direct kernel")
    rnn._autocasting = real


def _stepper(model, x, tgt, lossf, amp, **sgd):
    """One SGD training step of ``model`` on (x, tgt), under fp16 autocast when ``amp``; returns the loss."""
    opt = torch.optim.SGD(model.parameters(), **sgd)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
            loss = lossf(model(x), tgt)
        loss.backward()
        opt.step()
        return loss
    return step


def run_train(args, log):
    torch.backends.cudnn.benchmark = True
    base, src = build_resnet50()
    base = base.cuda().train().to(memory_format=torch.channels_last)
    x = torch.randn(args.batch, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)
    tgt = torch.randint(0, 1000, (args.batch,), device="cuda")
    log(f"training step, batch {args.batch}, channels_last; rawconv from {rawconv.__file__}")
    lossf = torch.nn.CrossEntropyLoss()

    cases = [("fp32 strict", False, False, "strict"), ("fp32 tf32", False, True, "tf32"),
             ("autocast fp16", True, True, "strict")]
    for label, amp, tf32, precision in cases:
        torch.backends.cudnn.allow_tf32 = tf32
        tm = copy.deepcopy(base)
        rm = rnn.convert(copy.deepcopy(base), precision=precision)
        steps = {"torch": _stepper(tm, x, tgt, lossf, amp, lr=1e-3),
                 "rawconv": _stepper(rm, x, tgt, lossf, amp, lr=1e-3)}
        losses = {}
        for k, f in steps.items():
            for _ in range(3):
                losses[k] = f().item()
        torch.cuda.synchronize()
        times = {}
        for _ in range(2):
            for k, f in steps.items():
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    f()
                torch.cuda.synchronize()
                times.setdefault(k, []).append((time.perf_counter() - t0) / args.steps * 1e3)
        log(f"{label:14s} step wall torch {min(times['torch']):7.2f} ms  rawconv {min(times['rawconv']):7.2f} ms  "
            f"ratio torch/rawconv {min(times['torch']) / min(times['rawconv']):.3f}  loss {losses}")
        if label == "fp32 strict" or args.profile_amp:
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(2):
                steps["rawconv"]()
            torch.cuda.synchronize()
            pr.disable()
            sio = io.StringIO()
            pstats.Stats(pr, stream=sio).sort_stats("tottime").print_stats(25)
            log(f"--- cProfile (2 rawconv steps, {label}) by tottime ---\n" + sio.getvalue()[:5000])
            from torch.profiler import ProfilerActivity, profile
            for k, f in steps.items():
                with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
                    f()
                    torch.cuda.synchronize()
                log(f"--- kernels {k} {label} ---\n" + prof.key_averages().table(
                    sort_by="cuda_time_total", row_limit=14, max_name_column_width=110))
    torch.backends.cudnn.allow_tf32 = True


def _no_tf32(fn, *a, **k):
    torch.backends.cudnn.allow_tf32 = False
    try:
        return fn(*a, **k)
    finally:
        torch.backends.cudnn.allow_tf32 = True


def run_host(args, log):
    import torch.nn.functional as F

    import rawconv.ops  # noqa: F401

    x = torch.randn(1, 8, 8, 8, device="cuda").contiguous(memory_format=torch.channels_last)
    w = torch.randn(8, 8, 3, 3, device="cuda").contiguous(memory_format=torch.channels_last)
    op = torch.ops.rawconv.conv_forward
    rows = {
        "F.conv2d": lambda: F.conv2d(x, w, padding=1),
        # like for like: torch's cuDNN convolutions use TF32 by default (allow_tf32), rawconv's strict
        # precision does not; the pairs below set both sides alike
        "F.conv2d TF32 off": lambda: _no_tf32(F.conv2d, x, w, padding=1),
        "op graph tf32": lambda: op(x, w, None, [1, 1], [1, 1], [1, 1], [1, 1], 1, "cudnn_graph", "", "tf32", "", ""),
        "ops.conv graph tf32": lambda: rawconv.ops.conv(x, w, padding=1, backend="cudnn_graph", precision="tf32"),
        "op legacy": lambda: op(x, w, None, [1, 1], [1, 1], [1, 1], [1, 1], 1, "cudnn", "", "strict", "", ""),
        "op graph": lambda: op(x, w, None, [1, 1], [1, 1], [1, 1], [1, 1], 1, "cudnn_graph", "", "strict", "", ""),
        "ops.conv legacy": lambda: rawconv.ops.conv(x, w, padding=1),
        "ops.conv graph": lambda: rawconv.ops.conv(x, w, padding=1, backend="cudnn_graph"),
        "torch.empty_strided": lambda: torch.empty_strided((1, 8, 8, 8), (512, 1, 64, 8), device="cuda"),
    }
    m = rnn.Conv2d(8, 8, 3, padding=1, bias=False).cuda().to(memory_format=torch.channels_last)
    rows["nn.Conv2d module"] = lambda: m(x)
    tm = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False).cuda().to(memory_format=torch.channels_last)
    rows["torch nn.Conv2d"] = lambda: tm(x)
    for k, f in rows.items():
        for _ in range(50):
            f()
    torch.cuda.synchronize()
    res = {k: [] for k in rows}
    for _ in range(5):
        for k, f in rows.items():
            torch.cuda._sleep(int(1e8))
            t0 = time.perf_counter()
            for _ in range(200):
                f()
            res[k].append((time.perf_counter() - t0) / 200 * 1e6)
            torch.cuda.synchronize()
    base = min(res["F.conv2d"])
    for k, v in res.items():
        log(f"{k:22s} host {min(v):7.2f} us  ({min(v) / base:5.2f}x F.conv2d)")
    # the parts of one graph-operator call, each timed alone (per call, best of 10 loops of 200)
    from rawconv import ops
    from rawconv.cudnn import _cuda
    from rawconv.cudnn import _ffi as _cudnn
    args = ([1, 1], [1, 1], [1, 1], [1, 1], 1, "cudnn_graph", "", "strict", "", "")
    for _ in range(5):
        op(x, w, None, *args)
    plan = [p for p in ops._cuda_last._plans.values() if type(p).__name__ == "GraphConvolution"][0]
    hot = plan._hot
    b = hot.built
    hs = _cuda.handle_state(0)
    a4 = hot.args.bind(x, w, None, None)[0]
    ptrs = tuple(a4[i] for i in hot.order)
    vp = next(iter(b.vps.values()))
    L = _cudnn.lib()
    lib = torch.library.Library("rawconv_diag", "DEF")
    lib.define("noop(Tensor x, Tensor w, Tensor? bias, int[] stride, int[] pb, int[] pa, int[] dil, int groups, "
               "str backend, str choice, str precision, str bd, str bw) -> Tensor")
    lib.define("noop1(Tensor x, Tensor w, Tensor? bias, str conf) -> Tensor")
    lib.define("noop0(Tensor x, Tensor w, Tensor? bias) -> Tensor")
    lib.impl("noop", lambda x, w, b, *a: x, "CUDA")
    lib.impl("noop1", lambda x, w, b, c: x, "CUDA")
    lib.impl("noop0", lambda x, w, b: x, "CUDA")
    parts = {
        "cudnnBackendExecute alone": lambda: L.cudnnBackendExecute(hs.ptr, b.plan.ptr, vp.ptr),
        "handle_state": lambda: _cuda.handle_state(0),
        "HotArgs.bind (+empty_strided)": lambda: hot.args.bind(x, w, None, None),
        "plan._run": lambda: plan._run(b, ptrs),
        "plan._hot_forward": lambda: plan._hot_forward(x, w, None),
        "ops._forward_cuda (kernel)": lambda: ops._forward_cuda(x, w, None, *args),
        "op (dispatcher+kernel)": lambda: op(x, w, None, *args),
        "noop op, full schema": lambda: torch.ops.rawconv_diag.noop(x, w, None, *args),
        "noop op, one str": lambda: torch.ops.rawconv_diag.noop1(x, w, None, "s1,1 p1,1 d1,1 g1 cudnn_graph"),
        "noop op, tensors only": lambda: torch.ops.rawconv_diag.noop0(x, w, None),
        "F.conv2d": lambda: F.conv2d(x, w, padding=1),
    }
    for k, f in parts.items():
        best = float("inf")
        for _ in range(10):   # 200 calls stay under the launch queue's depth behind the GPU sleep
            torch.cuda._sleep(int(1e8))
            t0 = time.perf_counter()
            for _ in range(200):
                f()
            best = min(best, (time.perf_counter() - t0) / 200 * 1e6)
            torch.cuda.synchronize()
        log(f"part {k:32s} {best:7.2f} us")
    # cudnnBackendExecute's host time per engine config of this problem, and the kernels each launches
    from torch.profiler import ProfilerActivity, profile
    log(f"selected: {plan.selected_name}")
    for ec in plan.engines(("instant", "b", "fallback"), limit=None, finalize=True)[:12]:
        if not ec.finalizes:
            continue
        bb = plan.build(ec)
        yy = torch.empty_strided((1, 8, 8, 8), (512, 1, 64, 8), device="cuda")
        pp = (x.data_ptr(), w.data_ptr(), yy.data_ptr())
        plan._run(bb, pp)
        vv = next(iter(bb.vps.values()))
        best = float("inf")
        for _ in range(10):
            torch.cuda._sleep(int(1e8))
            t0 = time.perf_counter()
            for _ in range(200):
                L.cudnnBackendExecute(hs.ptr, bb.plan.ptr, vv.ptr)
            best = min(best, (time.perf_counter() - t0) / 200 * 1e6)
            torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            L.cudnnBackendExecute(hs.ptr, bb.plan.ptr, vv.ptr)
            torch.cuda.synchronize()
        kernels = [e.name[:60] for e in prof.events() if e.device_type.name == "CUDA"]
        log(f"config {ec.name:40s} beh={ec.behavior_notes} execute {best:6.2f} us, kernels {kernels}")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        F.conv2d(x, w, padding=1)
        torch.cuda.synchronize()
    log(f"F.conv2d kernels {[e.name[:60] for e in prof.events() if e.device_type.name == 'CUDA']}")
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(2000):
        rows["op graph"]()
    pr.disable()
    torch.cuda.synchronize()
    sio = io.StringIO()
    pstats.Stats(pr, stream=sio).sort_stats("tottime").print_stats(20)
    log("--- cProfile op graph x2000 ---\n" + sio.getvalue()[:4000])


def _host_times(f, calls=20, rounds=7, sleep_cycles=5e6):
    """Host time per call of ``f`` (us) in each of ``rounds`` loops of ``calls`` calls, each loop
    queued behind a GPU sleep of ``sleep_cycles`` (launches never wait; a synchronising call shows
    as a time near the sleep's)."""
    out = []
    for _ in range(rounds):
        torch.cuda._sleep(int(sleep_cycles))
        t0 = time.perf_counter()
        for _ in range(calls):
            f()
        out.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return out


def _host_us(f, calls=20, rounds=7):
    """Best host time per call of ``f`` (us): :func:`_host_times`' minimum."""
    return min(_host_times(f, calls, rounds))


def _warm_converted(base, precision, amp, batch):
    """``(model, x)``: ``base`` converted (train mode, channels_last, CUDA) after two training steps
    (forward, backward; under autocast fp16 with ``amp``), so that its entries hold their plans."""
    m = rnn.convert(copy.deepcopy(base), precision=precision).cuda().train().to(memory_format=torch.channels_last)
    x = torch.randn(batch, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)
    for _ in range(2):
        with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
            y = m(x)
        y.float().sum().backward()
    torch.cuda.synchronize()
    return m, x


def _entry_plans(m):
    """``(module name, [(direction, CUDA plan or None)])`` per converted conv module: the plans its
    entry kept (forward, backward data, backward weights)."""
    for name, mod in m.named_modules():
        packs = mod.__dict__.get("_rawconv_entry")
        if packs:
            e = next(iter(packs.values()))[1]
            yield name, [("fwd", e[2]), ("dgrad", e[4]), ("wgrad", e[5])]


def _plan_tensors(p, d):
    """Fresh channels_last ``(x, w, y)`` of plan problem ``p`` and direction ``d``'s two inputs."""
    dt, cl = p.torch_dtype, torch.channels_last
    xx = torch.randn(p.x_shape, device="cuda", dtype=dt).contiguous(memory_format=cl)
    ww = torch.randn(p.w_shape, device="cuda", dtype=dt).contiguous(memory_format=cl)
    yy = torch.randn(p.y_shape, device="cuda", dtype=dt).contiguous(memory_format=cl)
    return (xx, ww, yy), {"fwd": (xx, ww), "dgrad": (yy, ww), "wgrad": (xx, yy)}[d]


def run_planhost(args, log):
    """Per convolution of a converted ResNet-50 training step: the host time of each plan's
    cudnnBackendExecute alone and of its whole hot call (forward, backward data, backward weights),
    its engine, beside torch's host time for the same convolution (F.conv2d, aten
    convolution_backward), on fresh tensors of the layer's shapes."""
    from rawconv.cudnn import _cuda
    from rawconv.cudnn import _ffi as _cudnn

    torch.backends.cudnn.benchmark = True
    base, _ = build_resnet50()
    L = _cudnn.lib()
    for label, amp, tf32, precision in (("fp32 tf32", False, True, "tf32"), ("autocast fp16", True, True, "strict")):
        torch.backends.cudnn.allow_tf32 = tf32
        m, x = _warm_converted(base, precision, amp, args.batch)
        # the whole step's host time, queued behind a long GPU sleep (a synchronising call inside
        # shows as a host time near the sleep's), torch beside rawconv
        tm = copy.deepcopy(base).cuda().train().to(memory_format=torch.channels_last)
        tgt = torch.randint(0, 1000, (args.batch,), device="cuda")
        lossf = torch.nn.CrossEntropyLoss()

        steps = {"torch": _stepper(tm, x, tgt, lossf, amp, lr=1e-4, momentum=0.9),
                 "rawconv": _stepper(m, x, tgt, lossf, amp, lr=1e-4, momentum=0.9)}
        for f in steps.values():
            for _ in range(3):
                f()
        torch.cuda.synchronize()
        host = {k: [] for k in steps}
        for _ in range(5):   # (the two take turns)
            for k, f in steps.items():
                host[k] += [t / 1e3 for t in _host_times(f, calls=1, rounds=1, sleep_cycles=4e8)]
        log(f"=== {label}: step host ms (GPU busy behind a sleep): torch min {min(host['torch']):.2f} "
            f"med {sorted(host['torch'])[2]:.2f}, rawconv min {min(host['rawconv']):.2f} "
            f"med {sorted(host['rawconv'])[2]:.2f}; ratio torch/rawconv {min(host['torch']) / min(host['rawconv']):.3f}")
        prof = cProfile.Profile()
        torch.cuda._sleep(int(4e8))
        prof.enable()
        steps["rawconv"]()
        prof.disable()
        torch.cuda.synchronize()
        sio = io.StringIO()
        pstats.Stats(prof, stream=sio).sort_stats("tottime").print_stats(18)
        log(sio.getvalue()[:3500])
        hs = _cuda.handle_state(0)
        tot = {}
        log(f"=== {label}: per conv, host us (C = cudnnBackendExecute alone, H = rawconv's hot call, "
            f"T = torch's op) ===")
        for name, plans in _entry_plans(m):
            row = []
            for d, plan in plans:
                if plan is None or getattr(plan, "_hot", None) is None:
                    row.append(f"{d}: -")
                    continue
                p = plan.problem
                (xx, ww, yy), (a, b) = _plan_tensors(p, d)
                if plan._hot_call(a, b, None) is None:
                    row.append(f"{d}: not hot")
                    continue
                bb = plan._hot.built
                vp = list(bb.vps.values())[-1]
                c = _host_us(lambda: L.cudnnBackendExecute(hs.ptr, bb.plan.ptr, vp.ptr))
                h = _host_us(lambda: plan._hot_call(a, b, None))
                st, pd, dl = list(p.stride), list(p.pad_before), list(p.dilation)
                if d == "fwd":
                    t = _host_us(lambda: torch.nn.functional.conv2d(xx, ww, None, st, pd, dl))
                elif d == "dgrad":
                    t = _host_us(lambda: torch.ops.aten.convolution_backward(
                        yy, xx, ww, None, st, pd, dl, False, [0, 0], 1, [True, False, False]))
                else:
                    t = _host_us(lambda: torch.ops.aten.convolution_backward(
                        yy, xx, ww, None, st, pd, dl, False, [0, 0], 1, [False, True, False]))
                for k, v in (("C", c), ("H", h), ("T", t)):
                    tot[(d, k)] = tot.get((d, k), 0.0) + v
                row.append(f"{d}: C {c:5.1f} H {h:5.1f} T {t:5.1f} {bb.config.name[:28]}{' RTC' if bb.serialize else ''}")
            log(f"{name:22s} " + " | ".join(row))
        log(f"--- {label} sums (ms per step): " + "  ".join(f"{d} {k} {v / 1e3:.2f}" for (d, k), v in sorted(tot.items())))
    torch.backends.cudnn.allow_tf32 = True


def _torch_call(p, d, t):
    """torch's own convolution of plan problem ``p``, direction ``d``, on ``t`` = (x, w, y) as
    :func:`_plan_tensors` makes them (``aten.convolution`` / ``aten.convolution_backward``)."""
    x, w, y = t
    nd = len(p.stride)
    conv_args = (list(p.stride), list(p.pad_before), list(p.dilation), False, [0] * nd, p.groups)
    if d == "fwd":
        return lambda: torch.ops.aten.convolution(x, w, None, *conv_args)
    mask = [d == "dgrad", d == "wgrad", False]
    return lambda: torch.ops.aten.convolution_backward(y, x, w, None, *conv_args, mask)


def run_engines(args, log):
    """Per distinct convolution and direction of a converted ResNet-50 training step (fp32 TF32;
    with --amp, autocast fp16; with --strict, fp32 with TF32 off): the first configs of cuDNN's
    heuristic mode instant (``--top``), each one's host time per hot call (queued behind a GPU
    sleep) and GPU time per call (queued), the entry's own config (the default selection) marked
    ``*``. Shows whether a config with torch's GPU time but less host time exists where the step
    is host-bound. With --strict, also torch's own call's GPU time with ``cudnn.benchmark`` on (what
    issue 38's strict fp32 default is held to) and the sums: the default configs, the best of the
    listed ones, torch's. Stops listing after ``--cap`` seconds."""
    from rawconv.core.bench import time_cuda_queued

    torch.backends.cudnn.allow_tf32 = not args.strict
    torch.backends.cudnn.benchmark = bool(args.strict)
    base, _ = build_resnet50()
    m, _x = _warm_converted(base, "strict" if args.amp or args.strict else "tf32", args.amp, args.batch)
    t_end = time.perf_counter() + args.cap
    seen = set()
    sums = {"entry host": 0.0, "entry gpu": 0.0, "best-host host": 0.0, "best-host gpu": 0.0, "best gpu": 0.0}
    if args.strict:
        sums["torch benchmark gpu"] = 0.0
    label = "autocast fp16" if args.amp else "fp32 strict (TF32 off)" if args.strict else "fp32 tf32"
    log(f"=== engines ({label}, b{args.batch}): per distinct problem and "
        f"direction, heuristic instant's first {args.top} configs: host us per hot call / GPU us per call ===")
    for name, plans in _entry_plans(m):
        if time.perf_counter() > t_end:
            log(f"(stopped at --cap {args.cap} s)")
            break
        for d, plan in plans:
            if plan is None or getattr(plan, "_hot", None) is None:
                continue
            p = plan.problem
            key = (d, p.x_shape, p.w_shape, tuple(p.stride), tuple(p.pad_before), p.dtype)
            if key in seen:
                continue
            seen.add(key)
            _t, (a, b) = _plan_tensors(p, d)

            def call():
                if d == "fwd":
                    return plan.execute(a, b)
                if d == "dgrad":
                    return plan.execute(grad_y=a, w=b)
                return plan.execute(a, grad_y=b)
            own = plan.selected_name
            rows = []
            try:
                configs = plan.engines("instant", limit=args.top)[:args.top]
            except Exception as exc:   # noqa: BLE001 - a diag: say it and go on
                log(f"{name} {d}: engines() raised {exc!r}")
                continue
            names = [c.name for c in configs]
            if own not in names:
                names.append(own)
            for cname in names:
                try:
                    plan.select(cname)
                    call()
                    torch.cuda.synchronize()
                    if plan._hot_call(a, b, None) is None:
                        rows.append((cname, None, None, "no hot path"))
                        continue
                    h = _host_us(lambda: plan._hot_call(a, b, None))
                    g = time_cuda_queued(lambda: plan._hot_call(a, b, None), iterations=20, warmup=2,
                                         repeats=3).median_ms * 1e3
                    rows.append((cname, h, g, ""))
                except Exception as exc:   # noqa: BLE001
                    rows.append((cname, None, None, f"{type(exc).__name__}: {str(exc)[:60]}"))
            plan.select(own)
            call()
            ok = [r for r in rows if r[1] is not None]
            if not ok:
                continue
            mine = next((r for r in ok if r[0] == own), None)
            gbest = min(r[2] for r in ok)
            near = [r for r in ok if r[2] <= gbest * 1.05]
            hbest = min(near, key=lambda r: r[1])
            if mine is not None:
                sums["entry host"] += mine[1]
                sums["entry gpu"] += mine[2]
            sums["best-host host"] += hbest[1]
            sums["best-host gpu"] += hbest[2]
            sums["best gpu"] += gbest
            tg = ""
            if args.strict:   # torch's own call, cudnn.benchmark on (its first call ran the benchmark)
                fn = _torch_call(p, d, _t)
                fn()
                tgpu = time_cuda_queued(fn, iterations=20, warmup=2, repeats=3).median_ms * 1e3
                sums["torch benchmark gpu"] += tgpu
                tg = f"  torch cudnn.benchmark gpu {tgpu:7.1f} us"
            log(f"{name:20s} {d:5s} x{tuple(p.x_shape)} w{tuple(p.w_shape)}{tg}")
            for r in rows:
                mark = ("*" if r[0] == own else " ") + ("h" if r is hbest else " ")
                if r[1] is None:
                    log(f"   {mark} {r[0][:40]:40s} {r[3]}")
                else:
                    log(f"   {mark} {r[0][:40]:40s} host {r[1]:6.1f} us  gpu {r[2]:7.1f} us")
    log("--- sums over the distinct problems (us): " + "  ".join(f"{k} {v:.0f}" for k, v in sums.items())
        + "  (h: least host time among configs within 5% of the best GPU time)")


class _PyConv(torch.autograd.Function):
    """torch's own convolution kernels (``aten.convolution`` forward, ``aten.convolution_backward``
    for dx and dw in one call) inside a Python autograd Function: the floor of any operator whose
    autograd lives in Python, as rawconv's does (nothing compiled)."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float16)
    def forward(ctx, x, w, st, pd, dl, groups):
        ctx.save_for_backward(x, w)
        ctx.conf = st, pd, dl, groups
        return torch.ops.aten.convolution(x, w, None, st, pd, dl, False, [0, 0], groups)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        st, pd, dl, groups = ctx.conf
        gx, gw, _ = torch.ops.aten.convolution_backward(g, x, w, None, st, pd, dl, False, [0, 0], groups,
                                                        [ctx.needs_input_grad[0], ctx.needs_input_grad[1], False])
        return gx, gw, None, None, None, None


def _pyfn_model(base):
    """``base`` (a copy) with every Conv2d's forward through :class:`_PyConv` (no bias in ResNet-50)."""
    m = copy.deepcopy(base)
    for mod in m.modules():
        if isinstance(mod, torch.nn.Conv2d):
            assert mod.bias is None and mod.padding_mode == "zeros"
            conf = (list(mod.stride), list(mod.padding), list(mod.dilation), mod.groups)
            mod.forward = (lambda mm, c: (lambda x: _PyConv.apply(x, mm.weight, *c)))(mod, conf)
    return m


def run_floor(args, log):
    """Where a training step's host time goes: torch, torch's own kernels in a Python autograd
    Function (the floor of an operator whose autograd is Python) and rawconv, each step's host time
    (forward, backward, whole step) queued behind a long GPU sleep (launches never wait), the time
    inside rawconv's module forwards and its backward function, and back-to-back wall time."""
    from rawconv.pytorch import ops as rops, nn as rnn_mod

    torch.backends.cudnn.benchmark = True
    base, _ = build_resnet50()
    base = base.cuda().train().to(memory_format=torch.channels_last)
    x = torch.randn(args.batch, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)
    tgt = torch.randint(0, 1000, (args.batch,), device="cuda")
    lossf = torch.nn.CrossEntropyLoss()
    acc = {"fwd": [0.0, 0], "bwd": [0.0, 0]}
    real_bwd = rops._direct_backward
    conv_cls = {type(m) for m in rnn.convert(copy.deepcopy(base)).modules() if type(m).__module__.startswith("rawconv")}

    def timed(f, key):
        """``f`` with its time and calls added to ``acc[key]``."""
        def run(*a):
            t0 = time.perf_counter()
            try:
                return f(*a)
            finally:
                acc[key][0] += time.perf_counter() - t0
                acc[key][1] += 1
        return run
    real_fwds = {c: c.forward for c in conv_cls}
    for label, amp, precision in (("fp32 tf32", False, "tf32"), ("autocast fp16", True, "strict")):
        torch.backends.cudnn.allow_tf32 = True
        models = {"torch": copy.deepcopy(base), "pyfn": _pyfn_model(base),
                  "rawconv": rnn.convert(copy.deepcopy(base), precision=precision)}
        steps = {k: _stepper(m, x, tgt, lossf, amp, lr=1e-4, momentum=0.9) for k, m in models.items()}
        for f in steps.values():
            for _ in range(3):
                f()
        torch.cuda.synchronize()
        host = {k: {"step": [], "fwd": [], "bwd": []} for k in steps}
        for _ in range(5):
            for k, m in models.items():
                host[k]["step"] += [t / 1e3 for t in _host_times(steps[k], calls=1, rounds=1, sleep_cycles=4e8)]
                torch.cuda._sleep(int(4e8))
                t0 = time.perf_counter()
                with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
                    loss = lossf(m(x), tgt)
                t1 = time.perf_counter()
                loss.backward()
                t2 = time.perf_counter()
                torch.cuda.synchronize()
                host[k]["fwd"].append((t1 - t0) * 1e3)
                host[k]["bwd"].append((t2 - t1) * 1e3)
                m.zero_grad(set_to_none=True)
        wall = {}
        for _ in range(2):
            for k, f in steps.items():
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(5):
                    f()
                torch.cuda.synchronize()
                wall.setdefault(k, []).append((time.perf_counter() - t0) / 5 * 1e3)
        # rawconv's own share: time inside its module forwards and its backward function
        rops._direct_backward = timed(real_bwd, "bwd")
        for c in conv_cls:
            c.forward = timed(real_fwds[c], "fwd")
        for v in acc.values():
            v[:] = [0.0, 0]
        for _ in range(3):
            torch.cuda._sleep(int(4e8))
            steps["rawconv"]()
            torch.cuda.synchronize()
        rops._direct_backward = real_bwd
        for c in conv_cls:
            c.forward = real_fwds[c]
        log(f"=== {label}, b{args.batch}: host ms per step, min / median of 5, GPU busy behind a sleep; wall: 5 "
            f"back-to-back steps, best of 2 ===")
        for k in steps:
            h = host[k]
            log(f"  {k:8s} step {min(h['step']):6.2f} / {statistics.median(h['step']):6.2f}   forward "
                f"{min(h['fwd']):6.2f} / {statistics.median(h['fwd']):6.2f}   backward {min(h['bwd']):6.2f} / "
                f"{statistics.median(h['bwd']):6.2f}   wall {min(wall[k]):6.2f}")
        log(f"  rawconv's own: module forwards {acc['fwd'][0] / 3 * 1e3:.2f} ms per step ({acc['fwd'][1] // 3} calls), "
            f"_direct_backward {acc['bwd'][0] / 3 * 1e3:.2f} ms per step ({acc['bwd'][1] // 3} calls)")
        pr = cProfile.Profile()
        torch.cuda._sleep(int(4e8))
        pr.enable()
        with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
            loss = lossf(models["rawconv"](x), tgt)
        pr.disable()
        loss.backward()
        torch.cuda.synchronize()
        sio = io.StringIO()
        pstats.Stats(pr, stream=sio).sort_stats("tottime").print_stats(22)
        log(f"--- cProfile, one rawconv forward ({label}) ---\n" + sio.getvalue()[:4000])
    torch.backends.cudnn.allow_tf32 = True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("capture", "train", "host", "layers", "inmodel", "bisect", "planhost",
                                     "engines", "floor"))
    ap.add_argument("--top", type=int, default=5, help="engines: heuristic configs per problem")
    ap.add_argument("--cap", type=float, default=150.0, help="engines: stop after this many seconds")
    ap.add_argument("--amp", action="store_true", help="engines: autocast fp16 instead of fp32 TF32")
    ap.add_argument("--strict", action="store_true",
                    help="engines: fp32 with TF32 off, beside torch's cudnn.benchmark call (issue 38)")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--only", default="")
    ap.add_argument("--ro", default="unfused,fused", help="cases also run under reduce-overhead")
    ap.add_argument("--precision", default="strict")
    ap.add_argument("--profile-amp", action="store_true")
    args = ap.parse_args()
    log = lambda s: print(s, flush=True)  # noqa: E731
    # each diagnosis and its default batch; anything else is "host"
    runs = {"capture": (run_capture, 8), "train": (run_train, 16), "bisect": (run_bisect, 8),
            "inmodel": (run_inmodel, 8), "layers": (run_layers, 8), "planhost": (run_planhost, 32),
            "engines": (run_engines, 32), "floor": (run_floor, 32)}
    fn, batch = runs.get(args.what, (run_host, None))
    if batch is not None:
        args.batch = args.batch or batch
    fn(args, log)


if __name__ == "__main__":
    main()
