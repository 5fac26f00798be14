"""ResNet-50 inference: torch (eager, BN folded by torch.fx, torch.compile, torch.compile with inductor
freezing) against rawconv.nn.convert(fuse=True, autotune=example), in one process.

CUDA (default when a GPU is there): batch 32, float16, channels_last, eval, random weights. Per
variant: GPU time per batch (calls queued behind a busy GPU: rawconv.bench.time_cuda_queued, so the
host's launch time is left out) and wall time per batch (back-to-back calls, one synchronize);
rawconv also under a CUDA graph (captured after warm-up on a side stream) with its wall time; the
autotune time cold (process and tuning caches cleared) and warm (second convert); every output
against eager (and against float64 with --ref64) within the dtype's tolerance. CPU (--device cpu):
float32, batch 8, --threads N: eager NCHW and channels_last, torch.compile, torch.compile with
freezing, rawconv converted (prepacked weights, oneDNN post-ops for bias, ReLU and the residual sum)
on NCHW and channels_last input.

    python benchmarks/bench_resnet50.py                                   # the H200 run
    python benchmarks/bench_resnet50.py --device cpu --threads 8          # the CPU run
    python benchmarks/bench_resnet50.py --device cpu --batch 1 --size 64 --variants eager,rawconv  # quick

torchvision's resnet50 when ``import torchvision`` works, else the same architecture defined here
(--base-width shrinks it for smoke tests). Prints one table with ratios against torch.compile with
freezing and against eager; --json writes the rows.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import time
import warnings

import torch
import torch.nn as nn

if __package__ in (None, ""):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import rawconv.nn as rnn  # noqa: E402
from rawconv.bench import time_cuda_queued  # noqa: E402

VARIANTS_CUDA = ("eager", "fx_bn_fold", "compile", "compile_freezing", "compile_reduce_overhead", "rawconv",
                 "rawconv_cudagraph", "rawconv_compile", "rawconv_compile_cudagraph", "rawconv_reduce_overhead")
VARIANTS_CPU = ("eager", "channels_last", "compile", "compile_freezing", "rawconv", "rawconv_channels_last",
                "rawconv_compile")
EXTRA_VARIANTS = ("rawconv_default",)   # asked for by name only (--variants)


# ---------------------------------------------------------------------------- the model
class Bottleneck(nn.Module):
    """torchvision's Bottleneck (ResNet v1.5: stride in the 3x3)."""

    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    """torchvision's ResNet with Bottleneck blocks [3, 4, 6, 3] (ResNet-50), same module names;
    ``base`` (64 in ResNet-50) scales every width."""

    def __init__(self, layers=(3, 4, 6, 3), base=64, num_classes=1000):
        super().__init__()
        self.inplanes = base
        self.conv1 = nn.Conv2d(3, base, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(base)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._make_layer(base, layers[0])
        self.layer2 = self._make_layer(base * 2, layers[1], stride=2)
        self.layer3 = self._make_layer(base * 4, layers[2], stride=2)
        self.layer4 = self._make_layer(base * 8, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(base * 8 * 4, num_classes)

    def _make_layer(self, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * 4:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes * 4, 1, stride=stride, bias=False),
                                       nn.BatchNorm2d(planes * 4))
        layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * 4
        layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def build_resnet50(base: int = 64, seed: int = 0) -> tuple[nn.Module, str]:
    """(ResNet-50 in eval mode with random weights and BatchNorm statistics, where it came from)."""
    torch.manual_seed(seed)
    source = "rawconv's definition (torchvision's architecture)"
    model = None
    if base == 64:
        try:
            import torchvision

            model = torchvision.models.resnet50(weights=None)
            source = f"torchvision {torchvision.__version__}"
        except ImportError:
            pass
    if model is None:
        model = ResNet(base=base)
        for m in model.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    g = torch.Generator().manual_seed(seed + 1)
    for m in model.modules():   # non-trivial statistics, so that folding them is exercised
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.rand(m.num_features, generator=g) * 0.2 - 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) * 0.5 + 0.75)
            m.weight.data.copy_(torch.rand(m.num_features, generator=g) * 0.5 + 0.5)
            m.bias.data.copy_(torch.rand(m.num_features, generator=g) * 0.2 - 0.1)
    return model.eval(), source


