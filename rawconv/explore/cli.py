"""The ``rawconv`` command line.

    rawconv info [--json] [--width N]
    rawconv compare [PROBLEM] [--input NxCxHxW --weight KxCxRxS ...] [--batch N] [--json FILE] [--width N]
    rawconv list [PROBLEM | --input ... --weight ...] [--width N]     # every implementation, no timing
    rawconv compare ... --plot out.png --csv out.csv --record records.json   # figures, tables, tuning records
    rawconv replay records.json [--strict]                            # re-run recorded choices: drift

PROBLEM is a preset name (``resnet50``) or a oneDNN benchdnn descriptor
(``mb8ic64ih56oc64oh56kh3ph1``). With no problem, ``compare`` runs the resnet50 preset at batch 1,
feeding matplotlib's sample photo through its first layer. ``compare``'s exit status is in
:data:`rawconv.compare.EXIT_CODES` (and ``rawconv compare --help``).
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys

from ..core import __version__
from ..core.errors import RawconvError
from ..core.results import fmt_bytes, fmt_ms


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


# --------------------------------------------------------------------------- tables that fit
MIN_WIDTH = 60      # --width below this is refused: the essential columns need about 60 characters


def _finite(v) -> bool:
    return v is not None and not (isinstance(v, float) and not math.isfinite(v))


def _fmt_err(v) -> str:
    return f"{v:.1e}" if _finite(v) else "-"


def _fmt_spread(v) -> str:
    if not _finite(v):
        return "-"
    return f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 100 else f"{v:.0f}"


def _fmt_gflops(v) -> str:
    """GFLOP/s with one decimal, or three significant digits below 1 (a slow reference row is not 0.0)."""
    if not _finite(v):
        return "-"
    return f"{v:.1f}" if v >= 1 or v == 0 else f"{v:.3g}"


class Column:
    """A table column: ``cells`` are plain strings (``styles`` rich styles, same length).
    ``drop``: None for a column that always stays, else its rank in the drop order (0 first).
    ``wrap``: the column may wrap at spaces (never inside a word) when it must; ``flex``: text that
    takes the width left over (at least ``flex_min``), wrapping at spaces."""

    def __init__(self, header: str, cells, *, justify="left", drop=None, wrap=False, flex=False, flex_min=24,
                 styles=None):
        self.header, self.cells, self.justify = header, list(cells), justify
        self.drop, self.wrap, self.flex, self.flex_min = drop, wrap, flex, flex_min
        self.styles = list(styles) if styles is not None else [None] * len(self.cells)
        self.name = " ".join(header.split()).replace("/ ", "/")

    def natural(self) -> int:
        return max([len(x) for t in [self.header] + self.cells for x in t.split("\n")] + [1])

    def narrowest(self) -> int:
        """Widest part of a word: the column can wrap down to this without splitting a name
        anywhere but after one of its separators (``.``, ``_``, ``:``, ``@``, ``/``, ``,``:
        ``layer3.0.`` / ``downsample.0``, never ``layer3.0.dow`` / ``nsample.0``)."""
        words = [p for t in self.cells + self.header.split("\n") for w in t.split() for p in _parts(w)]
        return max([len(w) for w in words] + [1])


_SEPARATORS = "/._,:@"


def _parts(word: str) -> list[str]:
    """``word`` cut after each separator (:data:`_SEPARATORS`), the pieces a name may wrap between."""
    import re

    return [p for p in re.findall(rf"[^{re.escape(_SEPARATORS)}]*[{re.escape(_SEPARATORS)}]?", word) if p]


GAP = 2        # characters between columns (rich box.SIMPLE_HEAD, no edge, collapsed padding)
WRAP_MIN = 8   # a wrappable text column folds words down to this width before a number is cropped
KEEP_RANK = 3  # a column dropped at this rank or later goes only when wrapping names at spaces is not enough


def fit_columns(cols: list[Column], width: int) -> list[tuple[Column, int]]:
    """Choose the columns and widths for a table ``width`` characters wide. Every kept column
    gets its natural width (no wrapping) where it can; otherwise columns go in their ``drop`` order
    (lowest first; a ``flex`` column stays only with at least ``flex_min`` characters), and as
    last resorts ``wrap`` columns wrap at spaces, then (names longer than the room left) inside
    words, down to :data:`WRAP_MIN`. Number columns never wrap
    and are never narrower than their widest cell: no number is ever split. Returns (column,
    width) pairs in their original order."""
    kept = list(cols)

    def need(cs, wrapped=False) -> int:
        return sum(c.flex_min if c.flex else (c.narrowest() if wrapped and c.wrap else c.natural())
                   for c in cs) + GAP * (len(cs) - 1)

    while need(kept) > width:
        droppable = sorted((c for c in kept if c.drop is not None), key=lambda c: c.drop)
        if not droppable:
            break
        if droppable[0].drop >= KEEP_RANK and need(kept, wrapped=True) <= width:
            break   # the numbers that matter stay: names wrap at spaces and separators instead
        kept.remove(droppable[0])
    widths = {id(c): c.natural() for c in kept if not c.flex}
    excess = need(kept) - width
    for floor in ("word", "fold"):   # last resorts: wrappable columns wrap at spaces, then fold words
        def least(c):
            return c.narrowest() if floor == "word" else WRAP_MIN

        while excess > 0:   # a character at a time off the widest wrappable column: they shrink evenly
            cands = [c for c in kept if c.wrap and not c.flex and widths[id(c)] > least(c)]
            if not cands:
                break
            c = max(cands, key=lambda c: widths[id(c)])
            widths[id(c)] -= 1
            excess -= 1
    flex = [c for c in kept if c.flex]
    left = width - sum(widths.values()) - GAP * (len(kept) - 1)
    for c in flex:
        widths[id(c)] = max(c.flex_min, min(c.natural(), left // len(flex)))
    return [(c, widths[id(c)]) for c in kept]


def render_table(console, cols: list[Column], title: str | None = None) -> list[Column]:
    """Print ``cols`` as one rich table fitted to ``console.width`` (:func:`fit_columns`); returns
    the columns shown."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    fitted = fit_columns(cols, console.width)
    t = Table(title=Text(title) if isinstance(title, str) else title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
              collapse_padding=True, title_style="bold")
    for c, w in fitted:
        wraps = c.flex or c.wrap
        t.add_column(c.header, justify=c.justify, width=w, no_wrap=not wraps, overflow="fold" if wraps else "crop")
    n = len(cols[0].cells) if cols else 0

    def cell(c, w, text):
        # a name narrower than its column stays whole; a wider one wraps after a separator
        # (_break_long), and only a part still wider than the column is folded
        if c.wrap and not c.flex and max(map(len, text.split("\n"))) > w:
            return "\n".join(_break_long(line, w) for line in text.split("\n"))
        return text

    for i in range(n):
        t.add_row(*[Text(cell(c, w, c.cells[i]), style=c.styles[i] or "") for c, w in fitted])
    console.print(t)
    return [c for c, _ in fitted]


