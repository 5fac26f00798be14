"""Where rawconv's CUDA convolutions lose to torch on depthwise layers, and what cuDNN offers there.

    python3 benchmarks/diag_depthwise_cuda.py [--sections dw,profile,r3d,act] [--quick]

Sections (each prints its own lines and survives the others' failures):

* ``dw``: per depthwise problem (ConvNeXt 7x7, MobileNet/EfficientNet 3x3/5x5; fp16 and fp32 NHWC, with
  bias as those models have): GPU time (calls queued behind ``torch.cuda._sleep``,
  :func:`rawconv.core.bench.time_cuda_queued`) of torch (``cudnn.benchmark`` on), torch without
  the bias, rawconv's operator with no choice, the conv-only graph's heuristic configs (instant,
  fallback) each pinned, the conv + bias graph's default, and ``rawconv.torch_choice``'s match.
* ``profile``: the kernels (name, GPU µs) one call launches: torch's, and rawconv's pinned
  conv-only config, to find the extra per-call work.
* ``r3d``: torchvision r3d_18, ``convert(fuse=True, autotune=x)`` on CUDA: the traceback, if any.
* ``act``: conv + bias + activation graphs (relu, swish, gelu, sigmoid, tanh) on two layers: do
  they finalize, their GPU time against the conv-only config + torch's bias and activation ops.
"""
from __future__ import annotations

import argparse
import sys
import time
import traceback

import torch
import torch.nn.functional as F

import rawconv
from rawconv.core.bench import time_cuda_queued

T0 = time.perf_counter()


def say(*a):
    print(f"[{time.perf_counter() - T0:7.1f}s]", *a, flush=True)


def gpu_us(fn, iterations=40):
    fn()
    torch.cuda.synchronize()
    s = time_cuda_queued(fn, iterations=iterations, warmup=3, repeats=5)
    return s.median_ms * 1e3, s.min_ms * 1e3


def cl(t):
    return t.contiguous(memory_format=torch.channels_last)


DW = [  # (n, c, h, k, dtype)
    (16, 96, 56, 7, torch.float16), (16, 192, 28, 7, torch.float16), (16, 384, 14, 7, torch.float16),
    (16, 768, 7, 7, torch.float16), (32, 96, 56, 7, torch.float16), (32, 144, 56, 3, torch.float16),
    (32, 240, 28, 5, torch.float16), (32, 672, 14, 5, torch.float16), (16, 96, 56, 7, torch.float32),
    (32, 144, 56, 3, torch.float32),
]