# ---------------------------------------------------------------------------- timing
def wall_ms(fn, device: str, iterations: int) -> float:
    """Wall milliseconds per call: ``iterations`` back-to-back calls, one synchronize (CUDA)."""
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(iterations):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / iterations * 1e3)
    return best


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    """max |y - ref| / max |ref| (normwise), in float64 on the CPU."""
    a, b = y.detach().double().cpu(), ref.detach().double().cpu()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def graph_capture(model, x):
    """(torch.cuda.CUDAGraph, static output) of ``model(x)`` captured after warm-up on a side stream."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(3):
            model(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g), torch.no_grad():
        out = model(x)
    return g, out


def cuda_graph(model, x):
    """(replay function, static output) of ``model(x)`` captured in a CUDA graph after warm-up on a side stream."""
    g, out = graph_capture(model, x)
    return g.replay, out


# ---------------------------------------------------------------------------- the variants
def make_variants(model, x, args, log) -> dict:
    """name -> (callable running one batch, note). Builds (compiles, converts, tunes) each variant."""
    dev = args.device
    out = {}
    want = args.variants

    def timed_build(name, build):
        t0 = time.perf_counter()
        try:
            fn, note = build()
        except Exception as exc:   # noqa: BLE001  (a variant that cannot be built is a row, not a crash)
            log(f"  {name}: {type(exc).__name__}: {exc}")
            out[name] = (None, f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
            return
        with torch.no_grad():
            fn()   # first call (compilation happens here)
        if dev == "cuda":
            torch.cuda.synchronize()
        secs = time.perf_counter() - t0
        out[name] = (fn, (note + "; " if note else "") + f"build {secs:.1f} s")
        log(f"  {name}: ready ({secs:.1f} s)")

    def nograd(f):
        def g():
            with torch.no_grad():
                return f()
        return g

    if "eager" in want:
        timed_build("eager", lambda: (nograd(lambda: model(x)), ""))
    if "channels_last" in want:
        xc = x.to(memory_format=torch.channels_last)
        mc = copy.deepcopy(model).to(memory_format=torch.channels_last)
        timed_build("channels_last", lambda: (nograd(lambda: mc(xc)), ""))
    if "fx_bn_fold" in want:
        def fx():
            from torch.fx.experimental.optimization import fuse
            fm = fuse(copy.deepcopy(model))
            return nograd(lambda: fm(x)), "torch.fx.experimental.optimization.fuse"
        timed_build("fx_bn_fold", fx)
    # each variant compiles on its first call with its own inductor settings: torch.compile's
    # options= (a backend of its own, so dynamo's cache does not hand one variant's code to
    # another) and the same settings patched into the global config while it compiles (dynamo reads
    # freezing from there when it traces). torch._dynamo.reset() is never called: it would throw
    # away the variants compiled before, which would then recompile at their timing under whatever
    # global settings are left.
    import torch._inductor.config as icfg

    def compiled(m, example, note, fullgraph=False, **settings):
        cm = torch.compile(m, fullgraph=fullgraph, options=settings)
        with icfg.patch(**settings), torch.no_grad():
            cm(example)
        return nograd(lambda: cm(example)), note, cm

    if "compile" in want:
        timed_build("compile", lambda: compiled(copy.deepcopy(model), x, "torch.compile default", freezing=False)[:2])
    if "compile_freezing" in want:
        timed_build("compile_freezing", lambda: compiled(copy.deepcopy(model), x, "torch._inductor.config.freezing = True",
                                                         freezing=True)[:2])

    def reduce_overhead(m, example, note):
        # CUDA graph trees: the output of one replay is overwritten by the next, so each call's
        # result is cloned (as a caller keeping it must), which the wall time then includes alike
        cm = torch.compile(m, mode="reduce-overhead")
        with torch.no_grad():
            for _ in range(3):
                cm(example)
        return nograd(lambda: cm(example).clone()), note

    if "compile_reduce_overhead" in want and dev == "cuda":
        timed_build("compile_reduce_overhead", lambda: reduce_overhead(
            copy.deepcopy(model), x, "torch.compile(mode='reduce-overhead'): CUDA graph trees, output cloned"))
    rawconv_wanted = [v for v in want if v.startswith("rawconv")]
    if rawconv_wanted:
        xc = x.to(memory_format=torch.channels_last)
        tuned_on = {}

        def conv_model(example):
            t0 = time.perf_counter()
            m = rnn.convert(model, fuse=True, autotune=None if args.no_autotune else example,
                            autotune_budget_s=args.autotune_budget)
            return m, time.perf_counter() - t0

        # cold: the process's winners and cuDNN's tuning cache cleared; warm: the same convert again
        first = x if ("rawconv" in want or dev == "cuda") else xc
        rnn.clear_tuning()
        if dev == "cuda":
            from rawconv import cudnn_graph
            cudnn_graph.clear_tuning_cache()
        rm, cold = conv_model(first)
        _, warm = conv_model(first)
        tuned_on[first is xc] = rm
        rep = rm.rawconv_report
        out["_rawconv_info"] = {"convert_cold_s": cold, "convert_warm_s": warm, "autotune_cold_s": rep.autotune_s,
                                "report": str(rep)}
        log("  " + str(rep).replace("\n", "\n  "))
        if args.tuned:
            for t in rep.tuned:
                if t["searched"]:
                    parts = " ".join(f"{k} {t[k]:.2f}" for k in ("plan_s", "search_s") if t.get(k) is not None)
                    log(f"    {t['seconds']:6.2f} s ({parts})  {t['kind']:<6} {t['problem']:<48} {t['choice']}"
                        + (f"  [{t['note'][:100]}]" if t.get("note") else ""))
        log(f"  convert + autotune: cold {cold:.2f} s, warm {warm:.2f} s")
        note = f"{len(rep.fused)} convs fused"
        if "rawconv" in want:
            timed_build("rawconv", lambda: (nograd(lambda: rm(x)), note))
        if "rawconv_channels_last" in want:
            rmc = tuned_on.get(True) or conv_model(xc)[0]
            timed_build("rawconv_channels_last", lambda: (nograd(lambda: rmc(xc)), note + "; channels_last input"))
        if "rawconv_default" in want:
            def default():
                md = rnn.convert(model, fuse=True)
                xin = x if dev == "cuda" else xc
                return nograd(lambda: md(xin)), "convert(fuse=True) without autotune: the libraries' first choices" \
                    + ("" if dev == "cuda" else "; channels_last input")
            timed_build("rawconv_default", default)
        if "rawconv_cudagraph" in want and dev == "cuda":
            def graph():
                replay, static_out = cuda_graph(rm, x)
                return (lambda: (replay(), static_out)[1]), "torch.cuda.graph replay (input fixed)"
            timed_build("rawconv_cudagraph", graph)
        if "rawconv_compile" in want or "rawconv_compile_cudagraph" in want:
            # the converted model under torch.compile: rawconv's operators stay as they are (pinned
            # choices, fused bias/ReLU/residual), inductor generates the rest (max pool, mean, linear)
            rmx = rm if dev == "cuda" else (tuned_on.get(True) or conv_model(xc)[0])
            xin = x if dev == "cuda" else xc
            made = {}

            def comp_rm():
                fn, n, made["cm"] = compiled(
                    rmx, xin, note + "; torch.compile(fullgraph=True) of the converted model", fullgraph=True,
                    freezing=False)
                return fn, n
            if "rawconv_compile" in want:
                timed_build("rawconv_compile", comp_rm)
            if "rawconv_compile_cudagraph" in want and dev == "cuda":
                def comp_graph():
                    if "cm" not in made:
                        comp_rm()
                    replay, static_out = cuda_graph(made["cm"], x)
                    return (lambda: (replay(), static_out)[1]), "compiled converted model, torch.cuda.graph replay"
                timed_build("rawconv_compile_cudagraph", comp_graph)
        if "rawconv_reduce_overhead" in want and dev == "cuda":
            timed_build("rawconv_reduce_overhead", lambda: reduce_overhead(
                rm, x, note + "; torch.compile(mode='reduce-overhead') of the converted model, output cloned"))
    return out


def run(args, log=print) -> dict:
    """Build the model and every variant, time them, check them; returns {"rows": [...], "meta": {...}}."""
    dev = args.device
    if dev == "cpu" and args.threads:
        torch.set_num_threads(args.threads)
    dtype = {"float16": torch.float16, "float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    model, source = build_resnet50(args.base_width)
    model = model.to(dev, dtype)
    if dev == "cuda":
        torch.backends.cudnn.benchmark = True
        model = model.to(memory_format=torch.channels_last)
    g = torch.Generator().manual_seed(123)
    x = torch.randn(args.batch, 3, args.size, args.size, generator=g).to(dev, dtype)
    if dev == "cuda":
        x = x.to(memory_format=torch.channels_last)
    log(f"ResNet-50 ({source}), {dev}, batch {args.batch}, {args.size}x{args.size}, {args.dtype}, "
        f"threads {torch.get_num_threads()}, torch {torch.__version__}"
        + (", glibc mallopt: large blocks reused (--mallopt)" if args.mallopt else ""))
    variants = make_variants(model, x, args, log)
    info = variants.pop("_rawconv_info", {})
    with torch.no_grad():
        y_eager = model(x) if "eager" in variants else None
        ref64 = None
        if args.ref64:
            m64 = copy.deepcopy(model).to("cpu", torch.float64).to(memory_format=torch.contiguous_format)
            ref64 = m64(x.to("cpu", torch.float64).contiguous())
    tol = {"float16": 2e-2, "bfloat16": 6e-2, "float32": 1e-4}[args.dtype]
    rows = []
    cpu_profiles = {}
    for name, (fn, note) in variants.items():
        row = {"variant": name, "note": note, "gpu_ms": None, "wall_ms": None, "err_vs_eager": None,
               "err_vs_f64": None, "ok": None}
        if fn is None:
            rows.append(row)
            continue
        with torch.no_grad():
            y = fn()
        if isinstance(y, torch.Tensor):
            if y_eager is not None:
                row["err_vs_eager"] = rel_err(y, y_eager)
                row["ok"] = row["err_vs_eager"] <= tol
            if ref64 is not None:
                row["err_vs_f64"] = rel_err(y, ref64)
        if dev == "cuda":
            # few batches per queued group: a forward launches ~150-250 kernels, and the launch queue
            # (about a thousand entries) must hold the whole group behind the GPU sleep, or the host's
            # launch time leaks into the measurement; more repeats instead
            row["gpu_ms"] = time_cuda_queued(fn, iterations=args.gpu_batches, warmup=2, repeats=7).median_ms
            row["wall_ms"] = wall_ms(fn, dev, args.iterations)
        rows.append(row)
        if dev == "cuda":
            log(f"  {name}: {row['gpu_ms']:.3f} ms")
        if dev == "cuda" and args.profile and not name.endswith("cudagraph"):
            log(kernel_profile(name, fn, args.profile))
    if dev == "cpu":
        # the variants take turns batch by batch (a machine whose speed drifts during the run moves
        # every variant alike, so the ratios hold), then each one's median and min
        timed = {r["variant"]: variants[r["variant"]][0] for r in rows if variants[r["variant"]][0] is not None}
        stats = time_cpu_interleaved(timed, args.iterations, warmup=1)
        for r in rows:
            if r["variant"] in stats:
                r["wall_ms"], r["min_ms"] = stats[r["variant"]]
                log(f"  {r['variant']}: median {r['wall_ms']:.3f} ms, min {r['min_ms']:.3f} ms")
        if args.profile:
            for name, fn in timed.items():
                text, per_shape = onednn_profile(name, fn, args.profile)
                log(text)
                cpu_profiles[name] = per_shape
    if cpu_profiles:
        log(onednn_profile_table(cpu_profiles))
    meta = {"device": dev, "batch": args.batch, "size": args.size, "dtype": args.dtype,
            "threads": torch.get_num_threads(), "torch": torch.__version__, "model": source,
            "cpu": _cpu_name(), "gpu": torch.cuda.get_device_name() if dev == "cuda" else None,
            "tolerance_vs_eager": tol, **info}
    return {"rows": rows, "meta": meta}


def set_mallopt(threshold: int = 1 << 30) -> None:
    """glibc's ``mallopt(M_MMAP_THRESHOLD)`` and ``mallopt(M_TRIM_THRESHOLD)``: blocks up to
    ``threshold`` bytes come from the heap and freed ones stay there for reuse, instead of a fresh
    ``mmap`` per large tensor whose pages fault in when first written (torch's CPU allocator is
    malloc). Process-wide, for every variant alike; raises OSError off glibc."""
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    if not (libc.mallopt(M_MMAP_THRESHOLD, threshold) and libc.mallopt(M_TRIM_THRESHOLD, threshold)):
        raise OSError("mallopt refused the thresholds")


def kernel_profile(name: str, fn, batches: int) -> str:
    """The CUDA kernels of ``batches`` calls of ``fn`` (torch.profiler, CUPTI): GPU microseconds per
    batch by kernel name (top 15, and the sums of convolution-like and other kernels), then the
    first batch's kernels in launch order (which layer each one is follows from the order)."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(batches):
                fn()
            torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and not e.name.startswith(("Memcpy", "Memset"))]
    kernels.sort(key=lambda e: e.time_range.start)
    per = len(kernels) // batches if batches else 0
    conv_words = ("conv", "fprop", "xmma", "implicit", "gemm", "cudnn", "sm90_", "sm80_", "cutlass", "nhwc")
    by: dict = {}
    for e in kernels:
        by[e.name] = by.get(e.name, 0.0) + e.device_time / batches
    conv_us = sum(v for k, v in by.items() if any(c in k.lower() for c in conv_words))
    total = sum(by.values())
    lines = [f"  profile {name}: {len(kernels)} kernels in {batches} batches ({per} per batch), kernel GPU time "
             f"{total:.1f} us per batch: convolution-like {conv_us:.1f}, other {total - conv_us:.1f}"]
    for k, v in sorted(by.items(), key=lambda kv: -kv[1])[:15]:
        lines.append(f"    {v:9.1f} us  {k[:150]}")
    lines.append(f"  {name}, batch 1 in launch order (us, name):")
    for i, e in enumerate(kernels[:per]):
        lines.append(f"    {i:3d} {e.device_time:8.1f}  {e.name[:140]}")
    return "\n".join(lines)


