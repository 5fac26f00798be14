"""Where rawconv's CPU models lose to torch.compile with inductor freezing: the convolutions
(library version, implementation, reorders, post-ops) or everything else (the ops inductor fuses).

    python3 benchmarks/diag_cpu_gap.py --threads 8 --batch 4 --models resnet50,convnext_tiny,efficientnet_b0

For each model (random weights, fp32, channels_last, eval, no grad), in one process:

* wall time per batch (interleaved rounds, median and min) of torch eager, torch.compile with
  freezing (the CPU peer), rawconv ``convert(fuse=True, autotune=x)`` eager, the same under
  torch.compile, and under torch.compile with freezing;
* a profile of the compiled-and-frozen torch model and of the compiled rawconv model: the CPU time
  of their convolution ops (torch: ``mkldnn::_convolution_pointwise`` and friends, the prepacked
  oneDNN 3.x calls freezing makes; rawconv: ``rawconv::*``) against everything else, per batch.
  The convolutions' difference is the library and rawconv's use of it; the rest is the
  surrounding ops.
* ``--trace``: oneDNN's own verbose records (``time_ms`` of every primitive) of a few batches of the
  frozen torch model (torch's bundled oneDNN) and of the rawconv model (the oneDNN rawconv loaded:
  ``RAWCONV_DNNL_LIBRARY`` picks another build), matched layer by layer: each side's
  implementation, memory formats, post-ops, the convolution's own time and the reorders around it
  (min over batches). Summed over the layers this splits the convolutions' gap into the kernels
  (same formats and post-ops: the library version) and what rawconv adds around them (reorders,
  post-ops left to torch).
* ``--layers``: each distinct fused convolution of the converted model (``convert(fuse=True)``, its
  inputs captured in one forward pass) timed alone, interleaved, min and median of many calls:
  torch's frozen kernel (``mkldnn._convolution_pointwise`` on a weight prepacked by
  ``mkldnn._reorder_convolution_weight``, the calls inductor's freezing makes), the rawconv module as
  converted (its choice, its per-call work), and a rawconv plan pinned to the implementation torch
  ran (same name, its formats, the same post-ops, prepacked): the last against torch is the
  library version (plus the bare call cost), the module against that plan is rawconv's use.
* ``--libs default,/path/libdnnl.so.3``: the whole run once per oneDNN build, in alternating child
  processes (``--repeat`` times each), so that torch's side is timed again beside every build.

    python3 benchmarks/diag_cpu_gap.py --threads 2 --batch 1 --size 112 --trace --no-compile-rawconv \
        --models resnet50 --libs default,/tmp/dnnl36/libdnnl.so.3
"""
from __future__ import annotations

import argparse
import collections
import copy
import math
import os
import subprocess
import statistics
import sys
import time
import traceback
import warnings

import torch

T0 = time.perf_counter()


def say(*a):
    print(f"[{time.perf_counter() - T0:7.1f}s]", *a, flush=True)


def build(name: str):
    import timm
    import torchvision

    if name in ("resnet50", "efficientnet_b0", "mobilenetv3_large_100", "convnext_tiny", "regnety_016"):
        return timm.create_model(name, pretrained=False)
    return getattr(torchvision.models, name)(weights=None)


def rounds(fns: dict, x, n_rounds: int = 5, per: int = 3) -> dict:
    times = {k: [] for k in fns}
    for _ in range(n_rounds):
        for k, fn in fns.items():
            for _ in range(per):
                t0 = time.perf_counter()
                fn(x)
                times[k].append((time.perf_counter() - t0) * 1e3)
    return {k: (statistics.median(v), min(v)) for k, v in times.items()}


def is_conv(name: str) -> bool:
    n = name.lower()
    return n.startswith("rawconv::") or "convolution" in n or n.startswith("mkldnn::") and "conv" in n