_STATUS_STYLE = {"ok": "", "wrong": "bold red", "failed": "red", "not supported": "dim", "skipped": "dim"}


def _compare_columns(rows) -> list[Column]:
    fastest = min((r.median_ms for r in rows if r.category == "ok" and math.isfinite(r.median_ms)), default=None)
    row_style = []
    for r in rows:
        if not r.ran:
            row_style.append("dim")
        elif fastest is not None and r.category == "ok" and r.median_ms == fastest:
            row_style.append("bold green")
        else:
            row_style.append(None)
    from ..core.bench import SPREAD_LIMIT

    detail = [(r.detail if r.ran else (r.error or r.detail)) for r in rows]
    spread_style = [("yellow" if _finite(r.spread) and r.spread > SPREAD_LIMIT else st)
                    for r, st in zip(rows, row_style)]
    median_style = [("yellow" if r.ran and (r.oversubscribed or r.timing_flags) else st)
                    for r, st in zip(rows, row_style)]
    status_style = [_STATUS_STYLE.get(r.category, "red") or st for r, st in zip(rows, row_style)]
    library = ([Column("library", [_two_lines(r.library) or "-" for r in rows], wrap=True, styles=row_style)]
               if any(r.library for r in rows) else [])
    position = ([Column("#", [str(r.extra["index"]) if isinstance(r.extra.get("index"), int) else ""
                              for r in rows], justify="right", drop=0.5, styles=row_style)]
                if any(isinstance(r.extra.get("index"), int) for r in rows) else [])
    ratio = ([Column("x\ntorch", [_fmt_ratio(r) for r in rows], justify="right", drop=2.5, styles=median_style)]
             if any(isinstance(r.extra.get("ratio"), dict) for r in rows) else [])
    return [
        Column("backend", [r.backend for r in rows], styles=row_style),
        *library, *position,
        Column("implementation", [r.implementation for r in rows], wrap=True, styles=row_style),
        Column("status", [_status_cell(r) for r in rows], wrap=True, styles=status_style),
        Column("median\nms", [fmt_ms(r.median_ms) for r in rows], justify="right", styles=median_style),
        Column("min\nms", [fmt_ms(r.min_ms) for r in rows], justify="right", styles=row_style), *ratio,
        Column("med/\nmin", [_fmt_spread(r.spread) for r in rows], justify="right", drop=5, styles=spread_style),
        Column("max rel\nerr", [_fmt_err(r.max_rel) for r in rows], justify="right", drop=4, styles=row_style),
        Column("max abs\nerr", [_fmt_err(r.max_abs) for r in rows], justify="right", drop=3, styles=row_style),
        Column("scratch", [fmt_bytes(r.workspace_bytes) for r in rows], justify="right", drop=2, styles=row_style),
        Column("GFLOP/s", [_fmt_gflops(r.gflops) for r in rows], justify="right", drop=1, styles=row_style),
        Column("detail", detail, drop=0, flex=True, styles=row_style),
    ]


def _status_cell(r) -> str:
    """A row's status, with what its own rounds measured against its time in words (the
    median column is also yellow on a terminal, which a pipe or a log does not show):
    ``ok (waited)`` when most rounds had no clean call, ``ok (spread)`` when its rounds disagree
    (or, timed outside rounds, its median/min is wide), ``ok (busy)``: the machine was oversubscribed."""
    from ..core.bench import flag_kind

    marks = []
    for m in map(flag_kind, (r.timing_flags or []) if r.ran else []):
        if m and m not in marks:
            marks.append(m)
    return r.status + (f" ({', '.join(marks)})" if marks else "")


def _fmt_ratio(r) -> str:
    """A row's ``x torch`` cell: torch default's time over the row's, taken within each round
    (median over rounds; ``extra["ratio"]``), ``-`` without one."""
    q = r.extra.get("ratio") if isinstance(r.extra, dict) else None
    v = q.get("value") if isinstance(q, dict) else None
    return f"{v:.2f}" if _finite(v) else "-"


def _two_lines(library: str) -> str:
    """A row's library label on at most two short lines: ``torch 2.14.1's`` / ``oneDNN 3.12.0``."""
    if "'s " in library:
        a, b = library.split("'s ", 1)
        return f"{a}'s\n{b}"
    return library


def print_rows(console, problem, rows) -> None:
    """One problem's table, fitted to the console; when the detail column does not fit, the
    reasons of the rows that did not run and torch's detail follow as notes."""
    cols = _compare_columns(rows)
    shown = render_table(console, cols, title=str(problem))
    if not any(c.header == "detail" for c in shown):
        for r in rows:
            text = r.detail if r.ran else (r.error or r.detail)
            if text and (r.backend == "torch" or not r.ran):
                console.print(f"  {r.backend} {r.implementation}: {text}", highlight=False)
        console.print(f"  (columns left out at width {console.width}: "
                      f"{', '.join(c.name for c in cols if c not in shown)}; "
                      "--width or --json shows them)", style="dim")
    from .confirm import confirmed_line

    line = confirmed_line(rows)
    if line:
        console.print(line, highlight=False)


def _console(width):
    """A rich console whose tables never split a number: ``--width``, else the terminal's width
    (``COLUMNS`` when set), else, when stdout is not a terminal (``| head``, ``> file``), no
    width at all: every line as long as its content, never wrapped. Output that is not a
    terminal never carries trailing spaces (:class:`_Unwrapped`). No automatic highlighting."""
    import os
    from rich.console import Console

    if not _isatty(sys.stdout):
        cols = os.environ.get("COLUMNS", "")
        return _Unwrapped(width=width or (int(cols) if cols.isdigit() else UNWRAPPED_WIDTH), highlight=False,
                          markup=False)
    return Console(width=width, highlight=False, markup=False)   # text in [brackets] is text, not a style


