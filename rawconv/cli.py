"""The ``rawconv`` command line.

    rawconv info [--json]
    rawconv compare [PROBLEM] [--input NxCxHxW --weight KxCxRxS ...] [--batch N] [--json FILE]
    rawconv list [PROBLEM | --input ... --weight ...]      # every implementation, no timing

PROBLEM is a preset name (``resnet50``) or a oneDNN benchdnn descriptor
(``mb8ic64ih56oc64oh56kh3ph1``). With no problem, ``compare`` runs the resnet50 preset at batch 1,
feeding matplotlib's sample photo through its first layer.
"""
from __future__ import annotations

import argparse
import json
import math
import sys

from . import __version__
from .errors import RawconvError


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


def _bounded(kind, minimum, what):
    """An argparse type: ``kind(text)`` that must be > ``minimum`` (``minimum`` None: >= 0)."""
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if (v < 0) if minimum is None else not v > minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {v}")
        return v
    return parse


_positive_int = _bounded(int, 0, "a positive integer")
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
    from . import presets
    from .problem import ConvProblem

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
        p = p.with_(dtype=dtype, layout=layout, device=device, name="cli")
        return [p]
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


def _fmt_ms(v):
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.4f}"


def _fmt_err(v):
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.1e}"


def _print_rows(console, problem, rows):
    from rich.table import Table

    t = Table(title=str(problem), title_justify="left", show_lines=False)
    for col, just in (("backend", "left"), ("implementation", "left"), ("detail", "left"), ("median ms", "right"),
                      ("min ms", "right"), ("GFLOP/s", "right"), ("max abs err", "right"), ("max rel err", "right"),
                      ("ok", "center"), ("scratch/ws B", "right")):
        t.add_column(col, justify=just, overflow="fold")
    fastest = min((r.median_ms for r in rows if r.ok and math.isfinite(r.median_ms)), default=None)
    for r in rows:
        if r.error.startswith(("skipped", "not supported")):
            t.add_row(r.backend, r.implementation, r.detail or r.error, "-", "-", "-", "-", "-",
                      "skipped" if r.error.startswith("skipped") else "n/a",
                      "-" if r.workspace_bytes is None else str(r.workspace_bytes), style="dim")
            continue
        if r.error:
            t.add_row(r.backend, r.implementation, r.detail, "-", "-", "-", "-", "-", "[red]error[/red]",
                      "-", style="dim")
            t.add_row("", "", f"[red]{r.error[:160]}[/red]", "", "", "", "", "", "", "")
            continue
        style = "bold green" if fastest is not None and r.median_ms == fastest else None
        t.add_row(r.backend, r.implementation, r.detail, _fmt_ms(r.median_ms), _fmt_ms(r.min_ms),
                  f"{r.gflops:.1f}" if math.isfinite(r.gflops) else "-", _fmt_err(r.max_abs), _fmt_err(r.max_rel),
                  "yes" if r.ok else "[red]NO[/red]", "-" if r.workspace_bytes is None else str(r.workspace_bytes),
                  style=style)
    console.print(t)


def _console(width):
    """A rich console that does not split numbers: a terminal's width, or 220 columns when the
    output goes to a file or pipe (rich would assume 80); no automatic highlighting."""
    from rich.console import Console

    if width is None and not sys.stdout.isatty():
        width = 220
    return Console(width=width, highlight=False)