def profile_split(fn, x, reps: int = 5) -> tuple[float, float, dict]:
    """(conv ms, other ms, {conv op name: ms}) per batch, from the self CPU time of profiled ops."""
    from torch.profiler import ProfilerActivity, profile

    fn(x)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(reps):
            fn(x)
        wall = (time.perf_counter() - t0) * 1e3 / reps
    conv = collections.Counter()
    for e in prof.key_averages():
        if is_conv(e.key):
            conv[e.key] += e.self_cpu_time_total / 1e3 / reps
    c = sum(conv.values())
    return c, wall - c, dict(conv.most_common(6))


def trace_batches(fn, x, batches: int, rawconv_side: bool) -> list:
    """oneDNN verbose records of ``batches`` calls of ``fn(x)``, one list per batch: torch's bundled
    oneDNN (``torch.backends.mkldnn.verbose``) or rawconv's (``rawconv.onednn.verbose``)."""
    from rawconv.pytorch import torch_choice as tc

    out = []
    for _ in range(batches):
        if rawconv_side:
            import rawconv.onednn as ro

            def go():
                ro.verbose(1)
                try:
                    fn(x)
                finally:
                    ro.verbose(0)

            _, text = tc._capture_fd1(go)
            out.append(tc.parse_onednn_verbose(text))
        else:
            out.append(tc.torch_onednn_trace(lambda: fn(x), records=True))
    return out


def _is_plain(fmt: str) -> bool:
    return bool(fmt) and fmt == fmt.lower()


def layers_of(runs: list) -> list[dict]:
    """One dict per convolution of one batch's records: shape, impl, formats, post-ops, its time,
    and the reorders attributed to it (a reorder from a plain (user) layout is the next
    convolution's input reorder; from a blocked one, the previous convolution's output reorder);
    records of other primitives (eltwise, binary...) go to ``other_ms``."""
    layers, pending, other = [], 0.0, 0.0
    for r in runs:
        t = r.time_ms or 0.0
        if r.kind in ("convolution", "deconvolution"):
            fm = r.format_tags()
            post = next((a.split(":", 1)[1] for a in r.attrs.split() if a.startswith("attr-post-ops:")), "")
            layers.append({"shape": r.shape, "impl": r.impl, "src": fm.get("src", ""), "wei": fm.get("wei", ""),
                           "dst": fm.get("dst", ""), "post": post, "conv_ms": t, "reorder_ms": pending, "n_reorders":
                           int(pending > 0)})
            pending = 0.0
        elif r.kind == "reorder":
            src = r.format_tags().get("src", "")
            if layers and not _is_plain(src):
                layers[-1]["reorder_ms"] += t
                layers[-1]["n_reorders"] += 1
            else:
                pending += t
        else:
            other += t
    return layers + ([{"shape": "(other primitives)", "other_ms": other}] if other else [])


def min_layers(batches: list) -> list[dict]:
    """Per layer position, the batch with the smallest conv + reorder time (every batch has the same
    layers in the same order; positions that differ keep the first batch's)."""
    per = [layers_of(b) for b in batches]
    base = per[0]
    out = []
    for i, lay in enumerate(base):
        cands = [p[i] for p in per if len(p) == len(base) and p[i].get("shape") == lay.get("shape")]
        out.append(min(cands, key=lambda d: d.get("conv_ms", 0) + d.get("reorder_ms", 0) + d.get("other_ms", 0)))
    return out