def _isatty(stream) -> bool:
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError):
        return False


#: the width :class:`_Unwrapped` renders at: wider than any line rawconv prints
UNWRAPPED_WIDTH = 100_000


@functools.lru_cache(maxsize=1)
def _unwrapped_console_class():
    from rich.console import Console

    class Unwrapped(Console):
        """A console for output that is not a terminal: rendered at :data:`UNWRAPPED_WIDTH`
        columns, each line's trailing spaces removed, so lines keep their content's length."""

        def print(self, *objects, **kw):   # noqa: A003  (rich's name)
            if self.width >= UNWRAPPED_WIDTH:   # no width asked for: a line as long as its text
                kw.setdefault("soft_wrap", not any(hasattr(o, "__rich_console__") for o in objects))
            with self.capture() as cap:
                super().print(*objects, **kw)
            text = "\n".join(line.rstrip() for line in cap.get().split("\n"))
            self.file.write(text)
            self.file.flush()

    return Unwrapped


def _Unwrapped(**kw):  # noqa: N802  (a class, built on first use: rich imports lazily)
    return _unwrapped_console_class()(**kw)


def _warn(console, line: str) -> None:
    console.print(f"warning: {line}", style="yellow")


def _threads_arg(args) -> int:
    from ..core.bench import default_threads

    return args.threads if args.threads is not None else default_threads()


#: How ``compare`` and ``replay`` end an oversubscription warning (:func:`rawconv.bench.load_hint`).
_LOAD_HINT = "--threads {threads} or a quiet machine"


def _warn_if_busy(console, nthreads: int, hint: str = _LOAD_HINT) -> dict:
    """Sample the machine for 0.3 s before timing; warn when other processes already keep our
    CPUs busy. Returns the sample's :meth:`~rawconv.bench.LoadReport.as_dict`."""
    import time

    from ..core.bench import LoadMonitor, load_hint

    pre = LoadMonitor(nthreads)
    time.sleep(0.3)
    before = pre.report()
    if before.other_cpus is not None and before.oversubscribed:
        _warn(console, f"the machine is busy before the start: {before.describe(timing=False)}; calls that wait "
                       f"for a CPU are retried and flagged ({load_hint(before, hint)})")
    return before.as_dict()


def cmd_compare(args) -> int:
    from . import compare as cmp
    from ..core.bench import usable_cpus

    console = _console(args.width)
    problems = _problems(args)
    outputs = {flag: getattr(args, flag) for flag in ("json", "plot", "csv", "record") if getattr(args, flag)}
    if args.plot:
        _check_plot_format(args.plot)
    for flag, path in outputs.items():
        _check_writable(f"--{flag}", path)
    nthreads = _threads_arg(args)
    include_ref = False if args.no_ref else (True if args.ref else "auto")
    prepack = False if args.no_prepack else "both"
    libs = cmp.libraries()
    meta = {"rawconv": __version__, "threads": nthreads, "usable_cpus": usable_cpus(),
            "threads_default": args.threads is None, "iterations": args.iterations, "warmup": args.warmup,
            "budget_s": args.budget, "confirm_rounds": args.confirm_rounds, "prepack": prepack,
            "direction": args.direction, "ref": include_ref,
            "ref_limit_s": args.ref_limit, "outputs": outputs, "libraries": libs}

    hint = _LOAD_HINT

    with cmp.threads(nthreads):
        _compare_header(console, args, problems, libs, nthreads, meta, hint)

        def show(p, rows):
            print_rows(console, f"{p}  [{cmp.versions_line(libs, [p])}]", rows)
            for line in cmp.timing_warnings(rows, hint):
                _warn(console, line)

        all_rows = cmp.compare(problems, photo_first=not args.random, iterations=args.iterations, warmup=args.warmup,
                               budget_s=args.budget, fpmath=args.fpmath, prepack=prepack, direction=args.direction,
                               libs=libs, include_ref=include_ref, ref_max_s=args.ref_limit, on_problem=show,
                               progress=False if args.quiet else None, engines=args.engines,
                               allow_known_bad=args.allow_known_bad, confirm_rounds=args.confirm_rounds,
                               isolate={"timeout_s": args.timeout} if args.isolate else None)
        recs = (cmp.records(all_rows, problems, fpmath=args.fpmath, allow_known_bad=args.allow_known_bad, hint=hint)
                if args.record else [])
    s = cmp.summary(all_rows, hint=hint)
    code = cmp.exit_code(s)
    s["exit_code"] = code
    if args.json:
        cmp.write_json(args.json, all_rows, meta, problems, summary=s)
    _write_outputs(console, args, all_rows, recs)
    if len(problems) > 1:   # one problem: its warnings were printed under its table
        for line in s["timing_warnings"]:
            _warn(console, line)
    _compare_summary(console, s, outputs)
    console.print(f"exit status {code}: {cmp.EXIT_CODES[code]}", style="dim" if code == 0 else "red")
    return code


