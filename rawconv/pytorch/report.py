"""What :func:`rawconv.nn.convert` and :func:`rawconv.nn.describe` return: :class:`ConvertReport`,
:class:`LayerReport` rows and their table (:func:`format_table`, :func:`print_table`)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from ..core import guard as _guard

FACE = "rawconv.pytorch.nn"   # where this module's public names live (rawconv.nn): pickles, messages


# ---------------------------------------------------------------------------- convert's report
@dataclass
class ConvertReport:
    """What :func:`convert` did: ``swapped`` (module names now on rawconv), ``folded`` (conv, batchnorm
    pairs), ``fused`` (module name -> "relu" / "add+relu" / "add" / "bias"), ``traced`` (whether torch.fx
    traced the model; False: module-level fusion only, ``trace_error`` says why), ``tuned`` (one dict
    per conv layer: name, kind, problem, backend, choice, searched, seconds, note; for a searched one
    also the winner's ``median_ms`` / ``min_ms`` (GPU or wall ms per call) and, on cuDNN, ``plan_s``
    (seconds to set up the plan: graph, heuristics) and ``search_s`` (the autotune's own seconds)),
    ``autotune_s`` (wall seconds of the search), ``backward`` (whether the backward passes were
    searched too: ``autotune_backward``), ``autotune_new`` (what a problem the example did not
    show runs: ``"default"`` or ``"search"``). Each ``tuned`` entry (one per layer and distinct
    problem) also holds ``backward_choice`` (the pair pinned for its backward passes, None: the
    libraries' defaults), ``directions`` (every pinned choice by library direction) and
    ``backward_searched``.

    ``fusion`` (module name -> dict; ``fuse=True`` with ``autotune=``, oneDNN layers): whether the
    fused call was measured faster than the same convolution with only its bias fused followed by
    torch's own add and activation (:func:`rawconv.pytorch.fusion.measure_cpu`): ``decision``
    (``"fused"`` / ``"unfused"``), ``fused_ms`` / ``unfused_ms`` (median ms per call over the
    rounds), ``fused_min_ms`` / ``unfused_min_ms``, ``rounds``, ``reason``, ``fused_choice`` /
    ``unfused_choice``, ``measured`` (False: the decision of an earlier layer of the same problem);
    or ``{"decision": ..., "reason": ...}`` where it was not measured here (cuDNN layers: their graph
    autotune's choice, an ``"unfused:"`` config or a fused one; nothing to unfuse). ``fusion_measured``: False when ``fuse=True`` had no example input to measure on
    (every fusable layer fused, as before).

    ``fallback`` (layer name -> reason): the layers whose calls run on torch's own kernel because no
    rawconv library can run them (their parameters' dtype or device: float64 on the CPU, a
    float16 model where this CPU's oneDNN has no float16...; or seen so during the autotune's
    example run): :mod:`rawconv.pytorch.fallback`.

    ``left_on_torch`` (layer name -> reason): the conv modules convert did not put on rawconv: a
    subclass of torch's conv class that computes its own way (its own ``forward``,
    ``_conv_forward`` or ``_output_padding``: timm's ``StdConv2d``, ``Conv2dSame``); a
    ``RuntimeWarning`` names them too."""

    swapped: list = field(default_factory=list)
    folded: list = field(default_factory=list)
    fused: dict = field(default_factory=dict)
    traced: bool | None = None
    trace_error: str = ""
    tuned: list = field(default_factory=list)
    autotune_s: float = 0.0
    backward: bool = False
    autotune_new: str = "default"
    timing_warnings: list = field(default_factory=list)   # each search's TimingWarning text (a busy machine)
    fusion: dict = field(default_factory=dict)
    fusion_measured: bool | None = None
    fallback: dict = field(default_factory=dict)   # layer name -> why its calls run on torch's own kernel
    left_on_torch: dict = field(default_factory=dict)   # layer name -> why convert left that conv module alone

    def __str__(self) -> str:
        n = len(self.tuned)
        distinct = len({t["key"] for t in self.tuned})
        searched = sum(1 for t in self.tuned if t["searched"])
        lines = [f"rawconv.nn.convert: {len(self.swapped)} conv modules on rawconv, {len(self.folded)} BatchNorms "
                 f"folded, {len(self.fused)} fused ({', '.join(sorted(set(self.fused.values()))) or 'none'})"]
        if self.traced is False:
            lines.append(f"  torch.fx could not trace the model ({self.trace_error}): module-level fusion only")
        if self.left_on_torch:
            names = list(self.left_on_torch)
            lines.append(f"  {len(names)} conv module(s) left on torch (a subclass with its own forward): "
                         f"{', '.join(names[:6])}{', ...' if len(names) > 6 else ''}")
        if self.fallback:
            by: dict = {}
            for name, why in self.fallback.items():
                by.setdefault(why, []).append(name or "(the model)")
            for why, names in by.items():
                lines.append(f"  {len(names)} layer(s) run on torch's own kernel: {why} ({', '.join(names[:6])}"
                             f"{', ...' if len(names) > 6 else ''})")
        if n:
            lines.append(f"  autotune: {n} layers, {distinct} distinct problems, {searched} searched, "
                         f"{self.autotune_s:.2f} s")
            if self.backward:
                bs = sum(1 for t in self.tuned if t.get("backward_searched"))
                lines.append(f"  backward passes (data, weights) pinned per problem too; {bs} layers searched new "
                             "backward problems")
            else:
                lines.append("  backward passes not searched (autotune_backward=False): the libraries' defaults")
            lines.append("  other problems (batch size, layout, dtype, size) than the example's: "
                         + ("searched at their first call" if self.autotune_new == "search"
                            else "the libraries' defaults (autotune_new='search' searches them)"))
            vs = [t for t in self.tuned if t.get("searched") and t.get("vs_torch")]
            if vs:
                g = math.exp(sum(math.log(t["vs_torch"]) for t in vs) / len(vs))
                worst = min(vs, key=lambda t: t["vs_torch"])
                slow = sum(1 for t in vs if t["vs_torch"] < 0.97)
                how = ("(cudnn.benchmark on), GPU time" if all(t.get("backend") == "cudnn" for t in vs) else
                       "(oneDNN in torch), wall time in interleaved rounds" if all(t.get("backend") == "onednn" for t in vs)
                       else "(CUDA: GPU time; CPU: wall time in interleaved rounds)")
                lines.append(f"  against torch's own call {how}, {len(vs)} searched problems: "
                             f"geomean {g:.3f}x (torch / rawconv), {slow} more than 3% slower than torch, worst "
                             f"{worst['vs_torch']:.3f}x ({worst['name']}: rawconv {worst['choice']}, torch "
                             f"{worst.get('torch_engine', '?')}); per layer: report.table()")
        lines += self._fusion_lines()
        return "\n".join(lines)

    def table(self) -> str:
        """One line per searched layer: what rawconv runs, what torch ran (its cuDNN engine, with
        ``cudnn.benchmark`` on), both GPU times and their ratio (torch / rawconv), and any note."""
        rows = [f"{'layer':<28} {'kind':<6} {'rawconv runs':<34} {'torch runs':<11} {'rawconv ms':>10} "
                f"{'torch ms':>9} {'ratio':>6}"]
        for t in self.tuned:
            if not t.get("searched"):
                continue
            ratio = t.get("vs_torch")
            rows.append(f"{t['name'][:28]:<28} {t['kind']:<6} {str(t['choice'])[:34]:<34} "
                        f"{str(t.get('torch_engine', '-')):<11} "
                        f"{t.get('rawconv_ms', float('nan')):>10.4f} {t.get('torch_ms', float('nan')):>9.4f} "
                        f"{(f'{ratio:.3f}' if ratio else '-'):>6}"
                        + (f"  {t['vs_torch_note']}" if t.get("vs_torch_note") else ""))
        return "\n".join(rows)

    def _fusion_lines(self) -> list:
        if self.fused and self.fusion_measured is False:
            return ["  fusion not measured (no example input; convert(..., autotune=x) keeps a fused layer only "
                    "where it is measured faster): every fusable layer fused"]
        if not self.fusion_measured:
            return []
        timed = [k for k, e in self.fusion.items() if "fused_ms" in e]
        unf = [k for k in timed if self.fusion[k]["decision"] == "unfused"]
        out = [f"  fusion measured on {len(timed)} layers (fused vs conv + bias, then torch's add and activation): "
               f"{len(timed) - len(unf)} kept fused, {len(unf)} unfused"]
        out += [f"    {k}: unfused: {self.fusion[k].get('reason', '')}" for k in unf]
        return out


# ---------------------------------------------------------------------------- describe's rows
@dataclass
class LayerReport:
    """One convolution layer in :func:`describe`: what rawconv and torch run, their times (ms;
    CPU: both timed together in interleaved rounds, each round's fastest clean call, median over
    rounds; CUDA: GPU time with calls queued behind a busy GPU) and their errors against float64
    (max |y - ref| / max |ref|). ``backward``: what the layer's backward passes run in a
    training step (the library's choice for each, by its one name); ``ratio``: torch's time over
    rawconv's taken within each round (``value``, ``lo``/``hi`` the interquartile range;
    :class:`rawconv.bench.Ratio`); ``timing_flags``: what was measured against those times
    (waited for a CPU, rounds disagree), as ``compare`` flags its rows."""

    name: str
    module: str
    problem: str
    rawconv_backend: str
    rawconv_runs: str
    torch_backend: str
    torch_runs: str
    rawconv_ms: float | None = None
    torch_ms: float | None = None
    rawconv_err: float | None = None
    torch_err: float | None = None
    note: str = ""
    backward: str = ""
    ratio: dict | None = None
    timing_flags: list = field(default_factory=list)

    @property
    def speedup(self) -> float | None:
        """torch time / rawconv time (> 1: rawconv is faster): the median of the per-round ratios
        where the two were timed in rounds, else the ratio of the times."""
        if self.ratio is not None and self.ratio.get("value") is not None:
            return self.ratio["value"]
        if self.rawconv_ms and self.torch_ms:
            return self.torch_ms / self.rawconv_ms
        return None

    def __str__(self) -> str:
        def f(v, fmt):
            return format(v, fmt) if v is not None else "-"
        return (f"{self.name} [{self.module}] {self.problem}\n"
                f"  rawconv: {self.rawconv_backend} {self.rawconv_runs}  {f(self.rawconv_ms, '.4f')} ms  "
                f"err {f(self.rawconv_err, '.2e')}\n"
                + (f"  rawconv backward: {self.backward}\n" if self.backward else "")
                + f"  torch:   {self.torch_backend} {self.torch_runs}  {f(self.torch_ms, '.4f')} ms  "
                f"err {f(self.torch_err, '.2e')}" + (f"\n  note: {self.note}" if self.note else "")
                + "".join(f"\n  timing: {t}" for t in self.timing_flags))


class DescribeTable(list):
    """The rows of :func:`describe` (a list of :class:`LayerReport`) with a table as its repr;
    ``warnings``: the timing warnings of the run (as ``compare`` prints them: rows that waited
    for a CPU in most rounds, rounds that disagree)."""

    warnings: list = []

    def __repr__(self) -> str:
        return format_table(self)

    __str__ = __repr__


def _fmt_x(r: LayerReport) -> str:
    v = r.speedup
    if v is None:
        return "-"
    q = r.ratio
    iv = f" [{q['lo']:.2f}-{q['hi']:.2f}]" if q and q.get("lo") is not None else ""
    return f"{v:.2f}{iv}" + (" !" if r.timing_flags else "")


def format_table(rows: Sequence[LayerReport]) -> str:
    """The rows as a fixed-width table (one line per layer, no cell cut), then what ``x`` means,
    each layer's backward passes and note (why that choice runs there, what failed), and the
    timing warnings (:attr:`DescribeTable.warnings`)."""
    head = ("layer", "module", "problem", "rawconv runs", "ms", "err", "torch runs", "ms", "err", "x [IQR]")
    body = []
    for r in rows:
        def f(v, fmt):
            return format(v, fmt) if v is not None else "-"
        body.append((r.name, r.module, r.problem, f"{r.rawconv_backend}: {r.rawconv_runs}", f(r.rawconv_ms, ".3f"),
                     f(r.rawconv_err, ".1e"), f"{r.torch_backend}: {r.torch_runs}", f(r.torch_ms, ".3f"),
                     f(r.torch_err, ".1e"), _fmt_x(r)))
    widths = [max([len(h)] + [len(b[i]) for b in body]) for i, h in enumerate(head)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()   # noqa: E731
    out = [line(head), line(["-" * w for w in widths])] + [line(b) for b in body]
    out.append("ms: per call (CPU: rawconv and torch timed together in interleaved rounds, each round's fastest call "
               "during which our threads did not wait for a CPU, median over rounds; CUDA: GPU time); err: max "
               "|y - ref| / max |ref| against float64; x: torch ms / rawconv ms (> 1: rawconv faster), the median of "
               "the ratios taken within each round [their interquartile range]; !: time not to be trusted (see the "
               "layer's timing line)")
    out += [f"backward {r.name}: {r.backward}" for r in rows if r.backward]
    out += [f"note {r.name}: {r.note}" for r in rows if r.note]
    out += [f"timing {r.name}: {t}" for r in rows for t in r.timing_flags]
    out += [f"warning: {w}" for w in getattr(rows, "warnings", []) or []]
    return "\n".join(out)


def print_table(rows: Sequence[LayerReport], file=None) -> None:
    """Print :func:`describe`'s rows as a table."""
    print(format_table(rows), file=file)


# saved models and pickles name these classes by their face's path (as before the split)
for _cls in (ConvertReport, LayerReport, DescribeTable,):
    _cls.__module__ = FACE


# every public entry point raises only rawconv's exception classes (rawconv._guard)
_guard.guard_module(globals(), "print_table", where=FACE)