def compare_traces(name: str, tl: list[dict], rl: list[dict], lib: str) -> dict:
    """Print torch's and rawconv's layers side by side (matched by shape and occurrence); return the sums."""
    def key_list(ls):
        seen = collections.Counter()
        out = []
        for d in ls:
            seen[d["shape"]] += 1
            out.append((d["shape"], seen[d["shape"]]))
        return out

    rk = dict(zip(key_list(rl), rl))
    sums = collections.Counter()
    say(f"{name}: per layer, torch {torch.__version__}'s oneDNN (frozen) vs rawconv's oneDNN {lib} (ms, min over batches)")
    say(f"  {'layer':>5s} {'shape':52s} {'torch impl':24s} {'t conv':>7s} {'t reo':>6s} | {'rawconv impl':26s} "
        f"{'r conv':>7s} {'r reo':>6s} {'r/t':>5s}  formats / post-ops where they differ")
    for i, (k, t) in enumerate(zip(key_list(tl), tl)):
        if "other_ms" in t:
            sums["torch_other"] += t["other_ms"]
            continue
        r = rk.get(k)
        sums["torch_conv"] += t["conv_ms"]
        sums["torch_reorder"] += t["reorder_ms"]
        if r is None:
            say(f"  {i:5d} {t['shape'][:52]:52s} {t['impl'][:24]:24s} {t['conv_ms']:7.3f} {t['reorder_ms']:6.3f} | (no rawconv record)")
            continue
        sums["raw_conv"] += r["conv_ms"]
        sums["raw_reorder"] += r["reorder_ms"]
        same = (t["src"], t["dst"], t["post"]) == (r["src"], r["dst"], r["post"])
        if same:
            sums["same_torch"] += t["conv_ms"]
            sums["same_raw"] += r["conv_ms"]
        diff = "" if same else (f"t {t['src']}->{t['dst']} [{t['post']}] r {r['src']}->{r['dst']} [{r['post']}]")
        ratio = (r["conv_ms"] + r["reorder_ms"]) / max(t["conv_ms"] + t["reorder_ms"], 1e-9)
        say(f"  {i:5d} {t['shape'][:52]:52s} {t['impl'][:24]:24s} {t['conv_ms']:7.3f} {t['reorder_ms']:6.3f} | "
            f"{r['impl'][:26]:26s} {r['conv_ms']:7.3f} {r['reorder_ms']:6.3f} {ratio:5.2f}  {diff}")
    for r in rl:
        if "other_ms" in r:
            sums["raw_other"] += r["other_ms"]
    say(f"{name}: sums (ms per batch) torch conv {sums['torch_conv']:.2f} + reorders {sums['torch_reorder']:.2f}"
        f" (+ other primitives {sums['torch_other']:.2f}); rawconv conv {sums['raw_conv']:.2f} + reorders "
        f"{sums['raw_reorder']:.2f} (+ other {sums['raw_other']:.2f}); layers with the same formats and post-ops: "
        f"torch {sums['same_torch']:.2f} vs rawconv {sums['same_raw']:.2f} (the kernels alone)")
    return dict(sums)


# rawconv activation -> (torch's unary attr, scalars, algorithm) as mkldnn._convolution_pointwise takes them
_TORCH_UNARY = {"none": ("none", [], ""), "relu": ("relu", [], ""), "silu": ("swish", [], ""),
                "gelu": ("gelu", [], "none"), "gelu_tanh": ("gelu", [], "tanh"), "hardswish": ("hardswish", [], ""),
                "hardsigmoid": ("hardsigmoid", [], ""), "sigmoid": ("sigmoid", [], ""), "tanh": ("tanh", [], ""),
                "relu6": ("hardtanh", [0.0, 6.0], "")}


def layer_problems(r, x) -> list[dict]:
    """The distinct fused convolutions of a converted model with one forward pass's inputs."""
    import rawconv.nn as rnn
    from rawconv import fused

    got, hooks = {}, []
    for name, m in r.named_modules():
        if not isinstance(m, rnn._RawconvConv) or len(m.kernel_size) != 2 or getattr(m, "transposed", False) or \
                (not isinstance(m, rnn._ConvBiasAct) and (not isinstance(m.padding, tuple) or m.padding_mode != "zeros")):
            continue   # (plain modules: those with explicit zero padding, e.g. ConvNeXt's depthwise convolutions)

        def pre(mod, args, kwargs, _n=name):
            res = args[1] if len(args) > 1 else kwargs.get("residual")
            got.setdefault(_n, (mod, args[0].detach().clone(memory_format=torch.preserve_format),
                                None if res is None else res.detach().clone(memory_format=torch.preserve_format)))
        hooks.append(m.register_forward_pre_hook(pre, with_kwargs=True))
    with torch.no_grad():
        r(x)
    for h in hooks:
        h.remove()
    out, seen = [], set()
    for name, (m, xin, res) in got.items():
        if isinstance(m, rnn._ConvBiasAct):
            w, b = m._buffers.get(fused.FROZEN_WEIGHT), m._buffers.get(fused.FROZEN_BIAS)
        else:
            w, b = m.weight.detach(), None if m.bias is None else m.bias.detach()
        if w is None:
            continue
        key = (tuple(xin.shape), tuple(w.shape), tuple(m.stride), str(m.padding), tuple(m.dilation), m.groups,
               getattr(m, "activation", "none"), res is not None)
        if key in seen:
            continue
        seen.add(key)
        out.append({"name": name, "module": m, "x": xin, "r": res, "w": w, "b": b})
    return out