def _compare_header(console, args, problems: list, libs, nthreads: int, meta: dict, hint: str) -> None:
    """``compare``'s lines before the run (versions, what is timed, how; the machine's load), in
    ``nthreads`` threads. Takes the parsed ``args``, the ``problems``, the libraries ``libs`` and
    the JSON ``meta``, which gets the machine's ``info`` (and ``machine_before`` when a problem
    runs on the CPU). Returns None."""
    import torch

    from . import compare as cmp
    from .info import collect
    from ..core.bench import usable_cpus

    meta["info"] = collect()
    on = meta["info"].get("onednn", {})
    console.print(f"rawconv {__version__}; torch {torch.__version__}; "
                  f"{torch.get_num_threads()} thread{'s' if torch.get_num_threads() != 1 else ''} "
                  f"({usable_cpus()} CPUs usable{'' if args.threads is None else ', --threads'}); "
                  f"oneDNN {on.get('version', '?')} ({on.get('cpu_isa', on.get('error', ''))})")
    console.print(f"comparing {cmp.versions_line(libs, problems)}: two builds of each library, so a row names "
                  "the library and version that ran it, and a same-named implementation in both is different "
                  "code; the comparison says which runs faster here, not why", style="dim")
    if nthreads > usable_cpus():
        _warn(console, f"--threads {nthreads} exceeds the {usable_cpus()} CPUs this process may use: "
                       "OpenMP threads will wait for each other")
    first = problems[0]
    photo_note = (" (the first problem's input is matplotlib's sample photo; weights are random)"
                  if not args.random and first.ndim == 2 and first.c == 3 and not first.is_empty else "")
    what = "forward" if args.direction == "forward" else f"{args.direction} (torch: aten.convolution_backward)"
    rounds, calls = cmp._round_plan(args.iterations)
    if any(p.device == "cpu" for p in problems):
        timing = (f"CPU times: every candidate checked, then all timed together in {rounds} interleaved round(s) "
                  f"of {calls} call(s) each (a call during which our threads waited for a CPU is tried again; a "
                  f"row's time: the median over rounds of its fastest clean call; at most {args.budget} s each)"
                  + (f", torch default, oneDNN's first choice and the {cmp.CONFIRM_CARRY} fastest rows again in "
                     f"{args.confirm_rounds} "
                     "fresh rounds, 2-3x as many where ratios spread: the best chosen on the odd ones, its figure "
                     "from the even ones (the headline's figures)" if args.confirm_rounds else ""))
    else:
        timing = f"times: median/min of up to {args.iterations} calls after {args.warmup} warm-up"
    console.print(f"{len(problems)} problem(s), {what}{photo_note}; {timing}; error vs float64 reference")
    if args.direction != "backward_weights":
        console.print("weights: torch's call reads them on every call; so do rawconv's plain rows"
                      + ("" if args.no_prepack else ", and rows marked (prepacked) use a copy reordered once "
                         "(--no-prepack leaves those out)"), style="dim")
    if any(p.device == "cpu" for p in problems):
        meta["machine_before"] = _warn_if_busy(console, nthreads, hint)
        from ..onednn import INLINE_FLOPS

        small = [p for p in problems if p.device == "cpu" and p.flops < INLINE_FLOPS]
        if small and nthreads > 1:
            console.print(f"{len(small)} problem(s) of fewer than 2**17 FLOPs: rawconv's oneDNN plans run them "
                          f"on one thread (threads=\"auto\"; see docs/guides/threads.md)")


def _compare_summary(console, s: dict, outputs: dict) -> None:
    """``compare``'s summary lines: the counts of :func:`rawconv.compare.summary`'s ``s``, the
    output files (``outputs``: {flag: path}), the headline, then each problem found. Returns None."""
    from . import compare as cmp

    # the checked results (within + outside tolerance), then the rows that gave none to check
    others = [f"{len(s['failed'])} failed"]
    if s["not_supported"]:
        others.append(f"{len(s['not_supported'])} not supported by the library here")
    if s["skipped"]:
        others.append(f"{len(s['skipped'])} skipped")
    console.print(f"summary: {s['problems']} problem(s), {s['results']} results checked against float64: "
                  f"{s['within_tolerance']} within tolerance, {len(s['outside_tolerance'])} outside; not checked: "
                  + ", ".join(others)
                  + "".join(f"; {flag.upper() if flag in ('json', 'csv') else flag}: {path}"
                            for flag, path in outputs.items()))
    for line in cmp.headline(s):
        console.print(line, style=None if s["timings_trustworthy"] else "yellow")
    for line in s["outside_tolerance"]:
        console.print(f"  outside tolerance: {line}", style="red")
    for line in s["libraries_not_loaded"]:
        console.print(f"  library not loaded: {line}", style="red")
    for line in s["failed"]:
        console.print(f"  failed: {line}", style="red")
    if s["no_rawconv_result"]:
        console.print(f"  no rawconv candidate ran on: {', '.join(s['no_rawconv_result'])}", style="red")


def _check_writable(flag: str, path: str) -> None:
    """Refuse an output path that cannot be written, before any work (the file is created empty)."""
    try:
        with open(path, "a"):
            pass
    except OSError as exc:
        raise RawconvError(f"{flag} {path}: cannot write there ({exc.strerror})") from None


def _check_plot_format(path: str) -> None:
    """Refuse a --plot file whose extension names no image format matplotlib writes, before any
    work (savefig would raise only after the whole run). No extension: matplotlib's default (PNG)."""
    import os

    ext = os.path.splitext(path)[1][1:].lower()
    try:
        from matplotlib.backend_bases import FigureCanvasBase

        formats = FigureCanvasBase.get_supported_filetypes()
    except ImportError:   # the plot itself says matplotlib is missing
        return
    if ext and ext not in formats:
        raise RawconvError(f"--plot {path}: .{ext} is not an image format matplotlib writes (one of: "
                           f"{', '.join(sorted(formats))})")


def _write_outputs(console, args, rows, recs) -> None:
    """--csv, --plot and --record of ``compare``."""
    from ..core.results import ResultTable

    table = rows if isinstance(rows, ResultTable) else ResultTable(rows)
    if args.csv:
        table.to_csv(args.csv)
    if args.plot:
        table.plot(kind=args.plot_kind).savefig(args.plot, dpi=110, bbox_inches="tight")
    if args.record:
        from ..core.tuning import TuningRecord

        TuningRecord.save_all(recs, args.record)
        console.print(f"{len(recs)} tuning record(s) (the fastest correct rawconv choice per problem) written to "
                      f"{args.record}; rawconv replay {args.record} runs them again", highlight=False)


def cmd_replay(args) -> int:
    """``rawconv replay FILE``: run each tuning record's choice again and print the drift."""
    from . import compare as cmp
    from ..core.tuning import TuningRecord

    console = _console(args.width)
    recs = TuningRecord.load(args.file)
    recs = recs if isinstance(recs, list) else [recs]
    if not recs:
        raise RawconvError(f"{args.file} holds no tuning records")
    if not _replay_environment(console, args, recs):
        return 2
    from ..core.bench import default_threads

    nthreads = args.threads if args.threads is not None else default_threads()
    with cmp.threads(nthreads):
        if any(r.key.problem.get("device") == "cpu" for r in recs):
            _warn_if_busy(console, nthreads)
        table = cmp.replay(recs, iterations=args.iterations, warmup=args.warmup, budget_s=args.budget,
                           progress=False if args.quiet else None)
    rec_threads = {r.key.options.get("threads") for r in recs if r.key.backend == "onednn"} - {None}
    if rec_threads and rec_threads != {nthreads}:
        _warn(console, f"records timed with {', '.join(map(str, sorted(rec_threads)))} thread(s), replayed with "
                       f"{nthreads} (--threads)")
    _replay_table(console, args, table)
    if args.csv:
        table.to_csv(args.csv)
    s = cmp.replay_summary(table, hint=_LOAD_HINT)
    _replay_withheld(console, s, table)
    for line in s["timing_warnings"]:
        _warn(console, line)
    return _replay_summary(console, s)