def dw_section(quick: bool):
    from rawconv.cudnn import graph as G

    probs = DW
    for n, c, h, k, dt in probs:
        x = cl(torch.randn(n, c, h, h, device="cuda", dtype=dt))
        w = cl(torch.randn(c, 1, k, k, device="cuda", dtype=dt))
        b = torch.randn(c, device="cuda", dtype=dt)
        pad = k // 2
        tag = f"x({n},{c},{h},{h}) k{k} {str(dt)[6:]}"
        say(f"== {tag}")
        torch.backends.cudnn.benchmark = True
        t_b = gpu_us(lambda: F.conv2d(x, w, b, 1, pad, 1, c))
        t_nb = gpu_us(lambda: F.conv2d(x, w, None, 1, pad, 1, c))
        torch.backends.cudnn.benchmark = False
        t_heur = gpu_us(lambda: F.conv2d(x, w, b, 1, pad, 1, c))
        torch.backends.cudnn.benchmark = True
        say(f"   torch bench bias {t_b[0]:8.1f} us  no-bias {t_nb[0]:8.1f}  bench off (bias) {t_heur[0]:8.1f}")
        try:
            t_op = gpu_us(lambda: rawconv.ops.conv(x, w, b, padding=pad, groups=c))
            say(f"   rawconv.ops.conv default (bias)  {t_op[0]:8.1f} us  ratio torch/rawconv {t_b[0] / t_op[0]:.3f}")
        except Exception as exc:  # noqa: BLE001
            say(f"   rawconv.ops.conv default: {type(exc).__name__}: {str(exc)[:200]}")
        try:
            m = rawconv.nn.Conv2d(c, c, k, padding=pad, groups=c, device="cuda", dtype=dt)
            m.weight.data.copy_(w)
            m.bias.data.copy_(b)
            m = m.to(memory_format=torch.channels_last)
            with torch.no_grad():
                t_m = gpu_us(lambda: m(x))
            say(f"   rawconv.nn.Conv2d default       {t_m[0]:8.1f} us  ratio {t_b[0] / t_m[0]:.3f}")
        except Exception as exc:  # noqa: BLE001
            say(f"   rawconv.nn.Conv2d: {type(exc).__name__}: {str(exc)[:200]}")
        if quick:   # the defaults only
            continue
        # conv-only graph: heuristic configs, each pinned
        try:
            g = G.GraphConvolution(x, w, None, 1, pad, 1, c)
            for mode in ("instant", "fallback"):
                confs = g.heuristic(mode)
                say(f"   conv-only heuristic {mode}: {[e.name + ('*' if g.allowed(e) else '') + ('^' if 'RUNTIME_COMPILATION' in tuple(e.behavior_notes or ()) else '') for e in confs][:12]}")
            say(f"   conv-only default: {g.selected_name}")
            y = g.output()
            rows = []
            seen = set()
            for e in (g.heuristic("instant") + g.heuristic("fallback"))[:10]:
                if e.name in seen:
                    continue
                seen.add(e.name)
                try:
                    g.select(e.name)
                except Exception as exc:  # noqa: BLE001
                    rows.append(f"{e.name}: {type(exc).__name__}")
                    continue
                t = gpu_us(lambda: g.execute(x, w, out=y))
                rows.append(f"{e.name} {t[0]:.1f}/{t[1]:.1f}us ws={g.workspace_bytes}")
            say("   conv-only pinned: " + "; ".join(rows))
            t_add = gpu_us(lambda: y.add_(b.view(1, -1, 1, 1)))
            say(f"   torch bias add alone: {t_add[0]:.1f} us")
            g.free()
        except Exception as exc:  # noqa: BLE001
            say(f"   conv-only graph: {type(exc).__name__}: {str(exc)[:300]}")
        try:
            gb = G.GraphConvolution(x, w, b, 1, pad, 1, c)
            say(f"   conv+bias heuristic instant: {[e.name for e in gb.heuristic('instant')][:12]}")
            try:
                say(f"   conv+bias default: {gb.selected_name}")
                yb = gb.output()
                t = gpu_us(lambda: gb.execute(x, w, b, out=yb))
                say(f"   conv+bias default time {t[0]:.1f} us")
            except Exception as exc:  # noqa: BLE001
                say(f"   conv+bias default: {type(exc).__name__}: {str(exc)[:300]}")
            gb.free()
        except Exception as exc:  # noqa: BLE001
            say(f"   conv+bias graph: {type(exc).__name__}: {str(exc)[:300]}")
        try:
            tc = rawconv.torch_choice(x, w, b, 1, pad, 1, c, limit=8)
            say("   torch_choice: " + " | ".join(str(tc).splitlines()[:4]))
        except Exception as exc:  # noqa: BLE001
            say(f"   torch_choice: {type(exc).__name__}: {str(exc)[:200]}")


def _kernels(fn, reps=3):
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    out = []
    for e in prof.events():
        if e.device_type.name == "CUDA":
            out.append((e.name[:110], e.device_time if hasattr(e, "device_time") else e.cuda_time))
    return out