def time_layers(name: str, r, x, a) -> dict:
    """--layers (module docstring): per distinct fused convolution, torch's frozen kernel, the rawconv
    module as converted and a rawconv plan on torch's implementation; prints a row each, returns sums."""
    from rawconv import fused
    from rawconv.onednn.fused import FusedConvolution
    from rawconv.pytorch import torch_choice as tc
    import rawconv.onednn as ro

    lib = ro._version()
    sums = collections.Counter()
    ratios = {"module": [], "plan": []}
    say(f"{name}: per layer, alone ({a.layer_rounds} rounds x 5 calls, ms min / median): torch {torch.__version__}'s "
        f"frozen kernel | rawconv module (oneDNN {lib}) | rawconv plan on torch's implementation")
    for L in layer_problems(r, x):
        m, xin, res, w, b = L["module"], L["x"], L["r"], L["w"], L["b"]
        act = getattr(m, "activation", "none")
        pad = list(m._op_args()[1]) if hasattr(m, "_op_args") else list(m.padding)
        pad2 = pad[:2]
        if len(pad) == 4 and pad[:2] != pad[2:]:
            continue   # asymmetric padding: torch's pointwise op takes symmetric padding only
        attr, scal, alg = _TORCH_UNARY[act]
        wp = torch.ops.mkldnn._reorder_convolution_weight(w, pad2, list(m.stride), list(m.dilation), m.groups,
                                                          list(xin.shape))
        buf = None if res is None else res.clone(memory_format=torch.preserve_format)

        def fresh():
            if buf is not None:
                buf.copy_(res)

        if res is None:
            def t_fn():
                return torch.ops.mkldnn._convolution_pointwise(xin, wp, b, pad2, list(m.stride), list(m.dilation),
                                                               m.groups, attr, scal, alg)

            def r_fn():
                return m(xin)
        else:
            def t_fn():
                return torch.ops.mkldnn._convolution_pointwise_.binary(buf, xin, wp, b, pad2, list(m.stride),
                                                                       list(m.dilation), m.groups, "add", None,
                                                                       None if attr == "none" else attr, scal,
                                                                       alg or None)

            def r_fn():
                return m(xin, buf)
        trace = tc.torch_onednn_trace(t_fn, records=True)
        conv = next((q for q in trace if q.kind == "convolution"), None)
        timp = conv.impl if conv else "?"
        fns = {"torch": t_fn, "module": r_fn}
        plan = FusedConvolution(xin, w, b, m.stride, [(p, p) for p in pad2], m.dilation, m.groups,
                                residual=res is not None, activation=act, prepack=True)
        want = tc._normalize_impl(timp)
        pick = [i for i in plan.implementations if tc._normalize_impl(i.name) == want and i.layouts == "any"] or \
               [i for i in plan.implementations if tc._normalize_impl(i.name) == want]
        pimp = "-"
        if pick:
            plan.select(pick[0].index, allow_known_bad=True)
            pimp = pick[0].choice
            if res is None:
                fns["plan"] = lambda: plan.run(xin)
            else:
                fns["plan"] = lambda: plan.run(xin, residual=buf, inplace=True)
        with torch.no_grad():
            for fn in fns.values():
                fresh()
                fn()
            times = {k: [] for k in fns}
            for _ in range(a.layer_rounds):
                for k, fn in fns.items():
                    for _ in range(5):
                        fresh()
                        t0 = time.perf_counter()
                        fn()
                        times[k].append((time.perf_counter() - t0) * 1e3)
        st = {k: (min(v), statistics.median(v)) for k, v in times.items()}
        for k, (mn, md) in st.items():
            sums[k + "_min"] += mn
            sums[k + "_median"] += md
        if "plan" not in st:
            sums["plan_min"] += st["module"][0]
            sums["plan_median"] += st["module"][1]
        for k in ratios:
            if k in st:
                ratios[k].append(st["torch"][0] / st[k][0])
        choice = getattr(m, "choice", None) or "(default)"
        p = st.get("plan", (float("nan"), float("nan")))
        say(f"  {L['name'][:28]:28s} x{tuple(xin.shape)!s:18s} w{tuple(w.shape)!s:18s} g{m.groups:<4d} {act:9s}"
            f"{'+res' if res is not None else '    '} | {timp[:24]:24s} {st['torch'][0]:7.3f} {st['torch'][1]:7.3f} | "
            f"{str(choice)[:22]:22s} {st['module'][0]:7.3f} {st['module'][1]:7.3f} | {pimp[:28]:28s} {p[0]:7.3f} {p[1]:7.3f}"
            f" | t/module {st['torch'][0] / st['module'][0]:.2f} t/plan {st['torch'][0] / p[0]:.2f}")
    if not sums:
        say(f"{name}: no 2-D fused convolution with symmetric padding")
        return {}
    say(f"{name}: sums over the distinct layers (ms; min / median): torch {sums['torch_min']:.3f} / "
        f"{sums['torch_median']:.3f}; rawconv module {sums['module_min']:.3f} / {sums['module_median']:.3f} "
        f"({sums['torch_min'] / sums['module_min']:.3f}x torch); rawconv plan on torch's implementation "
        f"{sums['plan_min']:.3f} / {sums['plan_median']:.3f} ({sums['torch_min'] / sums['plan_min']:.3f}x torch)")
    # the sums move with one layer whose min a burst of load hit; the geometric mean of the per-layer
    # ratios (torch min / rawconv min) does not
    for k, v in ratios.items():
        if v:
            sums[f"geomean_torch_over_{k}"] = math.exp(sum(math.log(q) for q in v) / len(v))
            sums[f"median_torch_over_{k}"] = statistics.median(v)
    say(f"{name}: per-layer torch/rawconv (min over calls), geometric mean over {len(ratios['module'])} layers: "
        f"module {sums.get('geomean_torch_over_module', float('nan')):.3f}x (median "
        f"{sums.get('median_torch_over_module', float('nan')):.3f}), plan on torch's implementation "
        f"{sums.get('geomean_torch_over_plan', float('nan')):.3f}x (median {sums.get('median_torch_over_plan', float('nan')):.3f})")
    return dict(sums)