def _replay_environment(console, args, recs: list) -> bool:
    """``replay``'s first step: say, per tuning record of ``recs``, what differs between where it
    was made and here (library, device), as warnings, or as errors with ``--strict`` (``args``).
    Returns False when ``--strict`` refuses the run (exit status 2 printed), else True."""
    import warnings

    # what differs from where each record was made: said first, refused with --strict
    differs = []
    for i, rec in enumerate(recs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            try:
                diff = rec.check_environment()
            except RawconvError as exc:
                diff = [("library", f"{rec.key.library} {rec.key.library_version}", f"not usable here: {exc}")]
        if diff:
            what = "; ".join(f"{k}: recorded {a!r}, here {b!r}" for k, a, b in diff)
            differs.append(f"record {i} ({rec.label or rec.key.backend} {rec.choice}): {what}")
    for line in differs:
        if args.strict:
            console.print(f"rawconv: error: {line}", style="red", highlight=False)
        else:
            _warn(console, line + " (times may not compare; --strict refuses this)")
    if differs and args.strict:
        console.print("exit status 2: --strict and a record was made with another library version or device",
                      style="red")
        return False
    return True


def _replay_table(console, args, table) -> None:
    """Print ``replay``'s table: per record of the replayed ``table``, the time and error now
    against when recorded, and the drift. Returns None."""

    def drift(r):
        if _finite(r.extra.get("drift")):
            return f"{100 * r.extra['drift']:+.1f}%"
        return "withheld" if r.extra.get("drift_withheld") else "-"

    cols = [Column("layer", [r.problem_name for r in table], wrap=True),
            Column("backend", [r.backend for r in table], drop=4),
            Column("choice", [r.name for r in table], wrap=True),
            Column("status", [r.status for r in table], wrap=True,
                   styles=[_STATUS_STYLE.get(r.group, "red") or None for r in table]),
            Column("recorded\nms", [fmt_ms(r.extra.get("recorded_median_ms")) for r in table], justify="right",
                   styles=["yellow" if r.extra.get("drift_withheld") else None for r in table]),
            Column("now\nms", [fmt_ms(r.median_ms) for r in table], justify="right",
                   styles=["yellow" if r.ran and r.oversubscribed else None for r in table]),
            Column("now min\nms", [fmt_ms(r.min_ms) for r in table], justify="right", drop=3),
            Column("drift", [drift(r) for r in table], justify="right",
                   styles=["yellow" if r.extra.get("drift_withheld") else None for r in table]),
            Column("recorded\nrel err", [_fmt_err(r.extra.get("recorded_max_rel")) for r in table],
                   justify="right", drop=1),
            Column("now\nrel err", [_fmt_err(r.max_rel) for r in table], justify="right", drop=2),
            Column("note", [r.message if not r.ran else "" for r in table], flex=True, drop=0)]
    render_table(console, cols, title=f"rawconv replay {args.file}: {len(table)} record(s), time and error now "
                                      "against when recorded")


def _replay_withheld(console, s: dict, table) -> None:
    """Warn about the records of the replayed ``table`` whose drift is withheld (``s``:
    :func:`rawconv.compare.replay_summary`'s summary): one line each, or, past three, one line per
    reason naming the records. Returns None."""
    withheld_rows = [r for r in table if r.extra.get("drift_withheld")]
    if len(withheld_rows) <= 3:
        for line in s["drift_withheld"]:
            _warn(console, f"no drift for {line}")
    else:   # one line per reason, naming the records
        import re

        by_why: dict = {}
        for r in withheld_rows:   # reasons alike but for a median/min figure count as one
            why = re.sub(r"median/min [\d.]+", "median/min wide", r.extra["drift_withheld"])
            by_why.setdefault(why, []).append(r.problem_name)
        for why, names in by_why.items():
            shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
            _warn(console, f"no drift for {len(names)} record(s) ({shown}): {why}")


def _replay_summary(console, s: dict) -> int:
    """Print ``replay``'s summary line (records within and outside tolerance, the geometric mean
    drift) from :func:`rawconv.compare.replay_summary`'s ``s``, and the exit status. Returns the
    exit status: 1 when a choice is outside tolerance, 4 when one failed, else 0."""
    gd = s["geomean_drift"]
    withheld = len(s["drift_withheld"])
    counted = s["within_tolerance"] - withheld
    if gd is None:
        drift = (f"none to report: the {withheld} record(s) within tolerance were made on an unreliable run"
                 if withheld else "no record ran within tolerance")
    else:
        drift = (f"{100 * gd:+.1f}% over {counted} record(s)"
                 + (f" ({withheld} withheld: recorded on an unreliable run)" if withheld else "")
                 + ("" if s["timings_trustworthy"] else " [UNRELIABLE: see the timing warnings]"))
    console.print(f"summary: {s['records']} record(s): {s['within_tolerance']} within tolerance, "
                  f"{len(s['outside_tolerance'])} outside, {len(s['failed'])} failed or no longer offered; "
                  f"median time now / recorded, geometric mean drift: {drift}", highlight=False)
    wrong = s["outside_tolerance"]
    bad = s["failed"]
    code = 1 if wrong else 4 if bad else 0
    why = {0: "every record ran within tolerance", 1: "a replayed choice is outside tolerance",
           4: "a recorded choice failed or is no longer offered here"}[code]
    console.print(f"exit status {code}: {why}", style="dim" if code == 0 else "red")
    return code


def cmd_info(args) -> int:
    from .info import collect

    data = collect()
    if args.json:
        print(json.dumps(data, indent=1, default=str))
        return 0
    keys, values = [], []

    def add(prefix, d):
        for k, v in d.items():
            if isinstance(v, dict):
                add(prefix + k + ".", v)
            else:
                keys.append(prefix + k)
                values.append(str(v))

    add("", data)
    console = _console(args.width)
    cols = [Column("key", keys), Column("value", values, flex=True, flex_min=20)]
    room = dict((c.header, w) for c, w in fit_columns(cols, console.width))["value"]
    cols[1].cells = [_break_long(v, room) for v in values]
    render_table(console, cols, title="rawconv info")
    return 0


def _break_long(text: str, room: int) -> str:
    """``text`` with each word longer than ``room`` broken after a separator (``/`` in paths,
    ``.``, ``_``, ``,``, ``:``, ``@``: :data:`_SEPARATORS`), so that a long path or name wraps
    between its parts, not inside one."""
    out = []
    for word in text.split(" "):
        lines, line = [], ""
        for part in _parts(word):
            if line and len(line) + len(part) > room:
                lines.append(line)
                line = ""
            line += part
        out.append("\n".join(lines + [line]))
    return " ".join(out)


def cmd_list(args) -> int:
    from ..core.results import status_group
    from .plan_rows import print_listings

    console, failed = _console(args.width), 0
    for p in _problems(args):
        print_listings(console, p, args.direction)   # registered backends without a table of their own
        x, w, b = p.make_inputs()
        if p.device.startswith("cuda"):
            from .. import cudnn

            rows = cudnn.algorithms(x, w, b, p.stride, list(zip(p.pad_before, p.pad_after)), p.dilation, p.groups)
            console.print(str(p))
            for r in rows:
                console.print(f"  {r}")
            continue
        from .. import onednn
        from ..core import known_bad
        iso = {"timeout_s": args.timeout} if args.isolate else False
        impls = onednn.implementations(x, w, b, p.stride, list(zip(p.pad_before, p.pad_after)), p.dilation, p.groups,
                                       direction=args.direction, fpmath=args.fpmath, isolate=iso,
                                       allow_known_bad=args.allow_known_bad)
        bad = any(i.known_bad for i in impls)
        cols = [Column("#", [str(i.index) for i in impls], justify="right"),
                # the candidate's one name (what choice= takes, every table shows): name@layouts
                Column("implementation", [i.choice for i in impls]),
                Column("formats", [" ".join(f"{k}={v}" for k, v in i.formats.items()) for i in impls], flex=True,
                       flex_min=12),
                Column("reorders", [",".join(i.reorders) or "none" for i in impls], wrap=True),
                Column("scratchpad", [fmt_bytes(i.scratchpad_bytes) for i in impls], justify="right")]
        if bad:
            cols.append(Column("known bad", [known_bad.short(i.known_bad) if i.known_bad else "" for i in impls],
                               wrap=True))
        if args.isolate:   # each ran once in a child process, checked against float64
            cols.append(Column("status (isolated run)", [i.status + (f": {i.detail}" if i.detail and i.status != "ok"
                                                                    else "") for i in impls], wrap=True))
        render_table(console, cols, title=f"{p} ({args.direction}, fpmath {args.fpmath})"
                     + ("; each run once in a child process" if args.isolate else ""))
        if args.isolate:   # compare's exit codes: a wrong answer (1) before a failed candidate (4)
            groups = {status_group(i.status) for i in impls}
            failed = 1 if "wrong" in groups or failed == 1 else 4 if "failed" in groups else failed
    if failed:
        from .compare import EXIT_CODES

        console.print(f"exit status {failed}: {EXIT_CODES[failed]}", style="red")
    return failed


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


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``rawconv compare: error: ... (rawconv compare --help)``, exit 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help says more)\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``rawconv`` command line's parser: ``compare``, ``info``, ``replay``, ``list`` (one function
    each below)."""
    ap = _Parser(prog="rawconv", description="List, force, time and check every convolution "
                                 "algorithm of oneDNN and cuDNN on torch tensors.")
    ap.add_argument("--version", action="version", version=f"rawconv {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for add in (_add_compare, _add_info, _add_replay, _add_list):
        add(sub)
    return ap


def _isolate_args(p, what) -> None:
    """--isolate and --timeout (compare, list)."""
    p.add_argument("--isolate", action="store_true",
                   help=f"run {what} in a child process: a crash, abort or hang of one becomes its row's status "
                        "('crashed: SIGABRT', 'timed out after N s') and rawconv goes on")
    p.add_argument("--timeout", type=_positive_float, default=60.0,
                   help="with --isolate: seconds one candidate may take in the child (default 60)")


def _problem_args(p) -> None:
    """The problem: a preset or benchdnn descriptor, or shapes and torch's arguments (compare, list)."""
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