def profile_section(quick: bool):
    from rawconv.cudnn import graph as G

    for n, c, h, k, dt in (DW[0], DW[5], DW[8]):
        x = cl(torch.randn(n, c, h, h, device="cuda", dtype=dt))
        w = cl(torch.randn(c, 1, k, k, device="cuda", dtype=dt))
        b = torch.randn(c, device="cuda", dtype=dt)
        pad = k // 2
        say(f"== profile x({n},{c},{h},{h}) k{k} {dt}")
        torch.backends.cudnn.benchmark = True
        for name, fn in (("torch bias", lambda: F.conv2d(x, w, b, 1, pad, 1, c)),
                         ("torch no-bias", lambda: F.conv2d(x, w, None, 1, pad, 1, c))):
            try:
                say(f"   {name}: " + "; ".join(f"{k_} {t:.1f}" for k_, t in _kernels(fn)))
            except Exception as exc:  # noqa: BLE001
                say(f"   {name}: {type(exc).__name__}: {exc}")
        try:
            g = G.GraphConvolution(x, w, None, 1, pad, 1, c)
            g.autotune(budget_s=2.0)
            y = g.output()
            say(f"   rawconv autotuned conv-only {g.selected_name}: " + "; ".join(
                f"{k_} {t:.1f}" for k_, t in _kernels(lambda: g.execute(x, w, out=y))))
            t_r = gpu_us(lambda: g.execute(x, w, out=y))
            t_t = gpu_us(lambda: F.conv2d(x, w, None, 1, pad, 1, c))
            say(f"   GPU time: rawconv {t_r[0]:.1f} torch {t_t[0]:.1f} ratio {t_t[0] / t_r[0]:.3f}")
            g.select(5)
            say(f"   rawconv eng5 default knobs: " + "; ".join(
                f"{k_} {t:.1f}" for k_, t in _kernels(lambda: g.execute(x, w, out=y))))
            say(f"   readback {g.plan_readback()}")
            g.free()
        except Exception as exc:  # noqa: BLE001
            say(f"   rawconv: {type(exc).__name__}: {str(exc)[:300]}")
            traceback.print_exc()


def r3d_section(quick: bool):
    import torchvision

    for dt, fmt in ((torch.half, torch.channels_last_3d), (torch.half, torch.contiguous_format),
                    (torch.float, torch.contiguous_format)):
        say(f"== r3d_18 convert {dt} {fmt} b4 16x112x112")
        m = torchvision.models.video.r3d_18(weights=None).cuda().to(dt).eval().to(memory_format=fmt)
        x = torch.randn(4, 3, 16, 112, 112, device="cuda", dtype=dt).to(memory_format=fmt)
        _r3d(m, x)


def _r3d(m, x):
    with torch.no_grad():
        ref = m(x)
        for kw in (dict(), dict(fuse=True), dict(autotune=x, autotune_budget_s=0.2),
                   dict(fuse=True, autotune=x, autotune_budget_s=0.2)):
            try:
                r = rawconv.nn.convert(m, **kw)
                y = r(x)
                err = ((y.float() - ref.float()).norm() / ref.float().norm()).item()
                say(f"   {sorted(kw)}: ok rel err vs torch {err:.2e}")
            except Exception:  # noqa: BLE001
                say(f"   {sorted(kw)}: " + traceback.format_exc()[-1500:])