def run_model(name: str, a) -> None:
    import rawconv
    import rawconv.nn

    torch.manual_seed(0)
    m = build(name).eval().to(memory_format=torch.channels_last)
    x = torch.randn(a.batch, 3, a.size, a.size).to(memory_format=torch.channels_last)
    if a.layers:
        import rawconv.onednn as ro

        with torch.no_grad():
            r = rawconv.nn.convert(m, fuse=True, autotune=x if a.autotune else None, autotune_budget_s=a.budget)
            sums = time_layers(name, r, x, a)
        print("SUMMARY", {"model": name, "lib": ro._version(), "layers": sums}, flush=True)
        return
    fns = {"torch eager": m}
    with torch.no_grad():
        import torch._inductor.config as ic

        ic.freezing = True
        frozen = torch.compile(copy.deepcopy(m))
        frozen(x)
        ic.freezing = False
        fns["compile+freezing"] = frozen
        t = time.perf_counter()
        r = rawconv.nn.convert(m, fuse=True, autotune=x if a.autotune else None, autotune_budget_s=a.budget)
        say(f"{name}: convert(fuse, autotune={a.autotune}) {time.perf_counter() - t:.1f} s")
        r(x)
        fns["rawconv eager"] = r
        if a.compile_rawconv:
            rc = torch.compile(r)
            rc(x)
            fns["rawconv compiled"] = rc
            ic.freezing = True
            try:
                rf = torch.compile(copy.deepcopy(r))
                rf(x)
                fns["rawconv compiled+freezing"] = rf
            except Exception as exc:  # noqa: BLE001
                say(f"{name}: rawconv under compile+freezing: {type(exc).__name__}: {str(exc)[:200]}")
            finally:
                ic.freezing = False
        ref = m(x)
        for k, fn in fns.items():
            y = fn(x)
            err = ((y - ref).abs().max() / ref.abs().max()).item()
            if err > 1e-3:
                say(f"{name}: {k} differs from torch eager by {err:.2e}")
        res = rounds(fns, x, a.rounds)
        peer = res["compile+freezing"][0]
        peer_min = res["compile+freezing"][1]
        for k, (med, mn) in res.items():
            say(f"{name:18s} {k:28s} median {med:8.2f} ms  min {mn:8.2f}  peer/this {peer / med:.3f}x "
                f"(min {peer_min / mn:.3f}x)")
        if a.trace:
            import rawconv.onednn as ro

            lib = ro._version()
            tl = min_layers(trace_batches(frozen, x, a.trace_batches, False))
            rl = min_layers(trace_batches(r, x, a.trace_batches, True))
            sums = compare_traces(name, tl, rl, lib)
            print("SUMMARY", {"model": name, "lib": lib, "wall": res, **sums}, flush=True)
        if not a.profile:
            return
        for k in ("compile+freezing", "rawconv eager", "rawconv compiled"):
            if k not in fns:
                continue
            c, o, top = profile_split(fns[k], x)
            say(f"{name:18s} profile {k:20s} conv ops {c:8.2f} ms  other {o:8.2f} ms  "
                + "; ".join(f"{n} {v:.2f}" for n, v in top.items()))