def _width_arg(p) -> None:
    """--width (every subcommand that prints a table)."""
    p.add_argument("--width", type=_width, default=None,
                   help=f"table width in columns, at least {MIN_WIDTH} (default: the terminal's, or $COLUMNS; "
                        "through a pipe or into a file, none: lines as long as their content). Narrow tables "
                        "leave out columns (detail, GFLOP/s, scratch, max abs err, ...) rather than split a "
                        "number")


def _add_compare(sub) -> None:
    """The ``compare`` subcommand's arguments."""
    from ..core.bench import SPREAD_LIMIT
    from .compare import CONFIRM_ROUNDS, EXIT_CODES, REF_MAX_SECONDS

    import textwrap

    codes = "\n".join(textwrap.fill(v, 78, initial_indent=f"  {k}  ", subsequent_indent="     ")
                      for k, v in EXIT_CODES.items())
    c = sub.add_parser(
        "compare", help="time and check torch and every rawconv implementation",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Time torch's convolution and every rawconv implementation on each problem, check each result "
                    "against a float64 reference, and print one table per problem and a summary.",
        epilog="row status: ok, wrong (outside tolerance), failed (library error), not supported (the library "
               "offers nothing\nfor this problem here, e.g. bf16 on an AVX2 CPU), skipped (not run on purpose).\n"
               "timing warnings (CPU): printed when rows had no clean call (one during which our threads did not "
               "wait\nfor a CPU) in most rounds, or their per-round times disagree; GPU rows: when median/min exceeds "
               f"{SPREAD_LIMIT:g}.\nThe headline is then marked UNRELIABLE.\n\n"
               "exit status (when several apply: 1, then 3, then 4):\n" + codes)
    _problem_args(c)
    c.add_argument("--iterations", type=_positive_int, default=10,
                   help="timed calls per candidate (default 10; on the CPU spread over up to 5 interleaved rounds)")
    c.add_argument("--warmup", type=_nonneg_int, default=2, help="untimed calls per candidate (default 2)")
    c.add_argument("--budget", type=_positive_float, default=0.25, help="seconds of timing per candidate at most (at least one timed call per round); a candidate whose first call (which also builds it) takes longer is timed by one more call alone (default 0.25)")
    c.add_argument("--confirm-rounds", type=_nonneg_int, default=CONFIRM_ROUNDS,
                   help="CPU: fresh interleaved rounds in which torch default, oneDNN's first choice and the fastest "
                        "few rows of the first rounds are timed again, 2 or 3 times as many where their ratios spread; "
                        "the best is chosen on the odd ones, its figure (the headline's) taken from the even ones, "
                        f"free of the winner's curse (default "
                        f"{CONFIRM_ROUNDS}; 0: none, the headline then says its best-of-N was picked on its timings)")
    c.add_argument("--threads", type=_thread_count, default=None,
                   help="torch/oneDNN threads (default: the CPUs this process may use, from its affinity mask and "
                        "cgroup quota, capped by torch's thread count, which OMP_NUM_THREADS sets; more would "
                        "oversubscribe the machine; at most 8 per CPU, at least 64)")
    c.add_argument("--json", help="also write the results as JSON to this file")
    c.add_argument("--csv", help="also write the rows as CSV to this file (rawconv.results.ResultTable.to_csv)")
    c.add_argument("--plot", help="also plot the results to this image file (PNG, SVG, PDF: by its extension): "
                                  "per problem, bars of median time per candidate (min as a tick) with torch "
                                  "default as a dashed line; many problems: a heat map (--plot-kind)")
    c.add_argument("--plot-kind", default="auto", choices=["auto", "bars", "heatmap"],
                   help="bars: one panel per problem; heatmap: problems x candidates, time relative to torch "
                        "default; auto (default): bars up to 6 problems, else heatmap")
    c.add_argument("--record", help="write tuning records (JSON, rawconv.tuning schema 1) of the fastest correct "
                                    "rawconv choice per problem to this file; 'rawconv replay FILE' runs them again")
    c.add_argument("--quiet", action="store_true", help="no progress bar (there is none when stderr is not a "
                                                         "terminal)")
    c.add_argument("--random", action="store_true", help="random input everywhere (no sample photo)")
    c.add_argument("--no-prepack", action="store_true",
                   help="time oneDNN with the weights read and reordered on every call only, as torch's call does "
                        "(by default an implementation whose weights need a reorder also gets a '(prepacked)' row, "
                        "timed with a copy reordered once)")
    c.add_argument("--direction", default="forward", type=_direction,
                   help="forward (default), backward_data (the input's gradient) or backward_weights (the weight's; "
                        "backward_filter too): torch runs aten.convolution_backward for that gradient alone, "
                        "rawconv the library's backward primitives")
    refs = c.add_mutually_exclusive_group()
    refs.add_argument("--no-ref", action="store_true", help="leave out oneDNN's reference (ref:any) implementations")
    refs.add_argument("--ref", action="store_true",
                      help="run oneDNN's reference implementations whatever their estimated time (by default one "
                           "whose call is estimated above --ref-limit seconds is listed as skipped, not run)")
    c.add_argument("--ref-limit", type=_positive_float, default=REF_MAX_SECONDS,
                   help=f"seconds per call above which a reference implementation is not run, estimated from its "
                        f"measured rate on a tiny problem (default {REF_MAX_SECONDS:g})")
    c.add_argument("--engines", default=None, help="cuDNN graph-API engines: 'all' or the top N by heuristic")
    _isolate_args(c, "the oneDNN candidates")
    c.add_argument("--allow-known-bad", action="store_true",
                   help="also run oneDNN implementations rawconv.known_bad lists for a problem (they may crash, "
                        "hang or give wrong results; see docs/guides/known-bad.md)")
    _width_arg(c)
    c.set_defaults(func=cmd_compare)