def act_section(quick: bool):
    from rawconv.cudnn import graph as G

    layers = [(32, 96, 56, 1, 576), (32, 64, 56, 3, 64), (32, 144, 56, 3, 144)]   # (n, c, h, k, kout)
    acts = {"relu": torch.relu, "swish": F.silu, "gelu": F.gelu, "sigmoid": torch.sigmoid, "tanh": torch.tanh}
    for n, c, h, k, ko in layers:
        groups = c if ko == c and k == 3 and c == 144 else 1
        x = cl(torch.randn(n, c, h, h, device="cuda", dtype=torch.half))
        w = cl(torch.randn(ko, c // groups, k, k, device="cuda", dtype=torch.half) * 0.1)
        b = torch.randn(ko, device="cuda", dtype=torch.half)
        pad = k // 2
        say(f"== act layer x({n},{c},{h},{h}) w({ko},{c // groups},{k},{k}) groups {groups}")
        torch.backends.cudnn.benchmark = True
        for a, fn in acts.items():
            t_t = gpu_us(lambda: fn(F.conv2d(x, w, b, 1, pad, 1, groups)))
            try:
                g = G.GraphConvolution(x, w, b, 1, pad, 1, groups, activation=a)
                conf = g.heuristic("instant")
                y = g.output()
                g.execute(x, w, b, out=y)
                ref = fn(F.conv2d(x.float(), w.float(), b.float(), 1, pad, 1, groups))
                err = ((y.float() - ref).norm() / ref.norm()).item()
                t_g = gpu_us(lambda: g.execute(x, w, b, out=y))
                say(f"   {a:8s} torch {t_t[0]:7.1f} us  fused default {g.selected_name} {t_g[0]:7.1f} us "
                    f"(err {err:.1e}, {len(conf)} instant configs)  torch/fused {t_t[0] / t_g[0]:.2f}")
                g.free()
            except Exception as exc:  # noqa: BLE001
                say(f"   {a:8s} torch {t_t[0]:7.1f} us  fused: {type(exc).__name__}: {str(exc)[:200]}")


def rtc_section(quick: bool):
    """Runtime-compiled conv-only configs without the barrier kernel: right when queued right
    behind a kernel that writes their input (what broke eng4's fused graphs), and how much faster."""
    from rawconv.cudnn import graph as G

    for n, c, h, k, dt in (DW[0], DW[5], DW[8], (32, 64, 56, 3, torch.float16)):
        groups = c if c != 64 else 1
        x = cl(torch.randn(n, c, h, h, device="cuda", dtype=dt))
        w = cl(torch.randn(c, c // groups, k, k, device="cuda", dtype=dt) * 0.1)
        src = [cl(torch.randn(n, c, h, h, device="cuda", dtype=dt)) for _ in range(4)]
        pad = k // 2
        g = G.GraphConvolution(x, w, None, 1, pad, 1, groups)
        names = []
        for e in g.heuristic("instant") + g.heuristic("fallback"):
            if "RUNTIME_COMPILATION" in tuple(e.behavior_notes or ()) and not g.allowed(e) and e.name not in names:
                names.append(e.name)
        say(f"== rtc x({n},{c},{h},{h}) k{k} groups {groups} {dt}: RTC configs {names[:6]}")
        refs = [F.conv2d(s_.float(), w.float(), None, 1, pad, 1, groups) for s_ in src]
        for name in names[:4]:
            try:
                g.select(name)
            except Exception as exc:  # noqa: BLE001
                say(f"   {name}: {type(exc).__name__}")
                continue
            y = g.output()
            for ser in (True, False):
                g._current().serialize = ser
                worst = 0.0
                for rep in range(20):
                    torch.cuda._sleep(2_000_000)
                    i = rep % 4
                    x.copy_(src[i])          # the kernel queued right before the convolution
                    g.execute(x, w, out=y)
                    torch.cuda.synchronize()
                    worst = max(worst, ((y.float() - refs[i]).norm() / refs[i].norm()).item())
                t = gpu_us(lambda: g.execute(x, w, out=y))
                say(f"   {name} barrier={ser}: worst rel err behind a writer {worst:.2e}; GPU {t[0]:.1f} us")
        g.free()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", default="dw,rtc,r3d,act,profile")
    ap.add_argument("--quick", action="store_true", help="section dw: torch and rawconv's defaults only")
    a = ap.parse_args(argv)
    say(f"torch {torch.__version__} cuDNN {torch.backends.cudnn.version()} {torch.cuda.get_device_name()}")
    for s in a.sections.split(","):
        try:
            {"dw": dw_section, "profile": profile_section, "r3d": r3d_section, "act": act_section, "rtc": rtc_section}[s](a.quick)
        except Exception:  # noqa: BLE001
            say(f"section {s} failed:\n{traceback.format_exc()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
