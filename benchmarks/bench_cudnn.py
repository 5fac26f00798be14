"""rawconv.cudnn on a GPU: per-call host overhead, and the fastest legacy algo vs torch.

    python benchmarks/bench_cudnn.py [--batch 32] [--layers N] [--iterations 20]

1. Host overhead per call (µs): many back-to-back calls of a tiny convolution (GPU time well under
   the host time), ``time.perf_counter`` around the loop, one synchronize at the end: a cached
   ``Convolution.execute``, the function form ``rawconv.cudnn.forward``, and ``F.conv2d``, same
   problem, same process. Ratios are rawconv / torch (<= 1: no more overhead than torch).
2. ResNet-50 layers (``rawconv.presets.resnet50``): rawconv's fastest legacy algo (``autotune``:
   Find, then CUDA-event medians) vs torch with ``cudnn.benchmark=True``, both timed as pure GPU
   time per call (calls queued behind a GPU sleep, best of 3 loops), for
   fp32 with FMA math (torch: TF32 off), TF32 (rawconv math "tensor_op"; torch: allow_tf32),
   fp16 and bf16 (channels_last, rawconv math "tensor_op"). Ratio = torch / rawconv (> 1: rawconv
   faster); geometric mean per mode.
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from rawconv import cudnn
from rawconv.bench import geomean, time_cuda
from rawconv.problem import ConvProblem, to_layout

try:
    from rawconv.presets import resnet50
except ImportError:  # pragma: no cover
    resnet50 = None


def _host_and_gpu(fn, calls: int = 300, repeats: int = 5) -> tuple[float, float]:
    """(host µs per call, GPU µs per call). The GPU is first held busy by ``torch.cuda._sleep`` long
    enough for every call of the loop to be queued behind it, so the host loop time is pure host
    overhead and the events around the queued calls measure pure GPU time (no host gaps)."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    host, gpu = [], []
    for _ in range(repeats):
        torch.cuda._sleep(400_000_000)  # ~0.2 s of GPU time at ~2 GHz
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        b.record()
        torch.cuda.synchronize()
        host.append((t1 - t0) / calls * 1e6)
        gpu.append(a.elapsed_time(b) * 1e3 / calls)
    return min(host), min(gpu)


def host_overhead() -> dict:
    x = torch.randn(1, 8, 8, 8, device="cuda")
    w = torch.randn(8, 8, 3, 3, device="cuda")
    torch.backends.cudnn.benchmark = False
    plan = cudnn.Convolution(x, w, padding=1)
    out = torch.empty(1, 8, 8, 8, device="cuda")
    res = {
        "torch F.conv2d": _host_and_gpu(lambda: F.conv2d(x, w, padding=1)),
        "rawconv plan.execute": _host_and_gpu(lambda: plan.execute(x, w)),
        "rawconv plan.execute(out=)": _host_and_gpu(lambda: plan.execute(x, w, out=out)),
        "rawconv cudnn.forward": _host_and_gpu(lambda: cudnn.forward(x, w, padding=1)),
    }
    res["torch F.conv2d (again)"] = _host_and_gpu(lambda: F.conv2d(x, w, padding=1))
    res["_plan_info"] = plan.info
    return res


def per_algo(x, w, padding, label: str) -> None:
    """Host and GPU µs per call of every usable forward algo x math type (raw execute of a plan)."""
    print(f"\n== per algo, {label}: host µs / GPU µs per call")
    h, g = _host_and_gpu(lambda: F.conv2d(x, w, padding=padding), calls=200, repeats=2)
    print(f"  {'torch F.conv2d':<40} host {h:7.2f}  gpu {g:8.2f}")
    for r in cudnn.algorithms(x, w, padding=padding, mode="heuristic"):
        if not r.ok or r.workspace_bytes > (1 << 30):
            continue
        try:
            plan = cudnn.Convolution(x, w, padding=padding, algo=r.algo_id, math=r.requested_math)
            plan.execute()
        except Exception as exc:
            print(f"  {r.algo + '/' + r.requested_math:<40} failed: {type(exc).__name__}")
            continue
        h, g = _host_and_gpu(lambda: plan.execute(x, w), calls=200, repeats=2)
        print(f"  {r.algo + '/' + r.requested_math + ' (' + r.math + ')':<40} host {h:7.2f}  gpu {g:8.2f}")


MODES = {  # name: (dtype, layout, rawconv math, torch allow_tf32)
    "fp32-fma": ("float32", "nchw", "fma", False),
    "tf32": ("float32", "nchw", "tensor_op", True),
    "fp16": ("float16", "nhwc", "tensor_op", False),
    "bf16": ("bfloat16", "nhwc", "tensor_op", False),
}