def _add_info(sub) -> None:
    """The ``info`` subcommand's arguments."""
    i = sub.add_parser("info", help="versions, library paths and how they were found")
    i.add_argument("--json", action="store_true")
    _width_arg(i)
    i.set_defaults(func=cmd_info)


def _add_replay(sub) -> None:
    """The ``replay`` subcommand's arguments."""
    import textwrap

    rp = sub.add_parser(
        "replay", help="run the choices of tuning records again and print the drift in time and error",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill(
            "Run exactly the choice of each tuning record in FILE (written by 'rawconv compare --record', "
            "rawconv.tuning.TuningRecord.save/save_all or a tuning cache file) on random inputs of its "
            "problem, time it as compare does, check it against float64 and print time and error now "
            "beside what was recorded. Warns when a record was made with another library version or "
            "device, naming what differs (--strict refuses to run then).", 78),
        epilog="exit status: 0 every record ran within tolerance; 1 a replayed choice is outside tolerance; 2 bad "
               "file, or --strict and\nthe library version or device differs; 4 a recorded choice failed or is no "
               "longer offered here.")
    rp.add_argument("file", help="a JSON file of tuning records")
    rp.add_argument("--strict", action="store_true",
                    help="refuse (exit 2) when a record was made with another library version or device")
    rp.add_argument("--iterations", type=_positive_int, default=10, help="timed calls per record (default 10)")
    rp.add_argument("--warmup", type=_nonneg_int, default=2, help="untimed calls per record (default 2)")
    rp.add_argument("--budget", type=_positive_float, default=0.5,
                    help="seconds of warm-up and timing per record at most (default 0.5)")
    rp.add_argument("--threads", type=_thread_count, default=None,
                    help="torch/oneDNN threads (default: as compare's --threads)")
    rp.add_argument("--csv", help="also write the replayed rows as CSV to this file")
    rp.add_argument("--quiet", action="store_true", help="no progress bar")
    _width_arg(rp)
    rp.set_defaults(func=cmd_replay)


def _add_list(sub) -> None:
    """The ``list`` subcommand's arguments."""
    ls = sub.add_parser("list", help="list every implementation/algorithm for a problem (no timing)",
                        epilog="exit status (as rawconv compare's): 0, or with --isolate 1 when a row is wrong "
                               "(outside tolerance, or it wrote past its scratchpad) and 4 when one crashed, hung "
                               "or failed; 2 for a bad command line")
    _problem_args(ls)
    ls.add_argument("--direction", default="forward", type=_direction,
                    help="forward (default), backward_data or backward_weights (backward_filter too)")
    _isolate_args(ls, "each oneDNN implementation once (checked against float64)")
    ls.add_argument("--allow-known-bad", action="store_true",
                    help="with --isolate: also run the implementations rawconv.known_bad lists (in the child)")
    _width_arg(ls)
    ls.set_defaults(func=cmd_list)