def run_libs(a, argv: list) -> int:
    """The run once per oneDNN build of ``--libs``, in child processes taking turns (``--repeat``
    rounds): each child times torch's side again beside its build."""
    rest, skip = [], False
    for i, v in enumerate(argv):
        if skip:
            skip = False
            continue
        if v in ("--libs", "--repeat"):
            skip = True
            continue
        if v.startswith(("--libs=", "--repeat=")):
            continue
        rest.append(v)
    for rep in range(a.repeat):
        for lib in a.libs.split(","):
            env = dict(os.environ)
            if lib != "default":
                env["RAWCONV_DNNL_LIBRARY"] = lib
            else:
                env.pop("RAWCONV_DNNL_LIBRARY", None)
            say(f"--- round {rep + 1}/{a.repeat}: oneDNN {lib}")
            subprocess.run([sys.executable, os.path.abspath(__file__), *rest], env=env, check=False)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,convnext_tiny,efficientnet_b0")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--budget", type=float, default=0.3)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (3 calls each)")
    ap.add_argument("--no-autotune", dest="autotune", action="store_false",
                    help="convert(fuse=True) with its defaults (no search)")
    ap.add_argument("--no-compile-rawconv", dest="compile_rawconv", action="store_false",
                    help="leave out rawconv under torch.compile (saves the compile time)")
    ap.add_argument("--no-profile", dest="profile", action="store_false", help="leave out the torch.profiler split")
    ap.add_argument("--trace", action="store_true", help="per-layer oneDNN verbose records of both sides (above)")
    ap.add_argument("--trace-batches", type=int, default=5)
    ap.add_argument("--layers", action="store_true", help="each distinct fused layer timed alone (above); no model timing")
    ap.add_argument("--layer-rounds", type=int, default=15)
    ap.add_argument("--libs", default="", help="comma-separated oneDNN builds ('default' or a libdnnl path): "
                    "one child process per build, alternating, --repeat times")
    ap.add_argument("--repeat", type=int, default=1)
    a = ap.parse_args(argv)
    if a.libs:
        return run_libs(a, argv if argv is not None else sys.argv[1:])
    torch.set_num_threads(a.threads)
    warnings.filterwarnings("ignore")
    import rawconv

    say(f"torch {torch.__version__}, threads {a.threads}, rawconv oneDNN {rawconv.onednn.capabilities()!s:.60}")
    for name in a.models.split(","):
        try:
            run_model(name, a)
        except Exception:  # noqa: BLE001
            say(f"{name} failed:\n{traceback.format_exc()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
