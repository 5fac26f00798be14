"""The model zoo of issue 33: architectures nobody on the project wrote, with random weights (nothing
downloaded), each in torch and in rawconv, for speed and correctness, on CUDA or the CPU.

Per model and variant one row: the time per batch, its ratio against torch eager and against
torch.compile (the peer; on the CPU compiled with inductor freezing), the output's error against a
float64 reference of the same model (the fp16/fp32 weights and input, upcast) beside torch eager's
own error against it (the noise floor), and a status (ok / WRONG / ERROR and the exception's first
line: one model or variant failing never stops the run). Then one training step per model (forward,
loss, backward, SGD step) in torch and in ``rawconv.nn.convert(model)``, its gradients against a
float64 step. A summary ends the table: WRONG and ERROR counts, geometric means of the ratios per
variant and the worst model, and the issue's targets.

Variants (--variants):
  eager                      torch eager (CUDA: cudnn.benchmark = True)
  eager_cudagraph            the same captured in a CUDA graph and replayed (CUDA)
  compile                    torch.compile (CUDA: default mode; CPU: inductor freezing, compiled under no_grad)
  compile_cudagraph          the compiled model captured in a CUDA graph (CUDA)
  rawconv                    rawconv.nn.convert(model, fuse=True, autotune=x), eager
  rawconv_cudagraph          the same captured in a CUDA graph (CUDA)
  rawconv_compile            the converted model under torch.compile (the peer's settings)
  rawconv_compile_cudagraph  the converted, compiled model captured in a CUDA graph (CUDA)
Time: CUDA: GPU time per batch (CUDA-graph replays, or calls queued behind torch.cuda._sleep:
rawconv.bench.time_cuda_queued), with the wall time of back-to-back calls beside it; CPU: wall time
per batch, the variants taking turns batch by batch (median and min over --rounds rounds).

    python benchmarks/zoo.py                                         # GPU: b32 fp16 channels_last, every model
    python benchmarks/zoo.py --models resnet50,convnext_tiny --json zoo.json
    python benchmarks/zoo.py --device cpu --threads 8                # CPU: b4 fp32 channels_last
    python benchmarks/zoo.py --device cpu --batch 1 --threads 2 --size 64 --models unet,m5   # a quick look
    python benchmarks/zoo.py --depthwise                             # the per-layer depthwise table

--depthwise: ConvNeXt's depthwise 7x7 layers and MobileNetV3's / EfficientNet-B0's 3x3 and 5x5
depthwise layers alone: torch (cudnn.benchmark) against rawconv's module default, convert(autotune)
and convert(fuse=True, autotune), with what torch ran (rawconv.torch_choice).
"""
from __future__ import annotations

import argparse
import copy
import datetime
import gc
import json
import math
import os
import re
import sys
import time
import traceback
import warnings
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
if __package__ in (None, ""):
    sys.path.insert(0, os.path.join(HERE, ".."))
    sys.path.insert(0, HERE)

import rawconv.nn as rnn  # noqa: E402
from rawconv.bench import geomean, time_cuda_queued  # noqa: E402
from bench_resnet50 import graph_capture, rel_err, time_cpu_interleaved, time_steps, wall_ms  # noqa: E402

VARIANTS_CUDA = ("eager", "eager_cudagraph", "compile", "compile_cudagraph", "rawconv", "rawconv_cudagraph",
                 "rawconv_compile", "rawconv_compile_cudagraph")
VARIANTS_CPU = ("eager", "compile", "rawconv", "rawconv_compile")
#: the rows of the training step (not --variants: --train / --no-train)
TRAIN_ROWS = ("train_torch", "train_rawconv")
INSTALL_HINT = "pip install 'rawconv[zoo]'"