def time_cpu_interleaved(fns: dict, rounds: int, warmup: int = 1) -> dict:
    """``{name: (median ms, min ms)}`` of ``rounds`` rounds in which every function runs once,
    timed alone with ``time.perf_counter`` (after ``warmup`` untimed rounds)."""
    with torch.no_grad():
        for _ in range(warmup):
            for fn in fns.values():
                fn()
        times: dict = {name: [] for name in fns}
        for _ in range(rounds):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - t0) * 1e3)
    return {name: (sorted(v)[len(v) // 2], min(v)) for name, v in times.items()}


def onednn_profile(name: str, fn, batches: int) -> tuple[str, dict]:
    """What oneDNN itself executes in ``batches`` calls of ``fn`` on the CPU, both copies: torch's
    bundled oneDNN (``torch.backends.mkldnn.verbose``, lines ``onednn_verbose,v1,...``) and
    rawconv's libdnnl 3.2 (``dnnl_set_verbose(1)``, lines ``onednn_verbose,exec,...``), captured
    from the C stdout. Each line carries oneDNN's own time of the call (ms). Returns the text (ms
    per batch by library, primitive kind and implementation; the rest of the wall time is outside
    oneDNN) and ``{(kind, shape, attrs or formats): (ms per batch, {implementations})}``."""
    from rawconv.onednn import _ffi as _dnnl
    from rawconv.torch_choice import _capture_fd1, parse_onednn_verbose

    def body():
        _dnnl.set_verbose(1)
        try:
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON), torch.no_grad():
                t0 = time.perf_counter()
                for _ in range(batches):
                    fn()
                return (time.perf_counter() - t0) / batches * 1e3
        finally:
            _dnnl.set_verbose(0)

    with torch.no_grad():
        fn()
    wall, text = _capture_fd1(body)
    groups: dict = {}
    per_shape: dict = {}
    total = 0.0
    for line in text.splitlines():
        if not line.startswith("onednn_verbose"):
            continue
        lib = "torch" if line.startswith("onednn_verbose,v1,") else "rawconv"
        runs = parse_onednn_verbose(line)
        if not runs or runs[0].time_ms is None:
            continue
        r = runs[0]
        ms = r.time_ms / batches
        total += ms
        k = (lib, r.kind, r.impl)
        c, t = groups.get(k, (0, 0.0))
        groups[k] = (c + 1, t + ms)
        sk = (r.kind, r.shape, r.attrs.strip() if r.kind == "convolution" else r.formats)
        t0_, impls = per_shape.get(sk, (0.0, set()))
        impls.add(r.impl)
        per_shape[sk] = (t0_ + ms, impls)
    lines = [f"  oneDNN profile {name}: {batches} batches; oneDNN's own time {total:.2f} ms per batch, wall under "
             f"verbose {wall:.2f} ms (the rest is outside oneDNN, plus the tracing itself)"]
    for (lib, kind, impl), (c, t) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"    {t:9.3f} ms  {c // batches:4d} calls  {lib:<8} {kind:<14} {impl}")
    return "\n".join(lines), per_shape


def onednn_profile_table(profiles: dict) -> str:
    """Per convolution (problem, post-ops) and reorder: oneDNN's ms per batch in each profiled variant."""
    names = list(profiles)
    ms = lambda n, k: profiles[n].get(k, (0.0, ()))[0]  # noqa: E731
    keys = sorted({k for p in profiles.values() for k in p}, key=lambda k: -max(ms(n, k) for n in names))
    lines = ["  oneDNN ms per batch by primitive (problem; post-ops or formats; implementations): " + " | ".join(names)]
    for k in keys:
        vals = " ".join(f"{ms(n, k):9.3f}" for n in names)
        impls = " | ".join(",".join(sorted(profiles[n][k][1])) if k in profiles[n] else "-" for n in names)
        post = k[2].replace("attr-scratchpad:user", "").replace("attr-post-ops:", "").strip() if k[0] == "convolution" \
            else k[2]
        lines.append(f"    {vals}  {k[0][:6]:<6} {k[1]:<52} {post[:60]:<16} {impls}")
    lines.append("    " + " ".join(f"{sum(v[0] for v in profiles[n].values()):9.3f}" for n in names) + "  total")
    return "\n".join(lines)


def _cpu_name() -> str:
    from rawconv.onednn import cpu_model as _cpu_model

    return _cpu_model()


def _ok_mark(r) -> str:
    return "-" if r.get("ok") is None else ("ok" if r["ok"] else "WRONG")


def headline(result: dict) -> str:
    """The best correct rawconv row against the best correct torch row (GPU time on CUDA, and wall
    time: what a user waits for). A row outside the tolerance, or unchecked, is never a headline."""
    rows = [r for r in result["rows"] if r.get("ok") and (r.get("gpu_ms") or r.get("wall_ms"))]
    lines = []
    for key, word in (("gpu_ms", "GPU time"), ("wall_ms", "wall time")):
        have = [r for r in rows if r.get(key)]
        raw = [r for r in have if r["variant"].startswith("rawconv")]
        peer = [r for r in have if not r["variant"].startswith("rawconv")]
        if not raw or not peer:
            continue
        br = min(raw, key=lambda r: r[key])
        bp = min(peer, key=lambda r: r[key])
        lines.append(f"headline ({word}, correct rows only): rawconv {br['variant']} {br[key]:.3f} ms vs torch "
                     f"{bp['variant']} {bp[key]:.3f} ms: {bp[key] / br[key]:.3f}x")
    wrong = [r["variant"] for r in result["rows"] if r.get("ok") is False]
    if wrong:
        lines.append("WRONG (outside the tolerance, left out of every headline): " + ", ".join(wrong))
    return "\n".join(lines)


def table(result: dict) -> str:
    """The rows as a table, with ratios against torch.compile+freezing and against eager (>1: faster);
    ``ok``: the output within the dtype's tolerance of eager (WRONG rows are never a headline)."""
    rows = result["rows"]
    key = "gpu_ms" if result["meta"]["device"] == "cuda" else "wall_ms"
    by = {r["variant"]: r[key] for r in rows}
    freeze, eager = by.get("compile_freezing"), by.get("eager")
    lines = [f"{'variant':<26} {'ok':>5} {'GPU ms':>9} {'wall ms':>9} {'vs freezing':>12} {'vs eager':>9} "
             f"{'err vs eager':>13} {'err vs f64':>11}  note"]
    for r in rows:
        t = r[key]
        f = lambda v, fmt: format(v, fmt) if v is not None else format("-", ">" + fmt.split(".")[0])  # noqa: E731
        ratio_f = freeze / t if (t and freeze) else None
        ratio_e = eager / t if (t and eager) else None
        x_f = f"{ratio_f:.2f}x" if ratio_f is not None else "-"
        x_e = f"{ratio_e:.2f}x" if ratio_e is not None else "-"
        lines.append(f"{r['variant']:<26} {_ok_mark(r):>5} {f(r['gpu_ms'], '9.3f')} {f(r['wall_ms'], '9.3f')} "
                     f"{x_f:>12} {x_e:>9} {f(r['err_vs_eager'], '13.2e')} "
                     f"{f(r['err_vs_f64'], '11.2e')}  {r['note']}")
    if result["meta"]["device"] == "cuda":
        lines.append("GPU ms: GPU time per batch, calls queued behind a busy GPU; wall ms: back-to-back calls, "
                     "one synchronize (host-bound when above GPU ms)")
    else:
        mins = [f"{r['variant']} {r['min_ms']:.3f}" for r in rows if r.get("min_ms") is not None]
        lines.append("wall ms: median time per batch (perf_counter), the variants taking turns batch by batch"
                     + ("; min: " + ", ".join(mins) if mins else ""))
    m = result["meta"]
    if "convert_cold_s" in m:
        lines.append(f"rawconv convert(fuse=True, autotune=x): cold {m['convert_cold_s']:.2f} s "
                     f"(search {m['autotune_cold_s']:.2f} s), warm {m['convert_warm_s']:.2f} s")
    h = headline(result)
    if h:
        lines.append(h)
    return "\n".join(lines)


# ---------------------------------------------------------------------------- training
def _grads(model) -> list:
    return [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


def _grad_err(ref: list, got: list) -> float:
    """The worst parameter's normwise relative error ||got - ref|| / ||ref||."""
    return max(((b.double() - a.double()).norm() / a.double().norm().clamp_min(1e-30)).item()
               for a, b in zip(ref, got))


def graph_train_step(m, x, tgt, lossf, amp):
    """(torch.cuda.CUDAGraph, static loss, the optimizer) of one whole training step of ``m`` (forward under autocast
    to ``amp`` when given, cross entropy, backward, SGD with lr 0 and momentum 0.9: the weights stay,
    so every replay repeats the first step's loss and gradients, as the eager check computes them)
    captured after three warm-up steps on a side stream: torch's whole-network capture recipe
    (autocast's weight cache off inside the capture). The graph writes ``m``'s parameters and
    gradients and the optimizer's momentum buffers: keep both alive as long as the graph."""
    opt = torch.optim.SGD(m.parameters(), lr=0.0, momentum=0.9)

    def step():
        with torch.autocast("cuda", dtype=amp or torch.float32, enabled=amp is not None, cache_enabled=False):
            loss = lossf(m(x), tgt)
        loss.backward()
        opt.step()
        return loss
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(s)
    opt.zero_grad(set_to_none=True)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        loss = step()
    return g, loss, opt


def time_steps(steps: dict, args) -> tuple[dict, dict]:
    """``steps`` (name -> one training step) after 3 warm-up steps each: ``({name: [wall ms per step,
    one per round]}, {name: GPU ms per step})``; the sides take turns, ``args.train_rounds`` rounds of
    ``args.train_steps`` back-to-back steps (:func:`wall_ms`); GPU time (CUDA only, else empty):
    steps queued behind a busy GPU, median of 7."""
    dev = args.device
    for f in steps.values():
        for _ in range(3):
            f()
    if dev == "cuda":
        torch.cuda.synchronize()
    walls = {k: [] for k in steps}
    for _ in range(args.train_rounds):
        for k, f in steps.items():
            walls[k].append(wall_ms(f, dev, args.train_steps))
    gpu = {}
    if dev == "cuda":
        for k, f in steps.items():
            gpu[k] = time_cuda_queued(f, iterations=1, warmup=1, repeats=7).median_ms
    return walls, gpu


def train_table(args, log=print) -> dict:
    """One training step (forward, cross-entropy, backward, SGD) of ResNet-50 in train mode: torch
    (CUDA: cudnn.benchmark) against rawconv.nn.convert(model) (every conv on rawconv's operators,
    BatchNorm as torch's), per precision mode, in one process, the two taking turns. Per row: the
    step's wall time (back-to-back steps, one synchronize) and, on CUDA, its GPU time (steps queued
    behind a busy GPU); the first step's loss and every gradient against torch's from the same
    weights and batch (the worst parameter's normwise relative error), beside torch's own spread: the
    same error between torch on channels_last and torch on NCHW (the same model, only cuDNN's kernels
    differ; in a 50-layer network with BatchNorm in training mode such differences grow to ~1e-2).
    ``ok``: the loss within the mode's tolerance and the gradients within twice torch's spread (or
    the mode's tolerance, if larger)."""
    dev = args.device
    if dev == "cpu" and args.threads:
        torch.set_num_threads(args.threads)
    model, source = build_resnet50(args.base_width)
    model = model.train().to(dev)
    batch = args.train_batch or (32 if dev == "cuda" else 8)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(batch, 3, args.size, args.size, generator=g).to(dev)
    tgt = torch.randint(0, 1000, (batch,), generator=g).to(dev)
    fmt = torch.channels_last
    model = model.to(memory_format=fmt)
    x = x.contiguous(memory_format=fmt)
    if dev == "cuda":
        torch.backends.cudnn.benchmark = True
        cases = [("fp32 (TF32 off)", None, False, "strict", 1e-3), ("fp32 TF32", None, True, "tf32", 5e-2),
                 ("autocast fp16", torch.float16, True, "strict", 5e-2)]
    else:
        cases = [("fp32", None, False, "strict", 1e-3)]
        try:
            from rawconv import onednn
            if onednn.capabilities().offered("forward", "bfloat16"):
                cases.append(("autocast bf16", torch.bfloat16, False, "strict", 1e-1))
        except Exception:   # noqa: BLE001
            pass
    if args.train_cases:
        want = [c.strip() for c in args.train_cases.split(",") if c.strip()]
        cases = [c for c in cases if any(w in c[0] for w in want)]
        if not cases:
            raise SystemExit(f"--train-cases {args.train_cases!r} names no training mode on {dev}")
    log(f"ResNet-50 training step ({source}), {dev}, batch {batch}, {args.size}x{args.size}, channels_last, "
        f"threads {torch.get_num_threads()}, torch {torch.__version__}, rawconv "
        + ("autotuned (autotune=x, autotune_new='search')" if args.train_autotune else "on the libraries' default choices"))
    lossf = nn.CrossEntropyLoss()
    rows = []
    for label, amp, tf32, precision, tol in cases:
        if dev == "cuda":
            torch.backends.cudnn.allow_tf32 = tf32
            torch.backends.cuda.matmul.allow_tf32 = tf32
        tm = copy.deepcopy(model)

        def converted():
            """rawconv's model; with --train-autotune tuned as torch's cudnn.benchmark tunes: the example's
            problems (forward and both backward passes) searched at convert, the others (autocast's
            float16 ones) at their first call (autotune_new="search"), each once, pinned."""
            if not args.train_autotune:
                return rnn.convert(copy.deepcopy(model), precision=precision)
            return rnn.convert(copy.deepcopy(model), precision=precision, autotune=x, autotune_new="search",
                               autotune_budget_s=args.autotune_budget)
        rm = converted()

        def stepper(m):
            opt = torch.optim.SGD(m.parameters(), lr=1e-4, momentum=0.9)

            def step():
                opt.zero_grad(set_to_none=True)
                with torch.autocast(dev, dtype=amp or torch.float32, enabled=amp is not None):
                    loss = lossf(m(x), tgt)
                loss.backward()
                opt.step()
                return loss
            return step
        # correctness: the first step from the same weights (before any update)
        check = {}
        for name, m in (("torch", copy.deepcopy(model)), ("rawconv", converted()),
                        ("torch_nchw", copy.deepcopy(model).to(memory_format=torch.contiguous_format))):
            xin = x.contiguous() if name == "torch_nchw" else x
            with torch.autocast(dev, dtype=amp or torch.float32, enabled=amp is not None):
                loss = lossf(m(xin), tgt)
            loss.backward()
            check[name] = (loss.detach().float(), _grads(m))
        lerr = (abs(check["rawconv"][0] - check["torch"][0]) / abs(check["torch"][0])).item()
        gerr = _grad_err(check["torch"][1], check["rawconv"][1])
        spread = _grad_err(check["torch"][1], check["torch_nchw"][1])
        walls, gpu = time_steps({"torch": stepper(tm), "rawconv": stepper(rm)}, args)
        row = {"mode": label, "torch_wall_ms": min(walls["torch"]), "rawconv_wall_ms": min(walls["rawconv"]),
               "torch_gpu_ms": gpu.get("torch"), "rawconv_gpu_ms": gpu.get("rawconv"), "loss_err": lerr,
               "grad_err": gerr, "torch_spread": spread, "ok": lerr <= tol and gerr <= max(2 * spread, tol),
               "tolerance": tol}
        rows.append(row)
        if dev == "cuda" and args.train_graph:
            # the same step captured whole in a CUDA graph (no host work per step), both sides; ok: the
            # first replay's loss and gradients against torch's eager step, as above
            graphs = {}
            for name, m in (("torch", copy.deepcopy(model)), ("rawconv", converted())):
                g, gl, opt = graph_train_step(m, x, tgt, lossf, amp)
                g.replay()
                torch.cuda.synchronize()
                graphs[name] = (g, gl.detach().float().clone(), _grads(m), m, opt)   # (m, opt: the graph's memory)
            gw = {k: [] for k in graphs}
            for _ in range(args.train_rounds):
                for k, (g, *_) in graphs.items():
                    gw[k].append(wall_ms(g.replay, dev, args.train_steps))
            gg = {k: time_cuda_queued(g.replay, iterations=1, warmup=1, repeats=7).median_ms
                  for k, (g, *_) in graphs.items()}
            glerr = {k: (abs(v[1] - check["torch"][0]) / abs(check["torch"][0])).item() for k, v in graphs.items()}
            ggerr = {k: _grad_err(check["torch"][1], v[2]) for k, v in graphs.items()}
            ok = all(glerr[k] <= tol and ggerr[k] <= max(2 * spread, tol) for k in graphs)
            rows.append({"mode": label + ", CUDA graph", "torch_wall_ms": min(gw["torch"]),
                         "rawconv_wall_ms": min(gw["rawconv"]), "torch_gpu_ms": gg["torch"],
                         "rawconv_gpu_ms": gg["rawconv"], "loss_err": glerr["rawconv"], "grad_err": ggerr["rawconv"],
                         "torch_spread": spread, "ok": ok, "tolerance": tol,
                         "torch_graph_grad_err": ggerr["torch"]})
            log(f"  {label}, CUDA graph: wall torch {min(gw['torch']):.2f} ms, rawconv {min(gw['rawconv']):.2f} ms; "
                f"GPU torch {gg['torch']:.2f} ms, rawconv {gg['rawconv']:.2f} ms; loss err {glerr['rawconv']:.1e}, "
                f"grad err {ggerr['rawconv']:.1e} (torch's graph: {ggerr['torch']:.1e}); {'ok' if ok else 'WRONG'}")
            del graphs
        log(f"  {label}: wall torch {row['torch_wall_ms']:.2f} ms, rawconv {row['rawconv_wall_ms']:.2f} ms; "
            f"loss err {lerr:.1e}, grad err {gerr:.1e} (torch's own spread {spread:.1e})")
        if args.train_compile:
            rows.append(compiled_train_row(args, label, model, converted, x, tgt, lossf, amp, stepper, check, spread,
                                           tol, log))
    if dev == "cuda":
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cuda.matmul.allow_tf32 = False
    return {"rows": rows, "meta": {"device": dev, "batch": batch, "model": source, "torch": torch.__version__,
                                   "threads": torch.get_num_threads(), "rawconv_autotune": args.train_autotune}}


def compiled_train_row(args, label, model, converted, x, tgt, lossf, amp, stepper, check, spread, tol, log) -> dict:
    """The same training step with each side's model under ``torch.compile`` (default mode: inductor,
    no CUDA graphs), torch's and rawconv's compiled alike. rawconv's convolutions stay its operators
    (opaque to inductor; the backward graph calls rawconv::conv_backward_data / _weights directly,
    with no autograd Function per call); inductor generates the rest (BatchNorm, ReLU, adds, loss).
    ok: the first compiled step's loss and gradients (from the starting weights) against torch's
    compiled step (the peer in this mode), with the eager row's tolerance; torch's compiled step
    against its eager step is logged beside."""
    dev = args.device
    comp = {}
    for name, m in (("torch", copy.deepcopy(model)), ("rawconv", converted())):
        t0 = time.perf_counter()
        cm = torch.compile(m)
        with torch.autocast(dev, dtype=amp or torch.float32, enabled=amp is not None):
            loss = lossf(cm(x), tgt)
        loss.backward()
        if dev == "cuda":
            torch.cuda.synchronize()
        comp[name] = (cm, loss.detach().float(), _grads(m), time.perf_counter() - t0)
    # errors against torch's compiled step (the peer in this mode: inductor's BatchNorm alone moves a
    # 50-layer network's gradients by about torch's own channels_last/NCHW spread), and torch's
    # compiled step against its eager one beside them
    tl, tg = comp["torch"][1], comp["torch"][2]
    lerr = (abs(comp["rawconv"][1] - tl) / abs(tl)).item()
    gerr = _grad_err(tg, comp["rawconv"][2])
    t_lerr = (abs(tl - check["torch"][0]) / abs(check["torch"][0])).item()
    t_gerr = _grad_err(check["torch"][1], tg)
    walls, gpu = time_steps({k: stepper(v[0]) for k, v in comp.items()}, args)
    ok = lerr <= tol and gerr <= max(2 * spread, tol)
    row = {"mode": label + ", torch.compile", "torch_wall_ms": min(walls["torch"]),
           "rawconv_wall_ms": min(walls["rawconv"]), "torch_gpu_ms": gpu.get("torch"), "rawconv_gpu_ms": gpu.get("rawconv"),
           "loss_err": lerr, "grad_err": gerr, "torch_spread": spread, "ok": ok, "tolerance": tol,
           "torch_compiled_vs_eager": (t_lerr, t_gerr), "compile_s": {k: v[3] for k, v in comp.items()}}
    log(f"  {label}, torch.compile: wall torch {row['torch_wall_ms']:.2f} ms, rawconv {row['rawconv_wall_ms']:.2f} ms"
        + (f"; GPU torch {gpu['torch']:.2f} ms, rawconv {gpu['rawconv']:.2f} ms" if gpu else "")
        + f"; against torch compiled: loss err {lerr:.1e}, grad err {gerr:.1e} (torch compiled against torch eager: "
        f"{t_lerr:.1e}, {t_gerr:.1e}); first step "
        f"(compile) torch {comp['torch'][3]:.1f} s, rawconv {comp['rawconv'][3]:.1f} s; {'ok' if ok else 'WRONG'}")
    return row


def train_text(result: dict) -> str:
    lines = [f"{'training step':<28} {'ok':>5} {'torch wall':>11} {'rawconv wall':>13} {'wall ratio':>11} "
             f"{'torch GPU':>10} {'rawconv GPU':>12} {'GPU ratio':>10} {'loss err':>9} {'grad err':>9} "
             f"{'torch spread':>12}"]
    for r in result["rows"]:
        wr = r["torch_wall_ms"] / r["rawconv_wall_ms"]
        gr = (r["torch_gpu_ms"] / r["rawconv_gpu_ms"]) if r["torch_gpu_ms"] else None
        f = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        lines.append(f"{r['mode']:<28} {'ok' if r['ok'] else 'WRONG':>5} {r['torch_wall_ms']:>11.2f} "
                     f"{r['rawconv_wall_ms']:>13.2f} {wr:>10.3f}x {f(r['torch_gpu_ms']):>10} "
                     f"{f(r['rawconv_gpu_ms']):>12} {('-' if gr is None else f'{gr:.3f}x'):>10} "
                     f"{r['loss_err']:>9.1e} {r['grad_err']:>9.1e} {r['torch_spread']:>12.1e}")
    lines.append("ms per step; ratio = torch / rawconv (>1: rawconv faster); wall: back-to-back steps, one "
                 "synchronize; GPU: steps queued behind a busy GPU; errors: the first step's loss and gradients "
                 "against torch's (the worst parameter's normwise relative error); torch spread: the same between "
                 "torch on channels_last and on NCHW (only cuDNN's kernels differ); CUDA graph rows: each side's whole "
                 "step (forward, backward, SGD) captured once and replayed, ok when both sides' first replay is "
                 "within the tolerance of torch's eager step; torch.compile rows: both sides' models compiled "
                 "(default mode), errors and ok of rawconv's first compiled step against torch's")
    return "\n".join(lines)


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=None, help="default 32 on CUDA, 8 on CPU")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--dtype", choices=("float16", "float32", "bfloat16"), default=None,
                    help="default float16 on CUDA, float32 on CPU")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (torch.set_num_threads)")
    ap.add_argument("--iterations", type=int, default=20, help="batches timed (wall time; CPU: rounds, every variant once per round)")
    ap.add_argument("--gpu-batches", type=int, default=4,
                    help="batches per group queued behind the GPU sleep (GPU time; 7 groups)")
    ap.add_argument("--variants", default=None, help="comma-separated subset; CUDA: " + ",".join(VARIANTS_CUDA) +
                    "; CPU: " + ",".join(VARIANTS_CPU))
    ap.add_argument("--autotune-budget", type=float, default=None, help="seconds per distinct problem (cuDNN)")
    ap.add_argument("--no-autotune", action="store_true", help="rawconv with the libraries' default choices")
    ap.add_argument("--ref64", action="store_true", help="also check every output against float64 (CPU, slow)")
    ap.add_argument("--base-width", type=int, default=64, help="64 = ResNet-50; smaller for smoke tests")
    ap.add_argument("--json", default=None, help="write the rows and metadata here")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="CUDA: also profile N batches of each variant (torch.profiler) and print its kernels' "
                         "GPU time per batch: by kernel, and one batch in launch order. CPU: N batches under "
                         "oneDNN's verbose mode (torch's oneDNN and rawconv's): oneDNN's own ms per batch by "
                         "implementation, and per convolution and reorder across the variants")
    ap.add_argument("--tuned", action="store_true", help="print each distinct problem's autotune seconds and choice")
    ap.add_argument("--train", action="store_true", help="the training table instead (see train_table)")
    ap.add_argument("--train-batch", type=int, default=None, help="training batch (default 32 CUDA, 8 CPU)")
    ap.add_argument("--train-steps", type=int, default=5, help="steps per wall-time loop")
    ap.add_argument("--train-rounds", type=int, default=3, help="rounds, torch and rawconv taking turns")
    ap.add_argument("--train-autotune", action="store_true",
                    help="training table: rawconv converted with autotune=x, autotune_new='search' (torch: "
                         "cudnn.benchmark); --autotune-budget per problem")
    ap.add_argument("--train-cases", default="", help="training table: only the modes whose label contains one "
                    "of these comma-separated words (e.g. 'TF32,fp16'; default: all)")
    ap.add_argument("--train-graph", action="store_true",
                    help="training table, CUDA: also each step captured whole in a CUDA graph (torch's and "
                         "rawconv's), replayed: wall and GPU time without host work per step")
    ap.add_argument("--train-compile", action="store_true",
                    help="training table: also each side's model under torch.compile (default mode), torch's and "
                         "rawconv's, timed as the eager rows")
    ap.add_argument("--search-log", action="store_true", help="log the cuDNN search's phases (rawconv.search, debug)")
    ap.add_argument("--mallopt", action="store_true",
                    help="CPU: glibc keeps freed large blocks for reuse (mallopt M_MMAP_THRESHOLD and "
                         "M_TRIM_THRESHOLD 1 GiB, as MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_ do), for every "
                         "variant: each new activation otherwise gets fresh pages, faulted in on first touch")
    args = ap.parse_args(argv)
    if args.batch is None:
        args.batch = 32 if args.device == "cuda" else 8
    if args.dtype is None:
        args.dtype = "float16" if args.device == "cuda" else "float32"
    allowed = VARIANTS_CUDA if args.device == "cuda" else VARIANTS_CPU
    args.variants = tuple(args.variants.split(",")) if args.variants else allowed
    bad = [v for v in args.variants if v not in allowed + EXTRA_VARIANTS]
    if bad:
        ap.error(f"unknown variants for {args.device}: {bad}; choose from {list(allowed)}")
    return args


def main(argv=None) -> dict:
    args = parse(argv)
    if args.mallopt:
        set_mallopt()
    if args.search_log:
        import logging
        logging.basicConfig(format="    %(name)s: %(message)s")
        logging.getLogger("rawconv.search").setLevel(logging.DEBUG)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        if args.train:
            result = train_table(args)
            print(train_text(result))
        else:
            result = run(args)
            print(table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=str)
    return result


if __name__ == "__main__":
    main()
