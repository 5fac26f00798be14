"""The ``rawconv`` command line's argument types (shapes, bounded numbers, directions, widths) and the
problems its arguments describe (a preset, a benchdnn descriptor, or shapes with torch's arguments,
on each device asked for)."""
from __future__ import annotations

import argparse
import os

from ..core.errors import RawconvError
from .cli_tables import MIN_WIDTH


def _shape(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(v) for v in text.lower().replace(",", "x").split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a shape like 8x64x56x56, got {text!r}") from None
    if not out or any(v < 0 for v in out):
        raise argparse.ArgumentTypeError(f"expected a shape like 8x64x56x56, got {text!r}")
    if any(v >= 2 ** 31 for v in out):
        raise argparse.ArgumentTypeError(f"every size must be below 2^31, got {text!r}")
    return out


def _bounded(kind, minimum, what, maximum=None):
    """An argparse type: ``kind(text)`` that must be > ``minimum`` (``minimum`` None: >= 0), <= ``maximum()``."""
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if ((v < 0) if minimum is None else not v > minimum) or (maximum is not None and v > maximum()):
            raise argparse.ArgumentTypeError(f"expected {what}, got {v}")
        return v
    return parse


_positive_int = _bounded(int, 0, "a positive integer")
_thread_count = _bounded(int, 0, "at most 8 threads per CPU (64 at least)", lambda: max(64, 8 * (os.cpu_count() or 1)))

_nonneg_int = _bounded(int, None, "a non-negative integer")
_positive_float = _bounded(float, 0, "a positive number")


def _ints(text: str):
    """``1`` or ``1,2`` or ``same``/``valid``; for padding also ``0:1,1:2`` (before:after per dim)."""
    if text in ("same", "valid"):
        return text
    parts = text.split(",")
    try:
        if any(":" in p for p in parts):
            return [tuple(int(v) for v in p.split(":")) for p in parts]
        vals = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ints like 1 or 1,2 (padding also 0:1,1:2), got {text!r}") from None
    return vals[0] if len(vals) == 1 else tuple(vals)


def _problems_on(args, device) -> list:
    from ..core import presets
    from ..core.problem import ConvProblem

    import torch

    layout = "nhwc" if args.layout in ("nhwc", "channels_last") else "nchw"
    dtype = args.dtype
    if args.input is not None or args.weight is not None:
        if args.input is None or args.weight is None:
            raise RawconvError("--input and --weight go together")
        x = torch.empty(args.input, device="meta")
        w = torch.empty(args.weight, device="meta")
        b = torch.empty(args.weight[0], device="meta") if args.bias else None
        p = ConvProblem.from_torch(x, w, b, args.stride, args.padding, args.dilation, args.groups)
        p = p.with_(dtype=dtype, layout=layout, device=device)
        return [p.with_(name=_cli_label(p))]
    spec = args.problem or "resnet50"
    if spec in presets.PRESETS:
        ps = presets.get(spec, args.batch, dtype=dtype, layout=layout, bias=args.bias)
        if args.layers:
            names = args.layers.split(",")
            sel = [p for i, p in enumerate(ps) if p.name in names or str(i) in names]
            if not sel:
                raise RawconvError(f"--layers {args.layers!r} matches none of {[p.name for p in ps]}")
            ps = sel
        return [p.with_(device=device) for p in ps]
    import re

    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", spec) and not re.search(r"(ic|oc)\d", spec):
        raise RawconvError(f"unknown problem {spec!r}: not a preset ({', '.join(sorted(presets.PRESETS))}) "
                           "and not a benchdnn descriptor (like mb8ic64ih56oc64oh56kh3ph1)")
    try:
        p = ConvProblem.from_benchdnn(spec, dtype=dtype, layout=layout, has_bias=args.bias)
    except RawconvError as exc:
        raise RawconvError(f"{exc} (known presets: {', '.join(sorted(presets.PRESETS))})") from None
    return [p.with_(device=device, name=p.name or spec)]


def _cli_label(p) -> str:
    """The name of a problem given by ``--input/--weight``: its benchdnn descriptor (what ``rawconv
    list`` and ``compare`` take back as the problem argument), or, where that notation cannot
    carry it (some asymmetric paddings), its one-line description; a layout other than NCHW or a
    dtype other than float32 is added, since a descriptor has neither."""
    from ..core.errors import RawconvError as _E

    try:
        label = p.to_benchdnn(strict=True)
    except _E:
        label = None
    if not label:
        return p.describe()
    extra = [v for v, default in ((str(p.dtype).replace("torch.", ""), "float32"), (p.layout, "nchw")) if v != default]
    return label + (f" ({', '.join(extra)})" if extra else "")


def _devices(args) -> list[str]:
    import torch

    if args.device == "auto":
        return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise RawconvError(f"--device {args.device}: torch sees no CUDA device")
    if not (args.device == "cpu" or args.device.startswith("cuda")):
        raise RawconvError(f"--device must be auto, cpu or cuda[:N], got {args.device!r}")
    return [args.device]


def _problems(args) -> list:
    out = []
    for dev in _devices(args):
        out += _problems_on(args, dev)
    return out


def _direction(text: str) -> str:
    from ..core.backend import canonical_direction

    try:
        return canonical_direction(text)
    except RawconvError:
        raise argparse.ArgumentTypeError(f"expected forward, backward_data or backward_weights, got {text!r}") from None


def _width(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of columns, got {text!r}") from None
    if v < MIN_WIDTH:
        raise argparse.ArgumentTypeError(f"expected at least {MIN_WIDTH} columns (the narrowest readable table), "
                                         f"got {v}")
    return v