# ---------------------------------------------------------------------------- models written here
class DoubleConv(nn.Sequential):
    """(conv 3x3, BatchNorm, ReLU) twice: U-Net's block."""

    def __init__(self, cin: int, cout: int):
        super().__init__(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class UNet(nn.Module):
    """A small U-Net (Ronneberger et al. 2015): ``depth`` max-pool downsamplings from ``base``
    channels, a ConvTranspose2d (k2, s2) upsampling per level, skips concatenated, a 1x1 head. The
    input's height and width must be multiples of ``2 ** depth``."""

    def __init__(self, cin: int = 3, classes: int = 2, base: int = 32, depth: int = 4):
        super().__init__()
        chans = [base * 2 ** i for i in range(depth + 1)]
        self.down = nn.ModuleList([DoubleConv(cin, chans[0])]
                                  + [DoubleConv(chans[i], chans[i + 1]) for i in range(depth)])
        self.pool = nn.MaxPool2d(2)
        self.up = nn.ModuleList([nn.ConvTranspose2d(chans[i + 1], chans[i], 2, stride=2)
                                 for i in reversed(range(depth))])
        self.dec = nn.ModuleList([DoubleConv(2 * chans[i], chans[i]) for i in reversed(range(depth))])
        self.head = nn.Conv2d(chans[0], classes, 1)

    def forward(self, x):
        skips = []
        for i, block in enumerate(self.down):
            x = block(x if i == 0 else self.pool(x))
            skips.append(x)
        skips.pop()
        for up, dec in zip(self.up, self.dec):
            x = dec(torch.cat([up(x), skips.pop()], 1))
        return self.head(x)


class ConvTDecoder(nn.Module):
    """A transposed-convolution decoder (the generator half of a DCGAN / autoencoder): a latent map
    (N, ``cin``, h, w) up to (N, 3, 16h, 16w) through four ConvTranspose2d (k4, s2, p1) + BatchNorm +
    ReLU stages, then a 3x3 convolution and tanh."""

    def __init__(self, cin: int = 256, width: int = 512):
        super().__init__()
        layers, c = [], cin
        for i in range(4):
            out = width // 2 ** i
            layers += [nn.ConvTranspose2d(c, out, 4, stride=2, padding=1, bias=False), nn.BatchNorm2d(out),
                       nn.ReLU(inplace=True)]
            c = out
        self.body = nn.Sequential(*layers)
        self.out = nn.Conv2d(c, 3, 3, padding=1)

    def forward(self, x):
        return torch.tanh(self.out(self.body(x)))


class M5(nn.Module):
    """M5 (Dai et al. 2017), a 1-D convolutional classifier of raw waveforms: Conv1d k80 s4, then
    three k3 stages, each with BatchNorm, ReLU and max pooling; global average pool, linear."""

    def __init__(self, classes: int = 35, width: int = 128):
        super().__init__()
        w = width
        self.features = nn.Sequential(
            nn.Conv1d(1, w, 80, stride=4), nn.BatchNorm1d(w), nn.ReLU(inplace=True), nn.MaxPool1d(4),
            nn.Conv1d(w, w, 3, padding=1), nn.BatchNorm1d(w), nn.ReLU(inplace=True), nn.MaxPool1d(4),
            nn.Conv1d(w, 2 * w, 3, padding=1), nn.BatchNorm1d(2 * w), nn.ReLU(inplace=True), nn.MaxPool1d(4),
            nn.Conv1d(2 * w, 4 * w, 3, padding=1), nn.BatchNorm1d(4 * w), nn.ReLU(inplace=True))
        self.fc = nn.Linear(4 * w, classes)

    def forward(self, x):
        return self.fc(self.features(x).mean(-1))


class SegOut(nn.Module):
    """torchvision's segmentation models return ``{"out": ...}``: this returns the tensor."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x)["out"]


# ---------------------------------------------------------------------------- the zoo
@dataclass(frozen=True)
class Spec:
    """One model of the zoo: ``build()`` returns it with random weights (ImportError: skipped);
    ``kind`` picks the input (:func:`input_shape`); ``covers``: what it exercises."""

    name: str
    source: str
    kind: str
    covers: str
    build: Callable[[], nn.Module]


def _timm(name: str, **kw):
    def build():
        try:
            import timm
        except ImportError as exc:
            raise ImportError(f"timm is not installed ({INSTALL_HINT}): {exc}") from None
        return timm.create_model(name, pretrained=False, **kw)
    return build


def _tv(path: str, **kw):
    def build():
        try:
            import torchvision  # noqa: F401
            import torchvision.models.segmentation  # noqa: F401
            import torchvision.models.video  # noqa: F401
        except ImportError as exc:
            raise ImportError(f"torchvision is not installed ({INSTALL_HINT}): {exc}") from None
        obj = torchvision.models
        for part in path.split("."):
            obj = getattr(obj, part)
        m = obj(weights=None, **kw)
        return SegOut(m) if path.startswith("segmentation.") else m
    return build


def _ta(name: str, **kw):
    def build():
        try:
            import torchaudio.models
        except ImportError as exc:
            raise ImportError(f"torchaudio is not installed (pip install torchaudio): {exc}") from None
        return getattr(torchaudio.models, name)(**kw)
    return build


SPECS = {s.name: s for s in [
    Spec("resnet50", "torchvision", "image", "the baseline: 3x3 and 1x1 convs, BN, ReLU, residual adds",
         _tv("resnet50")),
    Spec("efficientnet_b0", "timm", "image", "depthwise 3x3/5x5, squeeze-excite, SiLU", _timm("efficientnet_b0")),
    Spec("mobilenetv3_large_100", "timm", "image", "depthwise 3x3/5x5, hardswish, SE with hard-sigmoid",
         _timm("mobilenetv3_large_100")),
    Spec("regnety_016", "timm", "image", "grouped 3x3 (group width 48), squeeze-excite", _timm("regnety_016")),
    Spec("convnext_tiny", "timm", "image", "depthwise 7x7 with bias, LayerNorm, GELU, layer scale",
         _timm("convnext_tiny")),
    Spec("unet", "zoo.py", "image", "U-Net: ConvTranspose2d (k2 s2) decoder, concatenated skips", lambda: UNet()),
    Spec("deeplabv3_resnet50", "torchvision", "image", "dilated segmentation: dilation 2/4 ResNet, ASPP (12/24/36)",
         _tv("segmentation.deeplabv3_resnet50", weights_backbone=None, aux_loss=False)),
    Spec("resnext50_32x4d", "torchvision", "image", "grouped 3x3 convs (32 groups)", _tv("resnext50_32x4d")),
    Spec("seresnext26d_32x4d", "timm", "image", "squeeze-excite on grouped convs, deep stem",
         _timm("seresnext26d_32x4d")),
    Spec("m5", "zoo.py", "audio", "1-D: raw-waveform Conv1d k80 s4 and k3, BN, ReLU", lambda: M5()),
    Spec("wav2letter", "torchaudio", "audio", "1-D: Conv1d k250 s160, wide k32/k1, ReLU",
         _ta("Wav2Letter", num_classes=40, input_type="waveform", num_features=1)),
    Spec("convtasnet", "torchaudio", "audio", "1-D: depthwise dilated Conv1d, PReLU, GroupNorm, ConvTranspose1d",
         _ta("ConvTasNet", num_sources=2)),
    Spec("r3d_18", "torchvision", "video", "3-D: Conv3d 3x3x3 and 3x7x7 stem, BN, ReLU", _tv("video.r3d_18")),
    Spec("convt_decoder", "zoo.py", "latent", "transposed-conv decoder: ConvTranspose2d k4 s2, BN, ReLU, tanh",
         lambda: ConvTDecoder()),
]}
#: asked for by name only (--models)
EXTRA_SPECS = {s.name: s for s in [
    Spec("r2plus1d_18", "torchvision", "video", "3-D (2+1)D: Conv3d 1x3x3 then 3x1x1", _tv("video.r2plus1d_18")),
    Spec("fcn_resnet50", "torchvision", "image", "dilated segmentation: dilation 2/4 ResNet, FCN head",
         _tv("segmentation.fcn_resnet50", weights_backbone=None, aux_loss=False)),
    Spec("resnet18", "torchvision", "image", "3x3 convs, BN, ReLU, residual adds", _tv("resnet18")),
]}


def input_shape(kind: str, batch: int, size: int) -> tuple:
    """The input of a model ``kind`` at ``size`` (an image side; 224: the standard inputs). image:
    (N, 3, size, size); video: 16 frames (4 below size 112) of size/2 squared; audio: 8000 samples
    (1 s at 8 kHz, ConvTasNet's rate; 0.5 s at 16 kHz) scaled by size/224; latent: (N, 256, size/16,
    size/16) (the decoder's output is size squared)."""
    if kind == "image":
        return (batch, 3, size, size)
    if kind == "video":
        return (batch, 3, 16 if size >= 112 else 4, size // 2, size // 2)
    if kind == "audio":
        return (batch, 1, max(2000, round(8000 * size / 224)))
    if kind == "latent":
        return (batch, 256, max(1, size // 16), max(1, size // 16))
    raise ValueError(f"unknown input kind {kind!r}")


def memory_format(ndim: int):
    """channels_last for 4-D tensors, channels_last_3d for 5-D, the default otherwise."""
    return {4: torch.channels_last, 5: torch.channels_last_3d}.get(ndim, torch.contiguous_format)


def randomize(model: nn.Module, seed: int = 0) -> list:
    """Give random weights what a trained model has and a fresh one lacks, so that every path counts
    in the output: BatchNorm running statistics, weight and bias drawn near 1 and 0 (a fresh BN is
    the identity, and timm zero-initializes the last BN of each residual branch); layer-scale
    parameters (``gamma``, ``*.ls*``, ``layer_scale*``: ConvNeXt starts them at 1e-6, which hides its
    whole residual branch) drawn in [0.1, 0.5]; dropout off (p = 0: torch and rawconv's training
    steps must see the same forward). Returns what was changed, in words."""
    g = torch.Generator().manual_seed(seed)
    did = set()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
                n = m.num_features
                m.running_mean.copy_(torch.rand(n, generator=g) * 0.2 - 0.1)
                m.running_var.copy_(torch.rand(n, generator=g) * 0.5 + 0.75)
                if m.affine:
                    m.weight.copy_(torch.rand(n, generator=g) * 0.5 + 0.5)
                    m.bias.copy_(torch.rand(n, generator=g) * 0.2 - 0.1)
                did.add("BatchNorm statistics")
            elif isinstance(m, nn.modules.dropout._DropoutNd) and m.p:
                m.p = 0.0
                did.add("dropout off")
        for name, p in model.named_parameters():
            last = name.rsplit(".", 1)[-1]
            if p.ndim == 1 and (last in ("gamma", "ls", "ls1", "ls2") or "layer_scale" in name):
                p.copy_(torch.rand(p.shape, generator=g) * 0.4 + 0.1)
                did.add("layer scale in [0.1, 0.5]")
    for m in model.modules():   # timm's DropPath / stochastic depth
        if type(m).__name__ == "DropPath" and getattr(m, "drop_prob", 0):
            m.drop_prob = 0.0
            did.add("drop path off")
    return sorted(did)


def first_tensor(out):
    """The output tensor of a model (the first of a tuple/list, ``"out"`` or the first value of a dict)."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):
        return first_tensor(out["out"] if "out" in out else next(iter(out.values())))
    if isinstance(out, (tuple, list)):
        return first_tensor(out[0])
    raise TypeError(f"the model returned {type(out).__name__}, not a tensor")


# ---------------------------------------------------------------------------- errors and status
#: normwise error (max |y - ref| / max |ref|) below which an output is right whatever torch's own error
FLOOR = {"float16": 5e-3, "bfloat16": 3e-2, "float32": 1e-4}
#: the same for a training step's gradients (autocast float16 on CUDA, float32 on the CPU)
TRAIN_FLOOR = {"float16": 1e-2, "bfloat16": 5e-2, "float32": 1e-4}
#: a row is WRONG when its error exceeds max(FACTOR x torch eager's own error, the floor)
FACTOR = 5.0


def status_of(err: float | None, torch_err: float | None, floor: float) -> str:
    """"ok", or "WRONG" when ``err`` is not finite or above ``max(FACTOR * torch_err, floor)``."""
    if err is None:
        return "-"
    if not math.isfinite(err):
        return "WRONG"
    limit = max(FACTOR * torch_err, floor) if torch_err is not None and math.isfinite(torch_err) else floor
    return "ok" if err <= limit else "WRONG"


def error_line(exc: BaseException) -> str:
    """``ExceptionType: the message's first line`` (cut to 160 characters)."""
    msg = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {msg[0][:160] if msg else ''}"


def grad_errs(ref: dict, got: dict) -> dict:
    """{parameter name: ||got - ref|| / ||ref||} over the parameters of ``ref`` (inf where ``got``
    has no gradient); a parameter whose reference gradient is below 1e-3 of the largest one's norm
    is measured against that instead (a conv bias before a training-mode BatchNorm has a gradient
    near zero, all cancellation)."""
    norms = {k: v.double().norm().item() for k, v in ref.items()}
    big = max(norms.values(), default=0.0)
    return {k: (got[k].double().to(r.device) - r.double()).norm().item() / max(norms[k], 1e-3 * big, 1e-30)
            if k in got else float("inf") for k, r in ref.items()}


def grad_status(errs: dict, torch_errs: dict, floor: float) -> tuple[str, str]:
    """("ok" or "WRONG", the parameter that came nearest its limit): parameter by parameter, WRONG
    when an error is not finite or above ``max(FACTOR x torch's error on that parameter, floor)``."""
    ratio = {k: (e / max(FACTOR * torch_errs.get(k, 0.0), floor) if math.isfinite(e) else float("inf"))
             for k, e in errs.items()}
    worst = max(ratio, key=ratio.get, default="")
    return ("ok" if not worst or ratio[worst] <= 1.0 else "WRONG"), worst


# ---------------------------------------------------------------------------- the run
class Run:
    """Prints progress lines with timestamps, keeps the rows, rewrites --json after each one."""

    def __init__(self, args):
        self.args = args
        self.t0 = time.perf_counter()
        self.rows: list = []
        self.skipped: list = []
        self.models: dict = {}
        self.depthwise: list = []
        self.meta = meta(args)

    def log(self, msg: str) -> None:
        stamp = datetime.datetime.now().strftime("%H:%M:%S")
        print(f"[{stamp} +{time.perf_counter() - self.t0:7.1f}s] {msg}", flush=True)

    def add(self, row: dict) -> None:
        self.rows.append(row)
        self.save()

    def result(self) -> dict:
        return {"meta": self.meta, "rows": self.rows, "skipped": self.skipped, "models": self.models,
                "depthwise": self.depthwise, "elapsed_s": time.perf_counter() - self.t0}

    def save(self) -> None:
        if self.args.json:
            tmp = self.args.json + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.result(), f, indent=1, default=str)
            os.replace(tmp, self.args.json)


def meta(args) -> dict:
    dev = args.device
    cpu = ""
    try:
        from rawconv.onednn import cpu_model as _cpu_model
        cpu = _cpu_model()
    except Exception:   # noqa: BLE001
        pass
    m = {"device": dev, "batch": args.batch, "size": args.size, "dtype": args.dtype, "threads": torch.get_num_threads(),
         "torch": torch.__version__, "cpu": cpu, "autotune_budget_s": args.autotune_budget,
         "gpu": torch.cuda.get_device_name() if dev == "cuda" else None, "argv": sys.argv[1:]}
    for mod in ("timm", "torchvision", "torchaudio"):
        try:
            m[mod] = __import__(mod).__version__
        except Exception:   # noqa: BLE001
            m[mod] = None
    if dev == "cuda":
        m["cudnn"] = torch.backends.cudnn.version()
    return m


def _nograd(f):
    def g():
        with torch.no_grad():
            return f()
    return g


def _graph(fn_model, x):
    """(replay-and-return-output, the CUDAGraph) of ``fn_model(x)`` (bench_resnet50.graph_capture)."""
    g, out = graph_capture(fn_model, x)
    return (lambda: (g.replay(), out)[1]), g


def _compile(m, x, dev):
    """``torch.compile(m)``, compiled by a first call on ``x`` under no_grad: CUDA default mode; CPU
    with inductor freezing (set in the options and, while it compiles, in the global config, where
    dynamo reads it). Returns (the compiled callable, its note)."""
    import torch._inductor.config as icfg

    settings = {"freezing": dev == "cpu"}
    cm = torch.compile(m, options=settings)
    graphs0 = _unique_graphs()
    with icfg.patch(**settings), torch.no_grad():
        cm(x)
    n = _unique_graphs() - graphs0
    return cm, ("inductor freezing; " if settings["freezing"] else "") + (f"{n} graph(s)" if n >= 0 else "")


def _unique_graphs() -> int:
    try:
        from torch._dynamo.utils import counters
        return int(counters["stats"]["unique_graphs"])
    except Exception:   # noqa: BLE001
        return -10 ** 9


def build_variants(model, x, args, run: Run, name: str) -> dict:
    """{variant: (callable returning the output, note) or (None, "ERROR: ...")}: each built, then called once."""
    dev, want = args.device, args.variants
    out: dict = {}

    def make(vname, build):
        if vname not in want:
            return
        t0 = time.perf_counter()
        try:
            fn, note = build()
            with torch.no_grad():
                fn()
            if dev == "cuda":
                torch.cuda.synchronize()
        except Exception as exc:   # noqa: BLE001  (a variant that fails is an ERROR row, never a crash)
            out[vname] = (None, error_line(exc))
            run.log(f"  {name} {vname}: ERROR {error_line(exc)}")
            if args.traceback:
                traceback.print_exc()
            if dev == "cuda":
                torch.cuda.empty_cache()
            return
        secs = time.perf_counter() - t0
        out[vname] = (fn, (note + "; " if note else "") + f"build {secs:.1f} s")
        run.log(f"  {name} {vname}: ready ({secs:.1f} s)")

    keep = {}   # graphs and compiled modules, alive as long as the variants
    make("eager", lambda: (_nograd(lambda: model(x)), "cudnn.benchmark" if dev == "cuda" else ""))

    def eager_graph():
        fn, keep["eager_graph"] = _graph(model, x)
        return fn, "torch.cuda.graph replay"
    if dev == "cuda":
        make("eager_cudagraph", eager_graph)

    def comp():
        keep["compile"], note = _compile(copy.deepcopy(model), x, dev)
        return _nograd(lambda: keep["compile"](x)), note
    make("compile", comp)

    def comp_graph():
        if "compile" not in keep:
            comp()
        fn, keep["compile_graph"] = _graph(keep["compile"], x)
        return fn, "compiled, torch.cuda.graph replay"
    if dev == "cuda":
        make("compile_cudagraph", comp_graph)

    if any(v.startswith("rawconv") for v in want):
        def conv():
            t0 = time.perf_counter()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", RuntimeWarning)
                rm = rnn.convert(model, fuse=True, autotune=None if args.no_autotune else x,
                                 autotune_budget_s=args.autotune_budget)
            keep["rawconv"] = rm
            rep = rm.rawconv_report
            secs = time.perf_counter() - t0
            info = {"report": str(rep), "convert_s": secs, "autotune_s": rep.autotune_s, "swapped": len(rep.swapped),
                    "fused": len(rep.fused), "folded": len(rep.folded), "traced": rep.traced,
                    "warnings": [str(w.message).splitlines()[0][:200] for w in caught
                                 if issubclass(w.category, RuntimeWarning)]}
            if callable(getattr(rep, "table", None)):   # per searched layer: rawconv's and torch's pick, both times
                try:
                    info["layers"] = rep.table()
                except Exception as exc:   # noqa: BLE001
                    info["layers"] = error_line(exc)
            run.models.setdefault(name, {})["convert"] = info
            run.log(f"  {name} " + str(rep).replace("\n", f"\n  {name} "))
            if args.layers and info.get("layers"):
                run.log(f"  {name} " + info["layers"].replace("\n", f"\n  {name} "))
            total = sum(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules())
            info["convs"] = total
            note = (f"{info['swapped']}/{total} convs on rawconv, {info['fused']} fused, {info['folded']} BN folded, "
                    f"convert {secs:.1f} s")
            if rep.traced is False:
                note += "; fx trace failed: " + rep.trace_error
            return _nograd(lambda: rm(x)), note
        try:
            raw = conv()
        except Exception as exc:   # noqa: BLE001  (every rawconv variant is then an ERROR row)
            raw = None
            run.log(f"  {name} convert: ERROR {error_line(exc)}")
            if args.traceback:
                traceback.print_exc()
            for v in want:
                if v.startswith("rawconv"):
                    out[v] = (None, "convert: " + error_line(exc))
        if raw is not None:
            make("rawconv", lambda: raw)
        if "rawconv" in keep:
            def raw_graph():
                fn, keep["rawconv_graph"] = _graph(keep["rawconv"], x)
                return fn, "converted, torch.cuda.graph replay"
            if dev == "cuda":
                make("rawconv_cudagraph", raw_graph)

            def raw_comp():
                keep["rawconv_compile"], note = _compile(keep["rawconv"], x, dev)
                return _nograd(lambda: keep["rawconv_compile"](x)), "converted; " + note
            make("rawconv_compile", raw_comp)

            def raw_comp_graph():
                if "rawconv_compile" not in keep:
                    raw_comp()
                fn, keep["rawconv_compile_graph"] = _graph(keep["rawconv_compile"], x)
                return fn, "converted, compiled, torch.cuda.graph replay"
            if dev == "cuda":
                make("rawconv_compile_cudagraph", raw_comp_graph)
    out["_keep"] = keep
    return out


def time_variants(variants: dict, args, run: Run, name: str) -> dict:
    """{variant: {"ms", "min_ms", "wall_ms"}}: CUDA: GPU time per batch (time_cuda_queued: graph
    replays 10 per group, other calls 1 per group so that a forward's hundreds of launches fit
    the launch queue behind the sleep; median of --gpu-repeats groups) and the wall time of
    back-to-back calls; CPU: wall time, every variant once per round (median, min)."""
    fns = {k: v[0] for k, v in variants.items() if not k.startswith("_") and v[0] is not None}
    res = {}
    if args.device == "cuda":
        for k, fn in fns.items():
            try:
                graph = k.endswith("cudagraph")
                with torch.no_grad():
                    st = time_cuda_queued(fn, iterations=10 if graph else 1, warmup=2, repeats=args.gpu_repeats)
                    wall = wall_ms(fn, "cuda", 10)
                res[k] = {"ms": st.median_ms, "min_ms": st.min_ms, "wall_ms": wall}
                run.log(f"  {name} {k}: GPU {st.median_ms:.3f} ms (min {st.min_ms:.3f}), wall {wall:.3f} ms")
            except Exception as exc:   # noqa: BLE001
                res[k] = {"error": error_line(exc)}
                run.log(f"  {name} {k}: ERROR while timing: {error_line(exc)}")
    else:
        try:
            stats = time_cpu_interleaved(fns, args.rounds, warmup=1)
        except Exception as exc:   # noqa: BLE001  (one failing: time them one at a time)
            run.log(f"  {name}: interleaved timing failed ({error_line(exc)}); timing one by one")
            stats = {}
            for k, fn in fns.items():
                try:
                    stats.update(time_cpu_interleaved({k: fn}, args.rounds, warmup=1))
                except Exception as exc2:   # noqa: BLE001
                    res[k] = {"error": error_line(exc2)}
        for k, (med, mn) in stats.items():
            res[k] = {"ms": med, "min_ms": mn, "wall_ms": med}
            run.log(f"  {name} {k}: median {med:.3f} ms, min {mn:.3f} ms")
    return res


def reference(model, x, args):
    """The float64 output of ``model`` on ``x`` (both upcast, contiguous): on the same device;
    on the CPU when the GPU runs out of memory. Returns (output, device name)."""
    for dev in ([args.device, "cpu"] if args.device == "cuda" else ["cpu"]):
        try:
            m64 = copy.deepcopy(model).to(dev, torch.float64).to(memory_format=torch.contiguous_format)
            with torch.no_grad():
                y = first_tensor(m64(x.to(dev, torch.float64).contiguous()))
            del m64
            return y, dev
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
    raise RuntimeError("float64 reference: out of memory")


def run_model(spec: Spec, args, run: Run) -> None:
    dev, dtype = args.device, getattr(torch, args.dtype)
    name = spec.name
    t_model = time.perf_counter()
    try:
        torch.manual_seed(0)
        model = spec.build()
    except ImportError as exc:
        run.skipped.append({"model": name, "reason": str(exc)})
        run.log(f"{name}: SKIPPED: {exc}")
        run.save()
        return
    except Exception as exc:   # noqa: BLE001
        run.add({"model": name, "variant": "build", "status": "ERROR", "note": error_line(exc)})
        run.log(f"{name}: ERROR building the model: {error_line(exc)}")
        return
    changed = randomize(model)
    shape = input_shape(spec.kind, args.batch, args.size)
    fmt = memory_format(len(shape))
    model = model.eval().to(dev, dtype).to(memory_format=fmt)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(123)).to(dev, dtype).contiguous(memory_format=fmt)
    nparam = sum(p.numel() for p in model.parameters())
    run.models[name] = {"source": spec.source, "covers": spec.covers, "input": list(shape), "params": nparam,
                        "randomized": changed}
    run.log(f"{name} ({spec.source}; {spec.covers}): input {tuple(shape)} {args.dtype}, {nparam / 1e6:.1f} M params")
    try:
        ref, ref_dev = reference(model, x, args)
        run.models[name]["reference_device"] = ref_dev
    except Exception as exc:   # noqa: BLE001
        ref = None
        run.log(f"  {name}: no float64 reference: {error_line(exc)}")
    variants = build_variants(model, x, args, run, name)
    keep = variants.pop("_keep")
    errs = {}
    for k, (fn, note) in variants.items():
        if fn is None or ref is None:
            continue
        try:
            with torch.no_grad():
                errs[k] = rel_err(first_tensor(fn()), ref)
        except Exception as exc:   # noqa: BLE001
            variants[k] = (None, error_line(exc))
    times = time_variants(variants, args, run, name)
    torch_err = errs.get("eager")
    floor = FLOOR[args.dtype]
    base = {k: times.get(k, {}).get("ms") for k in ("eager", "compile")}
    for k in args.variants:
        if k not in variants:
            continue
        fn, note = variants[k]
        t = times.get(k, {})
        row = {"model": name, "variant": k, "ms": t.get("ms"), "min_ms": t.get("min_ms"), "wall_ms": t.get("wall_ms"),
               "err": errs.get(k), "torch_err": torch_err, "note": note}
        if fn is None or "error" in t:
            row["status"] = "ERROR"
            row["note"] = t.get("error") or note
        elif k == "eager":   # the noise floor itself: ok unless not finite
            row["status"] = "ok" if row["err"] is None or math.isfinite(row["err"]) else "WRONG"
        else:
            row["status"] = status_of(row["err"], torch_err, floor)
        for key, b in (("vs_eager", base["eager"]), ("vs_compile", base["compile"])):
            row[key] = b / row["ms"] if b and row["ms"] else None
        run.add(row)
        run.log(f"  {name} {k}: {fmt_row(row)}")
    del variants, keep, model, x, ref
    _free(dev)
    if args.train:
        try:
            train_model(spec, args, run)
        except Exception as exc:   # noqa: BLE001
            run.add({"model": name, "variant": "train_rawconv", "status": "ERROR", "note": error_line(exc)})
            run.log(f"  {name} training: ERROR {error_line(exc)}")
            if args.traceback:
                traceback.print_exc()
        _free(dev)
    run.log(f"{name}: done in {time.perf_counter() - t_model:.1f} s")


def _free(dev: str) -> None:
    gc.collect()
    try:
        torch._dynamo.reset()
    except Exception:   # noqa: BLE001
        pass
    if dev == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def fmt_row(r: dict) -> str:
    f = lambda v, s: "-" if v is None else format(v, s)  # noqa: E731
    return (f"{f(r.get('ms'), '.3f')} ms, vs eager {f(r.get('vs_eager'), '.2f')}x, vs compile "
            f"{f(r.get('vs_compile'), '.2f')}x, err {f(r.get('err'), '.1e')} (torch {f(r.get('torch_err'), '.1e')}) "
            f"{r['status']}  {r.get('note', '')}")


# ---------------------------------------------------------------------------- the training step
def train_model(spec: Spec, args, run: Run) -> None:
    """One training step (forward, MSE loss against a fixed random target, backward, SGD with
    momentum) of the model in train mode (batch at least 2): torch eager (CUDA: cudnn.benchmark) against
    ``rawconv.nn.convert(model)`` (no fusion; --train-autotune: autotune=x with the backward
    passes, budget --autotune-budget). CUDA: fp32 weights, autocast float16 when --dtype is float16
    (else fp32 with TF32 as torch's defaults); CPU: fp32. The first step's gradients of each side
    against a float64 step (same weights and batch, on the same device; the CPU when out of
    memory); times per step: CUDA GPU time (steps queued behind a busy GPU) and wall; CPU wall."""
    dev, name = args.device, spec.name
    amp = torch.float16 if (dev == "cuda" and args.dtype == "float16") else (
        torch.bfloat16 if args.dtype == "bfloat16" else None)
    torch.manual_seed(0)
    model = spec.build()
    randomize(model)
    # (at least 2: a training BatchNorm after a global pooling, as deeplabv3's ASPP pooling branch,
    # needs more than one value per channel, torch's own rule)
    shape = input_shape(spec.kind, max(args.batch, 2), args.size)
    fmt = memory_format(len(shape))
    model = model.train().to(dev).to(memory_format=fmt)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(shape, generator=gen).to(dev).contiguous(memory_format=fmt)
    with torch.no_grad():
        yshape = first_tensor(copy.deepcopy(model).eval()(x)).shape
    tgt = torch.randn(yshape, generator=gen).to(dev)

    def loss_of(m, xin):
        with torch.autocast(dev, dtype=amp or torch.float32, enabled=amp is not None):
            out = first_tensor(m(xin))
        return F.mse_loss(out.float(), tgt.to(out.device, torch.float32 if out.dtype != torch.float64 else out.dtype))

    def grads(m):
        return {k: p.grad.detach().clone() for k, p in m.named_parameters() if p.grad is not None}

    # the float64 step
    ref = None
    for rdev in ([dev, "cpu"] if dev == "cuda" else ["cpu"]):
        try:
            m64 = copy.deepcopy(model).to(rdev, torch.float64).to(memory_format=torch.contiguous_format)
            xin = x.to(rdev, torch.float64).contiguous()
            with torch.autocast(rdev, enabled=False):
                out = first_tensor(m64(xin))
                F.mse_loss(out, tgt.to(rdev, torch.float64)).backward()
            ref = grads(m64)
            del m64, out
            break
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
    t0 = time.perf_counter()
    rm = rnn.convert(copy.deepcopy(model), autotune=x if args.train_autotune else None,
                     autotune_budget_s=args.autotune_budget)
    convert_s = time.perf_counter() - t0
    sides = {"train_torch": copy.deepcopy(model), "train_rawconv": rm}
    errs = {}
    for k, m in sides.items():
        loss_of(m, x).backward()
        if ref is not None:
            errs[k] = grad_errs(ref, grads(m))
        m.zero_grad(set_to_none=True)

    def stepper(m):
        opt = torch.optim.SGD(m.parameters(), lr=1e-4, momentum=0.9)

        def step():
            opt.zero_grad(set_to_none=True)
            loss = loss_of(m, x)
            loss.backward()
            opt.step()
            return loss
        return step
    ns = SimpleNamespace(device=dev, train_rounds=args.train_rounds, train_steps=args.train_steps)
    walls, gpu = time_steps({k: stepper(m) for k, m in sides.items()}, ns)
    floor = TRAIN_FLOOR["float16" if amp is torch.float16 else ("bfloat16" if amp is not None else "float32")]
    mode = f"autocast {str(amp).split('.')[-1]}" if amp is not None else (
        "fp32" + (" (TF32 as torch's defaults)" if dev == "cuda" else ""))
    ms = {k: (gpu[k] if dev == "cuda" else sorted(walls[k])[len(walls[k]) // 2]) for k in sides}
    worst = {k: max(e.values(), default=None) for k, e in errs.items()}
    for k in sides:
        row = {"model": name, "variant": k, "ms": ms[k], "min_ms": min(walls[k]) if dev == "cpu" else None,
               "wall_ms": min(walls[k]), "err": worst.get(k), "torch_err": worst.get("train_torch"),
               "vs_eager": ms["train_torch"] / ms[k] if ms[k] else None, "vs_compile": None, "note": mode}
        if k not in errs:
            row["status"] = "-"
        elif k == "train_torch":   # the noise floor itself
            row["status"] = "ok" if math.isfinite(row["err"]) else "WRONG"
        else:
            row["status"], p = grad_status(errs[k], errs["train_torch"], floor)
            row["note"] += (f"; nearest its limit: {p} (err {errs[k][p]:.1e}, torch's {errs['train_torch'][p]:.1e})"
                            f"; convert {convert_s:.1f} s" + (" (autotuned)" if args.train_autotune else ""))
        run.add(row)
        run.log(f"  {name} {k}: {fmt_row(row)}")


# ---------------------------------------------------------------------------- depthwise layers
#: (model, C, H, kernel, stride, bias): ConvNeXt-T's four depthwise 7x7 stages (bias), then
#: MobileNetV3-Large's and EfficientNet-B0's depthwise 3x3 / 5x5 layers (no bias: a BatchNorm follows)
DEPTHWISE = [("convnext_tiny", 96, 56, 7, 1, True), ("convnext_tiny", 192, 28, 7, 1, True),
             ("convnext_tiny", 384, 14, 7, 1, True), ("convnext_tiny", 768, 7, 7, 1, True),
             ("mobilenetv3_large_100", 64, 112, 3, 2, False), ("mobilenetv3_large_100", 72, 56, 5, 2, False),
             ("mobilenetv3_large_100", 120, 28, 5, 1, False), ("mobilenetv3_large_100", 480, 14, 3, 1, False),
             ("mobilenetv3_large_100", 672, 14, 5, 2, False), ("mobilenetv3_large_100", 960, 7, 5, 1, False),
             ("efficientnet_b0", 32, 112, 3, 1, False), ("efficientnet_b0", 96, 112, 3, 2, False),
             ("efficientnet_b0", 144, 56, 5, 2, False), ("efficientnet_b0", 240, 28, 3, 2, False),
             ("efficientnet_b0", 672, 14, 5, 1, False), ("efficientnet_b0", 1152, 7, 3, 1, False)]
DW_SIDES = ("torch", "rawconv_default", "rawconv_autotune", "rawconv_fused_autotune")


def depthwise_table(args, run: Run) -> None:
    """Each depthwise layer of :data:`DEPTHWISE` alone (batch --batch, default 16): torch's
    ``nn.Conv2d`` (CUDA: cudnn.benchmark), rawconv's module on the library's default choice
    (``convert(conv)``: a ``rawconv.nn.Conv2d``), ``convert(conv, autotune=x)`` and
    ``convert(conv, fuse=True, autotune=x)`` (bias fused); time per call (CUDA: GPU time, 20 calls
    queued behind a busy GPU, median of --gpu-repeats; CPU: wall, interleaved rounds), error
    against float64, and what torch ran (``rawconv.torch_choice``, unless --no-torch-choice)."""
    import rawconv

    dev, dtype = args.device, getattr(torch, args.dtype)
    names = {sp.name for sp in args.specs}
    for model_name, c, h, k, s, bias in DEPTHWISE:
        if args.models and model_name not in names:
            continue
        label = f"{model_name} dw{k}x{k}/s{s} C{c} {h}x{h}"
        row = {"layer": label, "x": [args.batch, c, h, h], "w": [c, 1, k, k], "stride": s, "groups": c,
               "padding": k // 2, "bias": bias}
        try:
            torch.manual_seed(0)
            conv = nn.Conv2d(c, c, k, stride=s, padding=k // 2, groups=c, bias=bias).to(dev, dtype)
            conv = conv.to(memory_format=torch.channels_last).eval()
            x = torch.randn(args.batch, c, h, h, device=dev, dtype=dtype).contiguous(memory_format=torch.channels_last)
            ref = F.conv2d(x.double(), conv.weight.double(), None if conv.bias is None else conv.bias.double(),
                           s, k // 2, 1, c)   # on the device (cuDNN's float64 is far faster than torch's CPU one)
            mods = {"torch": conv}
            for side, kw in (("rawconv_default", {}),
                             ("rawconv_autotune", {"autotune": x}),
                             ("rawconv_fused_autotune", {"autotune": x, "fuse": True})):
                try:
                    if "autotune" in kw:
                        kw["autotune_budget_s"] = args.autotune_budget
                    mods[side] = rnn.convert(conv, **kw)
                except Exception as exc:   # noqa: BLE001
                    row[side + "_error"] = error_line(exc)
            fns = {}
            for side, m in mods.items():
                try:
                    with torch.no_grad():
                        row[side + "_err"] = rel_err(m(x), ref)
                    fns[side] = _nograd(lambda m=m: m(x))
                except Exception as exc:   # noqa: BLE001
                    row[side + "_error"] = error_line(exc)
            for side in ("rawconv_autotune", "rawconv_fused_autotune"):
                if side in mods:
                    ch = rnn.pinned_choices(mods[side])
                    row[side + "_choice"] = str(next(iter(ch.values()))["choice"]) if ch else None
            if dev == "cuda":
                for side, fn in fns.items():
                    row[side + "_us"] = 1e3 * time_cuda_queued(fn, iterations=20, warmup=3,
                                                               repeats=args.gpu_repeats).median_ms
            else:
                for side, (med, _mn) in time_cpu_interleaved(fns, max(args.rounds, 20), warmup=2).items():
                    row[side + "_us"] = 1e3 * med
            if args.torch_choice:
                try:
                    tc = rawconv.torch_choice(x, conv.weight, conv.bias, s, k // 2, 1, c)
                    row["torch_ran"] = re.sub(r"^torch's oneDNN [\d.]+: oneDNN ", "", tc.ran(90))
                    row["torch_matches"] = list(tc.matches[:3])
                except Exception as exc:   # noqa: BLE001
                    row["torch_ran"] = "torch_choice: " + error_line(exc)
        except Exception as exc:   # noqa: BLE001
            row["error"] = error_line(exc)
        run.depthwise.append(row)
        run.save()
        t = row.get("torch_us")
        parts = [f"{sd} {row[sd + '_us']:.1f} us ({t / row[sd + '_us']:.2f}x)" if t and row.get(sd + "_us")
                 else f"{sd} {row.get(sd + '_error', row.get('error', '-'))}" for sd in DW_SIDES[1:]]
        run.log(f"{label}: torch {'-' if t is None else f'{t:.1f} us'}; " + "; ".join(parts))


def depthwise_text(rows: list, markdown: bool = False) -> str:
    """The depthwise table: times (us per call) and ratio torch / rawconv (>1: rawconv faster)."""
    head = ["layer", "torch us", "default us", "x", "autotune us", "x", "fused+autotune us", "x", "max err",
            "torch err", "torch ran", "rawconv autotuned choice"]
    lines = []
    for r in rows:
        t = r.get("torch_us")
        cells = [r["layer"], _f(t, ".1f")]
        for sd in DW_SIDES[1:]:
            v = r.get(sd + "_us")
            cells += [_f(v, ".1f") if v is not None else ("ERROR" if (sd + "_error") in r or "error" in r else "-"),
                      f"{t / v:.2f}x" if t and v else "-"]
        errs = [r[sd + "_err"] for sd in DW_SIDES[1:] if r.get(sd + "_err") is not None]
        cells += [_f(max(errs) if errs else None, ".1e"), _f(r.get("torch_err"), ".1e"),
                  str(r.get("torch_ran", "-"))[:60], str(r.get("rawconv_autotune_choice", "-"))[:50]]
        lines.append(cells)
    notes = [f"{r['layer']}: {k}: {v}" for r in rows for k, v in r.items() if k.endswith("error")]
    out = _table(head, lines, markdown)
    ratios = {sd: geomean([r["torch_us"] / r[sd + "_us"] for r in rows if r.get("torch_us") and r.get(sd + "_us")])
              for sd in DW_SIDES[1:]}
    out += "\n" + "geomean torch/rawconv: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items())
    return out + ("\n" + "\n".join(notes) if notes else "")


# ---------------------------------------------------------------------------- the table
def _f(v, spec: str) -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, spec)


def _table(head: list, lines: list, markdown: bool) -> str:
    if markdown:
        return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                         + ["| " + " | ".join(c.replace("|", "/") for c in cells) + " |" for cells in lines])
    widths = [max(len(h), *(len(c) for c in col)) if lines else len(h) for h, col in zip(head, zip(*lines or [head]))]
    fmt = lambda cells: "  ".join(c.ljust(w) if i in (0, 1) or i == len(cells) - 1 else c.rjust(w)  # noqa: E731
                                  for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([fmt(head)] + [fmt(c) for c in lines])


def table_text(result: dict, markdown: bool = False) -> str:
    """Every row, then the summary lines (:func:`summary_text`)."""
    dev = result["meta"]["device"]
    head = ["model", "variant", "GPU ms" if dev == "cuda" else "wall ms", "wall ms" if dev == "cuda" else "min ms",
            "vs eager", "vs compile", "err", "torch err", "status", "note"]
    lines = []
    for r in result["rows"]:
        lines.append([r["model"], r["variant"], _f(r.get("ms"), ".3f"),
                      _f(r.get("wall_ms") if dev == "cuda" else r.get("min_ms"), ".3f"),
                      _f(r.get("vs_eager"), ".2f") + ("x" if r.get("vs_eager") else ""),
                      _f(r.get("vs_compile"), ".2f") + ("x" if r.get("vs_compile") else ""),
                      _f(r.get("err"), ".1e"), _f(r.get("torch_err"), ".1e"), r.get("status", "-"),
                      str(r.get("note", ""))[:110 if not markdown else 200]])
    m = result["meta"]
    title = (f"rawconv zoo: {dev} ({m.get('gpu') or m.get('cpu')}), batch {m['batch']}, size {m['size']}, "
             f"{m['dtype']}, threads {m['threads']}, torch {m['torch']}, autotune budget {m['autotune_budget_s']} s "
             "per problem")
    out = [title, _table(head, lines, markdown)]
    if dev == "cuda":
        out.append("GPU ms: GPU time per batch (graph replays, or calls queued behind a busy GPU), wall ms: "
                   "back-to-back calls; train rows: one step (GPU time). vs: torch eager (train: torch's step) / "
                   "compile time over this row's (>1: faster).")
    else:
        out.append("wall ms: median per batch, the variants taking turns; min ms: the fastest round. vs: torch "
                   "eager (train: torch's step) / compile with freezing over this row's (>1: faster).")
    out.append(f"err: max |y - ref| / max |ref| against the same model in float64 (train: the worst parameter's "
               f"gradient, normwise); torch err: torch eager's own (the noise floor); WRONG: err above "
               f"max({FACTOR:g} x torch err, {FLOOR[m['dtype']]:g}) (train: parameter by parameter, above "
               f"max({FACTOR:g} x torch's error on that parameter, {TRAIN_FLOOR[m['dtype']]:g})).")
    for s in result["skipped"]:
        out.append(f"skipped {s['model']}: {s['reason']}")
    out.append(summary_text(result))
    return "\n".join(out)


def summary_text(result: dict) -> str:
    rows = result["rows"]
    dev = result["meta"]["device"]
    wrong = [f"{r['model']}/{r['variant']}" for r in rows if r.get("status") == "WRONG"]
    errors = [f"{r['model']}/{r['variant']}" for r in rows if r.get("status") == "ERROR"]
    internal = [f"{r['model']}/{r['variant']}" for r in rows if "InternalError" in str(r.get("note", ""))]
    lines = [f"WRONG: {len(wrong)}" + (f" ({', '.join(wrong)})" if wrong else ""),
             f"ERROR: {len(errors)}" + (f" ({', '.join(errors)})" if errors else "")
             + (f"; InternalError: {len(internal)}" if internal else "")]
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    for v in variants:
        parts = []
        for key, word in (("vs_eager", "vs eager"), ("vs_compile", "vs compile")):
            vals = {r["model"]: r[key] for r in rows if r["variant"] == v and r.get(key) and r.get("status") == "ok"}
            itself = (v in ("eager", "train_torch") and key == "vs_eager") or (v == "compile" and key == "vs_compile")
            if vals and not itself:
                worst = min(vals, key=vals.get)
                parts.append(f"{word}: geomean {geomean(vals.values()):.2f}x over {len(vals)}, worst {worst} "
                             f"{vals[worst]:.2f}x")
        if parts:
            lines.append(f"{v:<26} " + "; ".join(parts))
    lines += targets(rows, dev)
    return "\n".join(lines)


def targets(rows: list, dev: str) -> list:
    """The issue's targets against this run's rows (ok rows only)."""
    def ratios(variant, key):
        return {r["model"]: r[key] for r in rows if r["variant"] == variant and r.get(key) and r.get("status") == "ok"}
    out = []
    rc = ratios("rawconv_compile", "vs_compile")
    if dev == "cuda":
        rg = ratios("rawconv_cudagraph", "vs_eager")
        if rc:
            below = [m for m, v in rc.items() if v < 1.0]
            out.append(f"target (GPU): rawconv_compile >= 1.0x compile for every model: "
                       f"{'met' if not below else 'missed on ' + ', '.join(below)}; geomean "
                       f"{geomean(rc.values()):.2f}x (target 1.2x)")
        if rg:
            below = [m for m, v in rg.items() if v < 1.0]
            out.append(f"target (GPU): rawconv_cudagraph >= 1.0x eager for every model: "
                       f"{'met' if not below else 'missed on ' + ', '.join(below)}")
    else:
        rr = ratios("rawconv", "vs_compile")
        best = {m: max(rr.get(m, 0), rc.get(m, 0)) for m in set(rr) | set(rc)}
        if best:
            below = [m for m, v in best.items() if v < 1.0]
            out.append(f"target (CPU): rawconv (eager or compiled) >= 1.0x compile with freezing for every model: "
                       f"{'met' if not below else 'missed on ' + ', '.join(sorted(below))}; geomean of the better "
                       f"{geomean(best.values()):.2f}x (target 1.1x)")
        slower = [r["model"] for r in rows if r["variant"] == "rawconv_compile" and r.get("vs_eager")
                  and any(q["model"] == r["model"] and q["variant"] == "rawconv" and q.get("vs_eager")
                          and q["vs_eager"] > r["vs_eager"] for q in rows)]
        if rc:
            out.append("target (CPU): rawconv_compile never slower than rawconv eager: "
                       + ("met" if not slower else "missed on " + ", ".join(slower)))
    return out


def markdown_pivot(result: dict) -> str:
    """One line per model: each variant's time and ratio against torch.compile, the training step's
    ratio, and the statuses that are not ok (the docs' table)."""
    rows = result["rows"]
    unit = "GPU ms" if result["meta"]["device"] == "cuda" else "ms"
    variants = [v for v in dict.fromkeys(r["variant"] for r in rows) if v not in TRAIN_ROWS and v != "build"]
    head = ["model"] + variants + ["train torch", "train rawconv", "not ok"]
    lines = []
    for model in dict.fromkeys(r["model"] for r in rows):
        by = {r["variant"]: r for r in rows if r["model"] == model}
        cells = [model]
        for v in variants + list(TRAIN_ROWS):
            r = by.get(v)
            if r is None or r.get("ms") is None:
                cells.append(r["status"] if r else "-")
                continue
            ratio = r.get("vs_compile") if v not in TRAIN_ROWS and v not in ("eager", "compile") else (
                r.get("vs_eager") if v == "train_rawconv" else None)
            cells.append(f"{r['ms']:.3f}" + (f" ({ratio:.2f}x)" if ratio else ""))
        bad = [f"{v} {r['status']}" for v, r in by.items() if r.get("status") not in ("ok", None)]
        cells.append(", ".join(bad) or "-")
        lines.append(cells)
    return (f"{unit} per batch (train: per step); in brackets: torch.compile's time over the row's (train "
            "rawconv: torch's step over rawconv's)\n\n" + _table(head, lines, True))


# ---------------------------------------------------------------------------- main
def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=None, help="default 32 on CUDA, 4 on CPU (--depthwise: 16)")
    ap.add_argument("--size", type=int, default=224,
                    help="image side (video: half of it; audio and latent scale with it)")
    ap.add_argument("--dtype", choices=("float16", "float32", "bfloat16"), default=None,
                    help="default float16 on CUDA, float32 on CPU")
    ap.add_argument("--threads", type=int, default=8, help="CPU threads (torch.set_num_threads; default 8)")
    ap.add_argument("--models", default=None,
                    help="comma-separated; default: " + ",".join(SPECS) + "; also by name: " + ",".join(EXTRA_SPECS)
                    + " (--depthwise: the layers of convnext_tiny, mobilenetv3_large_100, efficientnet_b0)")
    ap.add_argument("--variants", default=None, help="comma-separated; CUDA: " + ",".join(VARIANTS_CUDA) +
                    "; CPU: " + ",".join(VARIANTS_CPU))
    ap.add_argument("--autotune-budget", type=float, default=0.3, help="convert's autotune_budget_s per problem")
    ap.add_argument("--no-autotune", action="store_true", help="convert(fuse=True) without autotune")
    ap.add_argument("--train", action=argparse.BooleanOptionalAction, default=True,
                    help="one training step per model, torch against convert(model) (default on)")
    ap.add_argument("--train-autotune", action="store_true", help="the training step's convert with autotune=x")
    ap.add_argument("--train-steps", type=int, default=1,
                    help="steps per wall-time loop (bench_resnet50.time_steps: best of 3 loops)")
    ap.add_argument("--train-rounds", type=int, default=3, help="rounds, torch and rawconv taking turns")
    ap.add_argument("--rounds", type=int, default=10, help="CPU: timed rounds (every variant once per round)")
    ap.add_argument("--gpu-repeats", type=int, default=7, help="CUDA: queued groups timed (median)")
    ap.add_argument("--depthwise", action="store_true", help="the per-layer depthwise table instead")
    ap.add_argument("--torch-choice", action=argparse.BooleanOptionalAction, default=True,
                    help="--depthwise: what torch ran (rawconv.torch_choice)")
    ap.add_argument("--json", default=None, help="write the rows here (rewritten after each row)")
    ap.add_argument("--markdown", action="store_true", help="also print the tables as Markdown (for the docs)")
    ap.add_argument("--layers", action="store_true",
                    help="print convert's per-layer table (rawconv's and torch's pick, both times; always in --json)")
    ap.add_argument("--traceback", action="store_true", help="print each exception's traceback")
    ap.add_argument("--isolate", action="store_true",
                    help="run each model in a process of its own (a crash, as a segmentation fault, then is one "
                         "ERROR row with the signal, not the end of the run; Python's faulthandler prints where)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)   # (--isolate's child: no tables)
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device")
    if args.batch is None:
        args.batch = 16 if args.depthwise else (32 if args.device == "cuda" else 4)
    if args.dtype is None:
        args.dtype = "float16" if args.device == "cuda" else "float32"
    allowed = VARIANTS_CUDA if args.device == "cuda" else VARIANTS_CPU
    args.variants = tuple(v.strip() for v in args.variants.split(",")) if args.variants else allowed
    bad = [v for v in args.variants if v not in allowed]
    if bad:
        ap.error(f"unknown variants for {args.device}: {bad}; choose from {list(allowed)}")
    known = {**SPECS, **EXTRA_SPECS}
    names = [m.strip() for m in args.models.split(",")] if args.models else list(SPECS)
    bad = [m for m in names if m not in known]
    if bad:
        ap.error(f"unknown models {bad}; choose from {list(known)}")
    args.specs = [known[m] for m in names]
    return args


def _without(argv: list, flag: str, takes_value: bool) -> list:
    """``argv`` without ``flag`` (and its value): ``--flag v`` and ``--flag=v`` alike."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == flag:
            skip = takes_value
        elif not a.startswith(flag + "="):
            out.append(a)
    return out


def run_isolated(spec: Spec, argv: list, run: Run) -> None:
    """:func:`run_model` (and the training step) of ``spec`` in a child process (``--isolate``): the
    same options, this model alone, its rows read back from its JSON. A child that dies (a signal, a
    non-zero exit) becomes one ERROR row naming the signal and the child's last progress line;
    its output (faulthandler's traceback included) is passed through as it comes."""
    import signal
    import subprocess
    import tempfile

    args = _without(_without(_without(list(argv), "--models", True), "--json", True), "--isolate", False)
    args = _without(_without(args, "--markdown", False), "--layers", False)
    with tempfile.TemporaryDirectory() as tmp:
        js = os.path.join(tmp, "rows.json")
        cmd = [sys.executable, "-X", "faulthandler", os.path.abspath(__file__), *args, "--models", spec.name,
               "--json", js, "--child"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        last = ""
        for line in proc.stdout:
            print(line, end="", flush=True)
            if line.startswith("["):   # (a progress line: where the child was, not faulthandler's module list)
                last = line.strip()
        rc = proc.wait()
        got = None
        if os.path.exists(js):
            with open(js) as f:
                got = json.load(f)
    if got is not None:
        run.rows.extend(r for r in got["rows"])
        run.skipped.extend(got["skipped"])
        run.models.update(got["models"])
    if rc != 0:
        why = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit status {rc}"
        run.add({"model": spec.name, "variant": "run", "status": "ERROR",
                 "note": f"the model's process died ({why}); its last progress line: {last[:160]}"})
        run.log(f"{spec.name}: ERROR the model's process died ({why})")
    else:
        run.save()


def main(argv=None) -> dict:
    args = parse(argv)
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    else:
        torch.backends.cudnn.benchmark = True
    run = Run(args)
    run.log("rawconv zoo: " + ", ".join(f"{k} {v}" for k, v in run.meta.items() if k != "argv"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        if args.depthwise:
            depthwise_table(args, run)
            print(depthwise_text(run.depthwise), flush=True)
            if args.markdown:
                print("\n" + depthwise_text(run.depthwise, markdown=True), flush=True)
        else:
            for spec in args.specs:
                if args.isolate:
                    run_isolated(spec, argv if argv is not None else sys.argv[1:], run)
                    continue
                try:
                    run_model(spec, args, run)
                except Exception as exc:   # noqa: BLE001  (never let one model end the run)
                    run.add({"model": spec.name, "variant": "run", "status": "ERROR", "note": error_line(exc)})
                    run.log(f"{spec.name}: ERROR {error_line(exc)}")
                    if args.traceback:
                        traceback.print_exc()
                    _free(args.device)
            res = run.result()
            if args.child:
                run.save()
                return res
            print(table_text(res), flush=True)
            if args.markdown:
                print("\n" + markdown_pivot(res), flush=True)
    run.save()
    return run.result()


if __name__ == "__main__":
    main()