def cmd_compare(args) -> int:
    from . import compare as cmp
    from ._info import collect

    console = _console(args.width)
    problems = _problems(args)
    if args.json:
        try:
            with open(args.json, "a"):
                pass
        except OSError as exc:
            raise RawconvError(f"--json {args.json}: cannot write there ({exc.strerror})") from None
    import torch

    meta = {"rawconv": __version__, "threads": args.threads or torch.get_num_threads(), "iterations": args.iterations,
            "warmup": args.warmup, "budget_s": args.budget, "prepack": not args.no_prepack}
    all_rows = []
    with cmp.threads(args.threads):
        import torch

        meta["info"] = collect()
        on = meta["info"].get("onednn", {})
        console.print(f"rawconv {__version__}; torch {torch.__version__} ({torch.get_num_threads()} threads); "
                      f"oneDNN {on.get('version', '?')} ({on.get('cpu_isa', on.get('error', ''))})")
        first = problems[0]
        photo_note = (" (the first problem's input is matplotlib's sample photo; weights are random)"
                      if not args.random and first.ndim == 2 and first.c == 3 and not first.is_empty else "")
        console.print(f"{len(problems)} problem(s){photo_note}; times: median/min of up to {args.iterations} "
                      f"calls after {args.warmup} warm-up, at most {args.budget} s each; error vs float64 reference")

        def show(p, rows):
            _print_rows(console, p, rows)

        all_rows = cmp.compare(problems, photo_first=not args.random, iterations=args.iterations, warmup=args.warmup,
                               budget_s=args.budget, fpmath=args.fpmath, prepack=not args.no_prepack,
                               include_ref=False if args.no_ref else (True if args.ref else "auto"), on_problem=show,
                               progress=sys.stderr.isatty() and len(problems) > 1, engines=args.engines,
                               allow_known_bad=args.allow_known_bad)
    s = cmp.summary(all_rows)
    if args.json:
        cmp.write_json(args.json, all_rows, meta, problems)
    gm = s["geomean_torch_over_best"]
    console.print(
        f"summary: {s['problems']} problem(s), {s['results']} results checked against float64: "
        f"{s['within_tolerance']} within tolerance, {len(s['outside_tolerance'])} outside, {len(s['failed'])} failed"
        + (f", {len(s['skipped'])} skipped" if s["skipped"] else "")
        + (f", {len(s['not_supported'])} not supported by the library here" if s["not_supported"] else "") + "; "
        f"torch default / best rawconv median time, geometric mean: {gm:.2f}x" + (f"; JSON: {args.json}" if args.json else ""))
    for line in s["outside_tolerance"]:
        console.print(f"  outside tolerance: {line}")
    return 1 if s["outside_tolerance"] else 0


def cmd_info(args) -> int:
    from ._info import collect

    data = collect()
    if args.json:
        print(json.dumps(data, indent=1, default=str))
        return 0
    from rich.table import Table

    t = Table(title="rawconv info", show_header=False)
    t.add_column("key")
    t.add_column("value", overflow="fold")

    def add(prefix, d):
        for k, v in d.items():
            if isinstance(v, dict):
                add(prefix + k + ".", v)
            else:
                t.add_row(prefix + k, str(v))

    add("", data)
    _console(None).print(t)
    return 0