def torch_time(p: ConvProblem, x, w, allow_tf32: bool, iterations: int) -> float:
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    fn = lambda: F.conv2d(x, w, None, p.stride, p.pad_before, p.dilation, p.groups)  # noqa: E731
    time_cuda(fn, iterations=3, warmup=3)  # lets cudnn.benchmark pick its algo first
    return cudnn.gpu_time(fn, iterations=iterations).median_ms


def resnet(batch: int, layers: int | None, iterations: int, modes) -> dict:
    if resnet50 is None:
        raise SystemExit("rawconv.presets.resnet50 is missing")
    out = {}
    for mode in modes:
        dtype, layout, math, tf32 = MODES[mode]
        ratios = []
        print(f"\n== {mode}: batch {batch}, {layout}, rawconv math={math}, torch cudnn.benchmark=True "
              f"allow_tf32={tf32}")
        for p in resnet50(batch, dtype=dtype, layout=layout)[:layers]:
            p = p.with_(device="cuda")
            x, w, _ = p.make_inputs(seed=0)
            if layout == "nhwc":
                w = to_layout(w, "nhwc")
            t_torch = torch_time(p, x, w, tf32, iterations)
            with cudnn.Convolution(x, w, None, p.stride, p.pad_before, p.dilation, p.groups, math=math) as plan:
                try:
                    rows = plan.autotune(iterations=iterations, warmup=3)
                except Exception as exc:  # keep going: report the layer
                    print(f"  {p.name:<22} rawconv failed: {type(exc).__name__}: {exc}")
                    continue
                best = rows[0]
                t_raw = cudnn.gpu_time(lambda: plan.execute(x, w), iterations=iterations).median_ms
            ratio = t_torch / t_raw
            ratios.append(ratio)
            print(f"  {p.name:<22} torch {t_torch:8.4f} ms   rawconv {t_raw:8.4f} ms "
                  f"({best.algorithm.algo}, math {best.algorithm.math})   torch/rawconv {ratio:5.2f}")
        g = geomean(ratios)
        out[mode] = g
        print(f"  geomean torch/rawconv ({mode}): {g:.3f} over {len(ratios)} layers")
    torch.backends.cudnn.allow_tf32 = True
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--layers", type=int, default=None, help="only the first N ResNet-50 layers")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--modes", default="fp32-fma,tf32,fp16,bf16")
    ap.add_argument("--skip-resnet", action="store_true")
    ap.add_argument("--per-algo", action="store_true", help="host/GPU µs per call of every algo (diagnosis)")
    a = ap.parse_args()
    info = cudnn.info()
    print(f"cuDNN {info['version']} ({info['found_via']}: {info['path']}), torch {torch.__version__} "
          f"cuDNN {info['torch_cudnn_version']}, GPU {info['gpu']} (sm {info['compute_capability']})")
    oh = host_overhead()
    print("\n== host overhead per call (µs, best of 5 loops of 300 calls queued behind a GPU sleep; "
          "tiny conv 1x8x8x8, 3x3); rawconv plan:", oh.pop("_plan_info"))
    for k, (h, g) in oh.items():
        print(f"  {k:<28} host {h:7.2f} µs   gpu {g:7.2f} µs")
    t = min(oh["torch F.conv2d"][0], oh["torch F.conv2d (again)"][0])
    for k in ("rawconv plan.execute", "rawconv plan.execute(out=)", "rawconv cudnn.forward"):
        print(f"  host-overhead ratio {k} / torch F.conv2d: {oh[k][0] / t:.2f}")
    if a.per_algo:
        per_algo(torch.randn(1, 8, 8, 8, device="cuda"), torch.randn(8, 8, 3, 3, device="cuda"), 1, "tiny fp32")
        x = to_layout(torch.randn(32, 64, 56, 56, device="cuda").half(), "nhwc")
        per_algo(x, to_layout(torch.randn(64, 64, 1, 1, device="cuda").half(), "nhwc"), 0,
                 "fp16 nhwc 32x64x56x56, 1x1 64->64")
    if not a.skip_resnet:
        res = resnet(a.batch, a.layers, a.iterations, [m for m in a.modes.split(",") if m])
        print("\n== summary: geomean torch(cudnn.benchmark=True) / rawconv fastest legacy algo")
        for k, v in res.items():
            print(f"  {k:<9} {v:.3f}")


if __name__ == "__main__":
    main()