def _validate(args) -> None:
    """Flag combinations that mean nothing or contradict each other, and problems too large for
    this host's memory: a :class:`RawconvError` before anything runs."""
    from ..core.guard import check_memory

    given = getattr(args, "problem", None)
    if getattr(args, "layers", None) is not None:
        from ..core import presets

        if args.input is not None or args.weight is not None:
            raise RawconvError("--layers selects layers of a preset; it means nothing with --input/--weight")
        if given is not None and given not in presets.PRESETS:
            raise RawconvError(f"--layers selects layers of a preset ({', '.join(sorted(presets.PRESETS))}); "
                               f"{given!r} is a single problem")
    if args.cmd == "compare":
        from .compare import REF_MAX_SECONDS

        if args.ref_limit != REF_MAX_SECONDS and (args.ref or args.no_ref):
            raise RawconvError("--ref-limit decides which reference implementations run; with "
                               f"{'--ref' if args.ref else '--no-ref'} it means nothing")
        cuda = any(d.startswith("cuda") for d in _devices(args))
        if args.engines is not None:
            e = str(args.engines).strip()
            if not (e == "all" or (e.isdigit() and int(e) > 0)):
                raise RawconvError(f"--engines must be 'all' or a positive number of engine configs, got {e!r}")
            if not cuda:
                raise RawconvError("--engines selects cuDNN graph-API engines, which run on a GPU; this run has none "
                                   + ("(--device cpu)" if args.device == "cpu" else "(torch sees no CUDA device)"))
    if getattr(args, "fpmath", "strict") != "strict" and all(d.startswith("cuda") for d in _devices(args)):
        raise RawconvError(f"--fpmath {args.fpmath} is oneDNN's (CPU) setting; this run has no CPU problem "
                           f"(--device {args.device})")
    if args.cmd in ("compare", "list") and "cpu" in _devices(args):
        _check_offered(args)
    if args.cmd in ("compare", "list"):
        import math

        for p in _problems(args):
            es = 8 if p.dtype == "float64" else 4 if p.dtype == "float32" else 2
            nx, nw, ny = math.prod(p.x_shape), math.prod(p.w_shape), math.prod(p.y_shape)
            need = (nx + nw) * (8 + es)     # make_inputs: float64 draws and the tensors
            if args.cmd == "compare":       # float64 reference inputs (and |.|), reference, its scale, outputs
                need += 2 * 8 * (nx + nw) + 2 * 8 * ny + 2 * es * ny
            check_memory(need, f"rawconv {args.cmd} on {p.describe()}")


def _check_offered(args) -> None:
    """Refuse a dtype (for the direction asked) that rawconv's oneDNN offers nothing for on this
    CPU, before anything runs, in oneDNN's own words (:func:`rawconv.onednn.capabilities`):
    ``--dtype float64`` (oneDNN has no float64 convolution) and, on CPUs without the
    instructions, ``float16`` / ``bfloat16``. A dtype with only the reference implementation
    passes (it runs, slowly)."""
    import torch

    from .. import onednn

    direction = getattr(args, "direction", "forward")
    where = " (--device cuda runs it on cuDNN)" if torch.cuda.is_available() else ""
    if args.dtype not in onednn.DTYPES:
        raise RawconvError(f"--dtype {args.dtype}: rawconv's oneDNN handles {', '.join(onednn.DTYPES)} only "
                           f"(oneDNN has no {args.dtype} convolution on CPUs){where}")
    try:
        caps = onednn.capabilities()
    except RawconvError:   # oneDNN did not load: compare says so in its rows (exit status 3)
        return
    try:
        row = caps.row(direction, args.dtype)
    except RawconvError:   # not probed: let the run say
        return
    if not row.offered and not row.reference:
        raise RawconvError(f"--dtype {args.dtype}: {caps.reason(direction, args.dtype)}; rawconv info shows what "
                           f"this oneDNN offers{where}")


def _one_line(exc: BaseException) -> str:
    return "; ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__


def main(argv=None) -> int:
    """The command line; returns the exit status. Every error is one line on stderr (``rawconv:
    error: ...``) and a non-zero status (2, or 130 for Ctrl-C), never a traceback: bad flags and
    flag combinations, problems, problems too large for this host's memory, allocation failures,
    output files that cannot be written, library errors."""
    import warnings

    from ..core.errors import SlowReferenceWarning

    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        with warnings.catch_warnings():   # a call about to run long on oneDNN's reference code: one line first
            shown = warnings.showwarning

            def show(message, category, filename, lineno, file=None, line=None):
                if issubclass(category, SlowReferenceWarning):
                    print(f"rawconv: warning: {message}", file=sys.stderr, flush=True)
                else:
                    shown(message, category, filename, lineno, file, line)
            warnings.showwarning = show
            warnings.simplefilter("always", SlowReferenceWarning)
            _validate(args)
            return args.func(args)
    except KeyboardInterrupt:
        print("rawconv: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:   # the reader went away (| head): nothing more to say
        import os

        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError:
            pass
        return 2
    except RawconvError as exc:
        outs = [f"--{k} {v}" for k in ("json", "csv", "record", "plot") if isinstance(v := getattr(args, k, None), str)]
        where = f" ({', '.join(outs)})" if isinstance(exc, OSError) and outs else ""
        print(f"rawconv: error: {_one_line(exc)}{where}", file=sys.stderr)
        return 2
    except (OverflowError, MemoryError) as exc:
        print(f"rawconv: error: problem too large: {_one_line(exc)}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"rawconv: error: {exc.filename + ': ' if exc.filename else ''}{exc.strerror or _one_line(exc)}",
              file=sys.stderr)
        return 2
    except Exception as exc:   # noqa: BLE001  (a bug: still one line, with what it was)
        print(f"rawconv: error: unexpected {type(exc).__name__}: {_one_line(exc)} (please report it; "
              "python -X faulthandler -m rawconv.cli ... for more)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