def cmd_list(args) -> int:
    from rich.table import Table

    console = _console(None)
    for p in _problems(args):
        x, w, b = p.make_inputs()
        if p.device.startswith("cuda"):
            from . import cudnn

            rows = cudnn.algorithms(x, w, b, p.stride, list(zip(p.pad_before, p.pad_after)), p.dilation, p.groups)
            console.print(str(p))
            for r in rows:
                console.print(f"  {r}")
            continue
        from . import known_bad, onednn

        impls = onednn.implementations(x, w, b, p.stride, list(zip(p.pad_before, p.pad_after)), p.dilation, p.groups,
                                       direction=args.direction, fpmath=args.fpmath)
        t = Table(title=f"{p} ({args.direction}, fpmath {args.fpmath})", title_justify="left")
        bad = any(i.known_bad for i in impls)
        for col in ("#", "implementation", "layouts", "formats", "reorders", "scratchpad B") + (("known bad",) if bad else ()):
            t.add_column(col)
        for i in impls:
            t.add_row(str(i.index), i.name, i.layouts, " ".join(f"{k}={v}" for k, v in i.formats.items()),
                      ",".join(i.reorders) or "none", str(i.scratchpad_bytes), *((known_bad.short(i.known_bad),) if bad else ()))
        console.print(t)
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rawconv", description="List, force, time and check every convolution "
                                 "algorithm of oneDNN and cuDNN on torch tensors.")
    ap.add_argument("--version", action="version", version=f"rawconv {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True)

    def problem_args(p):
        p.add_argument("problem", nargs="?", help="preset name (resnet50) or benchdnn descriptor "
                       "(mb8ic64ih56oc64oh56kh3ph1); default: resnet50")
        p.add_argument("--input", type=_shape, help="input shape, e.g. 8x64x56x56")
        p.add_argument("--weight", type=_shape, help="weight shape, e.g. 64x64x3x3 (K x C/groups x kernel)")
        p.add_argument("--stride", type=_ints, default=1)
        p.add_argument("--padding", type=_ints, default=0, help="1, 1,2, same, valid, or before:after per dim (0:1,1:2)")
        p.add_argument("--dilation", type=_ints, default=1)
        p.add_argument("--groups", type=_positive_int, default=1)
        p.add_argument("--bias", action="store_true", help="add a bias")
        p.add_argument("--batch", type=_positive_int, default=1, help="batch size for presets (default 1)")
        p.add_argument("--layers", help="comma-separated layer names or indices of a preset")
        p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16", "float64"])
        p.add_argument("--layout", default="nchw", choices=["nchw", "nhwc", "channels_last"])
        p.add_argument("--device", default="auto", help="auto (cpu, plus cuda when torch sees a GPU), cpu (oneDNN) "
                       "or cuda[:N] (cuDNN)")
        p.add_argument("--fpmath", default="strict", choices=["strict", "bf16", "f16", "tf32", "any"],
                       help="oneDNN fpmath mode")

    c = sub.add_parser("compare", help="time and check torch and every rawconv implementation")
    problem_args(c)
    c.add_argument("--iterations", type=_positive_int, default=10, help="timed calls per candidate (default 10)")
    c.add_argument("--warmup", type=_nonneg_int, default=2, help="untimed calls per candidate (default 2)")
    c.add_argument("--budget", type=_positive_float, default=0.25, help="seconds of timing per candidate at most; a candidate whose first call takes longer is timed by that call alone (default 0.25)")
    c.add_argument("--threads", type=_positive_int, default=None, help="torch/oneDNN threads (default: torch's)")
    c.add_argument("--json", help="also write the results as JSON to this file")
    c.add_argument("--random", action="store_true", help="random input everywhere (no sample photo)")
    c.add_argument("--no-prepack", action="store_true", help="reorder oneDNN weights on every call")
    c.add_argument("--no-ref", action="store_true", help="skip oneDNN's reference (ref:any) implementations")
    c.add_argument("--ref", action="store_true", help="run oneDNN's reference implementations even on large problems "
                   "(by default they are listed but not run above 0.5 GFLOP: one call can take minutes)")
    c.add_argument("--engines", default=None, help="cuDNN graph-API engines: 'all' or the top N by heuristic")
    c.add_argument("--width", type=int, default=None, help="table width (default: the terminal's)")
    c.add_argument("--allow-known-bad", action="store_true",
                   help="also run oneDNN implementations rawconv.known_bad lists for a problem (they may crash, "
                        "hang or give wrong results; see README)")
    c.set_defaults(func=cmd_compare)

    i = sub.add_parser("info", help="versions, library paths and how they were found")
    i.add_argument("--json", action="store_true")
    i.set_defaults(func=cmd_info)

    ls = sub.add_parser("list", help="list every implementation/algorithm for a problem (no timing)")
    problem_args(ls)
    ls.add_argument("--direction", default="forward", choices=["forward", "backward_data", "backward_weights"])
    ls.set_defaults(func=cmd_list)
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        return args.func(args)
    except RawconvError as exc:
        print(f"rawconv: error: {exc}", file=sys.stderr)
        return 2
    except (OverflowError, MemoryError) as exc:
        print(f"rawconv: error: problem too large: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
