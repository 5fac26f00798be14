"""How a :class:`~rawconv.results.ResultTable` is drawn: the HTML table a notebook shows
(:func:`html_table`, ``ResultTable._repr_html_``) and the matplotlib plots (:func:`plot`,
``ResultTable.plot``: bars per problem, a heat map of problems x candidates).

The rows and their text view are data of :mod:`rawconv.core.results`; this module, above it in the
layers, only presents them (core does not import it: the package root hands it to
``rawconv.core.results.set_render_loader``). matplotlib and numpy are imported when a plot is drawn.
"""
from __future__ import annotations

from ..core.errors import ArgumentError
from ..core.results import Result, ResultTable, by_problem, finite, fmt_bytes, fmt_ms, unreliable_banner

__all__ = ["html_table", "plot"]


def plot(table: ResultTable, ax=None, *, kind: str = "auto", reference_ms: float | None = None,
         log: bool | None = None, title: str | None = None, figsize=None):
    """:meth:`ResultTable.plot <rawconv.results.ResultTable.plot>` of ``table``: the ``Figure``
    (``kind`` ``"bars"``, ``"heatmap"`` or ``"auto"``; the method's docstring says what each
    draws). Raises :class:`~rawconv.errors.ArgumentError` for an unknown ``kind``, an empty table,
    or ``ax`` with several panels."""
    if kind not in ("auto", "bars", "heatmap"):
        raise ArgumentError(f"kind must be 'auto', 'bars' or 'heatmap', got {kind!r}")
    groups = by_problem(table)
    if not groups:
        raise ArgumentError("nothing to plot: the table has no rows")
    if kind == "auto":
        kind = "bars" if len(groups) <= 6 else "heatmap"
    if kind == "heatmap":
        return _plot_heatmap(table, groups, ax, title, figsize)
    return _plot_bars(table, groups, ax, reference_ms, log, title, figsize)


def _best_of(rows: list[Result]) -> Result | None:
    """The fastest correct rawconv row of one problem's rows, when there is a choice (two or more
    rows ran): what displays highlight."""
    ok = [r for r in rows if r.ok and not r.reference and finite(r.median_ms)]
    if sum(r.ran for r in rows) < 2:
        return None
    return min(ok, key=lambda r: r.median_ms) if ok else None


# ---------------------------------------------------------------------------- HTML
# translucent grounds over the theme's own background, text in the theme's color: readable in
# Jupyter's light and dark themes alike
_GREEN_BG = "rgba(46,160,67,0.25)"
_RED_BG = "rgba(229,72,77,0.22)"
_REF_BG = "rgba(128,128,128,0.14)"
_RED_TEXT = "#e5484d"
_WARN_BG = "rgba(245,166,35,0.30)"
_RULE = "1px solid rgba(128,128,128,0.45)"

_HTML_COLS = (  # (header, getter, numeric)
    ("backend", lambda r: r.backend, False),
    ("library", lambda r: r.library, False),
    ("candidate", lambda r: r.name, False),
    ("status", lambda r: r.status, False),
    ("median ms", lambda r: fmt_ms(r.median_ms), True),
    ("min ms", lambda r: fmt_ms(r.min_ms), True),
    ("med/min", lambda r: f"{r.spread:.2f}" if finite(r.spread) else "-", True),
    ("timing", lambda r: _timing_cell(r), False),
    ("max rel err", lambda r: f"{r.max_rel:.1e}" if finite(r.max_rel) else "-", True),
    ("workspace", lambda r: fmt_bytes(r.workspace_bytes), True),
    ("GFLOP/s", lambda r: (f"{r.gflops:.1f}" if r.gflops >= 1 or r.gflops == 0 else f"{r.gflops:.3g}")
     if finite(r.gflops) else "-", True),
    # replayed tuning records (rawconv.compare.replay): what was recorded, and the drift since
    ("recorded ms", lambda r: fmt_ms(r.extra.get("recorded_median_ms")), True),
    ("drift", lambda r: f"{100 * r.extra['drift']:+.1f}%" if finite(r.extra.get("drift"))
     else "withheld" if r.extra.get("drift_withheld") else "-", True),
    ("recorded rel err", lambda r: f"{r.extra['recorded_max_rel']:.1e}" if finite(r.extra.get("recorded_max_rel"))
     else "-", True),
    ("detail", lambda r: (r.detail if r.group in ("ok", "wrong", "listed") else (r.message or r.detail)), False),
)


def _timing_cell(r: Result) -> str:
    """A short mark for a row whose time is not to be trusted (HTML; the full reason as a tooltip)."""
    if not (r.ran and r.timing_flags):
        return ""
    from html import escape

    short = "; ".join("busy" if f.startswith("machine") else f.split(":")[0] for f in r.timing_flags)
    return f'<span title="{escape("; ".join(r.timing_flags), quote=True)}">&#9888; {escape(short)}</span>'


def html_table(table: ResultTable) -> str:
    from html import escape

    groups = by_problem(table)
    rows = [r for _, rs in groups for r in rs]
    listing = all(r.group == "listed" for r in rows)
    cols = [c for c in _HTML_COLS if c[0] in ("backend", "candidate") or (not listing if c[0] == "status" else
                                                                          any(c[1](r) not in ("", "-", None)
                                                                              for r in rows))]
    td = "padding:2px 8px;text-align:{align};vertical-align:top;border:none;"
    out = ['<div class="rawconv-results" style="overflow-x:auto">',
           '<table style="border-collapse:collapse;font-size:0.9em;font-variant-numeric:tabular-nums;'
           'margin:0;width:auto">']
    banner = unreliable_banner(table.reliability())
    if table.title or banner:
        out.append(f'<caption style="text-align:left;font-weight:bold;padding:4px 0;caption-side:top">'
                   f'{escape(table.title)}'
                   + (f'<div style="background:{_WARN_BG};font-weight:normal;padding:2px 6px;margin-top:2px">'
                      f'&#9888; {escape(banner)}</div>' if banner else "") + '</caption>')
    out.append("<thead><tr>" + "".join(
        f'<th style="{td.format(align="right" if num else "left")}border-bottom:{_RULE};font-weight:bold;'
        'white-space:nowrap">'
        f'{escape(h)}</th>' for h, _, num in cols) + "</tr></thead><tbody>")
    seen = set()
    for name, rs in groups:
        if len(groups) > 1:
            out.append(f'<tr><th colspan="{len(cols)}" style="{td.format(align="left")}border-top:{_RULE};'
                       f'font-weight:bold;padding-top:6px">{escape(name)}</th></tr>')
        best = _best_of(rs)
        for r in rs:
            html, mark = _html_row(r, best, cols, td)
            seen.update({mark} if mark else set())
            out.append(html)
    out.append("</tbody></table>")
    legend = _html_legend(groups, rows)
    if legend:
        out.append('<div style="font-size:0.8em;margin-top:3px">' + " &nbsp; ".join(legend) + "</div>")
    out.append("</div>")
    return "\n".join(out)


def _html_row(r: Result, best: Result | None, cols: list, td: str) -> tuple[str, str]:
    """One result's ``<tr>`` of :func:`html_table`: ``r`` styled by its group (``best``: the
    fastest correct result of its problem), one cell per column of ``cols`` (``td``: the cell
    style, ``{align}`` to fill). Returns ``(html, mark)``: the row, and its mark ("fastest
    correct", "outside tolerance" or "")."""
    from html import escape

    style, mark, note = "", "", ""
    if r is best:
        style, mark = f"background:{_GREEN_BG};font-weight:bold;", "fastest correct"
    elif r.group == "wrong":
        style, mark = f"background:{_RED_BG};", "outside tolerance"
    elif r.group in ("not supported", "skipped"):
        style = "opacity:0.55;"
    elif r.group == "failed":   # did not run either, but an error: grey, its status red
        style = "opacity:0.75;"
    if r.reference:
        style += f"font-style:italic;background:{_REF_BG};" if r is not best and r.group != "wrong" \
            else "font-style:italic;"
        note = "torch's own choice" if r.torch_default else "torch"
    cells = []
    for h, get, num in cols:
        text = str(get(r)) if h == "timing" else escape(str(get(r)))
        cstyle = td.format(align="right" if num else "left")
        if h == "candidate":
            if r.reference:
                text = f'&#9670; {text} <span style="opacity:0.7;font-weight:normal">({escape(note)})</span>'
            elif r is best:
                text = f"&#9733; {text}"
        if h == "status" and r.group in ("wrong", "failed"):
            cstyle += f"color:{_RED_TEXT};font-weight:bold;"
        if h in ("timing", "median ms") and r.ran and r.timing_flags:
            cstyle += f"background:{_WARN_BG};"
        if h == "detail":
            cstyle += "max-width:42em;white-space:normal;"
        elif h == "library":
            cstyle += "min-width:7em;max-width:13em;white-space:normal;"
        else:
            cstyle += "white-space:nowrap;"
        cells.append(f'<td style="{cstyle}">{text}</td>')
    title = f' title="{escape(r.message, quote=True)}"' if r.message else ""
    return f'<tr style="{style}"{title}>' + "".join(cells) + "</tr>", mark


def _html_legend(groups: list, rows: list) -> list[str]:
    """The legend of :func:`html_table`: one ``<span>`` per kind of marking that ``rows`` (of the
    problems ``groups``) show. Returns the spans, empty when nothing is marked."""
    legend = []
    if any(_best_of(rs) is not None for _, rs in groups):
        legend.append(f'<span style="background:{_GREEN_BG};padding:0 4px">&#9733; fastest correct</span>')
    if any(r.group == "wrong" for r in rows):
        legend.append(f'<span style="background:{_RED_BG};padding:0 4px">outside tolerance vs float64</span>')
    if any(r.group in ("not supported", "skipped", "failed") for r in rows):
        legend.append('<span style="opacity:0.55;padding:0 4px">grey: did not run (status says why)</span>')
    if any(r.reference for r in rows):
        legend.append(f'<span style="background:{_REF_BG};font-style:italic;padding:0 4px">&#9670; torch, '
                      "for reference</span>")
    if any(r.ran and r.timing_flags for r in rows):
        legend.append(f'<span style="background:{_WARN_BG};padding:0 4px">&#9888; time not to be trusted '
                      "(waited for a CPU: no clean call in most of its rounds; rounds disagree: its per-round times spread; "
                      "busy: the machine was oversubscribed while it was timed; med/min: wide spread)</span>")
    return legend


# ---------------------------------------------------------------------------- plots
_C_BEST, _C_OK, _C_WRONG, _C_TORCH, _C_REF = "#2ca02c", "#4c78a8", "#d62728", "#9a9a9a", "#ff7f0e"


def _new_figure(figsize):
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=figsize)
    plt.close(fig)   # not pyplot's: a notebook shows it once, as the value returned
    _ipython_png()
    return fig


def _ipython_png() -> None:
    """In IPython, make sure a returned ``Figure`` displays as a PNG whatever matplotlib backend is
    active (the inline backend registers this formatter; Agg, set by ``MPLBACKEND``, does not)."""
    import sys

    if "IPython" not in sys.modules:
        return
    try:
        from IPython import get_ipython
        from matplotlib.figure import Figure

        ip = get_ipython()
        if ip is None:
            return
        fmt = ip.display_formatter.formatters["image/png"]
        try:
            fmt.lookup_by_type(Figure)
        except KeyError:
            from IPython.core.pylabtools import print_figure

            fmt.for_type(Figure, lambda fig: print_figure(fig, "png", bbox_inches="tight"))
    except Exception:  # noqa: BLE001 - display is a convenience; the figure is returned either way
        return


def _label(r: Result, backends: set) -> str:
    if r.backend == "torch":
        return f"torch: {r.name}"
    return f"{r.backend}: {r.name}" if len(backends) > 1 else r.name


def _plot_bars(table, groups, ax, reference_ms, log, title, figsize):
    if ax is not None and len(groups) > 1:
        raise ArgumentError(f"ax= draws one panel, and this table has {len(groups)} problems: pass ax=None "
                            "(one panel each) or kind='heatmap'")
    heights = [max(len(rs), 1) * 0.3 + 1.1 for _, rs in groups]
    if ax is None:
        fig = _new_figure(figsize or (10, sum(heights)))
        axes = fig.subplots(len(groups), 1, squeeze=False, gridspec_kw={"height_ratios": heights})[:, 0]
    else:
        fig, axes = ax.figure, [ax]
    for a, (name, rs) in zip(axes, groups):
        if len(groups) > 1 or not table.title:
            head = name
        else:   # one problem: the table's title, naming the problem when the title does not
            head = table.title if not name or name in table.title else f"{name} ({table.title})"
        _bars_panel(a, rs, head, reference_ms, log)
    banner = unreliable_banner(table.reliability())
    head = title or (table.title if len(groups) > 1 else "")   # one panel: its title names the table already
    if head or banner:
        fig.suptitle("\n".join(t for t in (head, _wrap_banner(banner)) if t), color="#b00000" if banner else None,
                     fontsize=9, x=0.01, ha="left")
    fig.tight_layout()
    return fig


def _wrap_banner(banner: str, width: int = 110) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(banner, width)) if banner else ""


def _bars_panel(ax, rows, title, reference_ms, log):
    backends = {r.backend for r in rows if r.backend != "torch"}
    ref = next((r for r in rows if r.torch_default and r.ran and finite(r.median_ms)), None)
    ref_ms = reference_ms if reference_ms is not None else (ref.median_ms if ref is not None else None)
    ran = sorted((r for r in rows if r.ran and finite(r.median_ms) and not (r is ref and reference_ms is None)),
                 key=lambda r: r.median_ms)
    not_run = [r for r in rows if not (r.ran and finite(r.median_ms))]
    best = _best_of(rows)
    times = [r.median_ms for r in ran] + ([ref_ms] if ref_ms else [])
    mins = [r.min_ms for r in ran if finite(r.min_ms) and r.min_ms > 0]
    lo, hi = (min(times + mins), max(times)) if times else (1.0, 1.0)
    use_log = log if log is not None else (lo > 0 and hi / lo > 10)
    _bars_draw(ax, ran, not_run, best)
    _bars_yaxis(ax, ran, not_run, backends)
    if use_log:
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

        ax.set_xscale("log")
        ax.set_xlim(lo / 1.6, hi * 4.0)
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
    elif times:
        ax.set_xlim(0, hi * 1.3)
    if ref_ms:
        ax.axvline(ref_ms, color=_C_REF, linestyle="--", linewidth=1.5)
        if ref is not None and reference_ms is None and ref.timing_flags:
            ax.annotate("torch default (!) " + _flag_word(ref), (ref_ms, -0.5),
                        xytext=(3, -2), textcoords="offset points", va="top", ha="left", fontsize=7,
                        color=_C_REF)
    ax.set_xlabel("median time per call (ms)" + (", log scale" if use_log else ""), fontsize=8.5)
    ax.tick_params(axis="x", labelsize=8)
    ax.set_title(title, fontsize=9.5, loc="left")
    ax.grid(axis="x", alpha=0.3, which="both" if use_log else "major")
    ax.set_axisbelow(True)
    _bars_legend(ax, ran, best, ref, ref_ms, reference_ms)


def _bars_draw(ax, ran: list, not_run: list, best) -> None:
    """Draw :func:`_bars_panel`'s bars on ``ax``: one per result of ``ran`` (sorted, fastest first;
    ``best`` in green, wrong ones hatched red) with its min mark and time, then a line per result
    of ``not_run`` saying why. Returns None."""
    from matplotlib.transforms import blended_transform_factory

    ys = list(range(len(ran) + len(not_run)))
    for y, r in zip(ys, ran):
        if r.group == "wrong":
            color, hatch = _C_WRONG, "///"
        elif r.backend == "torch":
            color, hatch = _C_TORCH, None
        else:
            color, hatch = (_C_BEST if r is best else _C_OK), None
        ax.barh(y, r.median_ms, color=color, hatch=hatch, edgecolor="white" if hatch else color, height=0.7,
                linewidth=0.5)
        if finite(r.min_ms):
            ax.plot([r.min_ms], [y], marker="|", color="black", markersize=11, markeredgewidth=1.6)
        tag = f"{fmt_ms(r.median_ms)} ms"
        if r.timing_flags:
            tag += "  (!) " + _flag_word(r)
        if r.group == "wrong":
            tag += f"  WRONG (rel err {r.max_rel:.1e})" if finite(r.max_rel) else "  WRONG"
        ax.annotate(tag, (r.median_ms, y), xytext=(5, 0), textcoords="offset points", va="center", ha="left",
                    fontsize=7.5, color=_C_WRONG if r.group == "wrong" else "#333333")
    trans = blended_transform_factory(ax.transAxes, ax.transData)
    for y, r in zip(ys[len(ran):], not_run):
        why = _short(r.message.replace("not run: ", "")) if r.message else ""
        ax.text(0.01, y, f"not run: {r.status}" + (f" ({why})" if why and why != r.status else ""),
                transform=trans, va="center", ha="left", fontsize=7.5, color="#777777", style="italic")


def _bars_yaxis(ax, ran: list, not_run: list, backends: set) -> None:
    """Label :func:`_bars_panel`'s rows on ``ax``'s y axis (``ran``, then ``not_run``; ``backends``:
    the rawconv backends shown, named when more than one), greyed when not run, red when wrong.
    Returns None."""
    n = len(ran) + len(not_run)
    ys = list(range(n))
    labels = [_label(r, backends) + (" (torch's own)" if r.torch_default else "") for r in ran] + \
             [_label(r, backends) for r in not_run]
    ax.set_yticks(ys)
    ax.set_yticklabels(labels, fontsize=8)
    for t, r in zip(ax.get_yticklabels(), ran + not_run):
        if not (r.ran and finite(r.median_ms)):
            t.set_color("#888888")
        elif r.group == "wrong":
            t.set_color(_C_WRONG)
    ax.set_ylim(n - 0.5, -0.5)


def _bars_legend(ax, ran: list, best, ref, ref_ms, reference_ms) -> None:
    """:func:`_bars_panel`'s legend on ``ax``: an entry per kind of bar and mark that ``ran``
    (``best``: the fastest correct; ``ref``: torch's default row, ``ref_ms`` its time or the given
    ``reference_ms``) shows. Returns None."""
    from matplotlib.patches import Patch
    from matplotlib.lines import Line2D

    handles = []
    if best is not None:
        handles.append(Patch(color=_C_BEST, label="fastest correct"))
    if any(r.group == "ok" and r is not best and r.backend != "torch" for r in ran):
        handles.append(Patch(color=_C_OK, label="correct"))
    if any(r.group == "wrong" for r in ran):
        handles.append(Patch(facecolor=_C_WRONG, hatch="///", edgecolor="white", label="outside tolerance"))
    if any(r.backend == "torch" for r in ran):
        handles.append(Patch(color=_C_TORCH, label="torch, other settings"))
    if any(finite(r.min_ms) for r in ran):
        handles.append(Line2D([], [], marker="|", color="black", linestyle="none", markersize=9, label="min"))
    if ref_ms:
        handles.append(Line2D([], [], color=_C_REF, linestyle="--",
                              label=f"torch default {fmt_ms(ref_ms)} ms" if reference_ms is None
                              else f"reference {fmt_ms(ref_ms)} ms"))
    if any(r.timing_flags for r in ran) or (ref is not None and ref.timing_flags):
        handles.append(Line2D([], [], linestyle="none", label="(!) waited: waited for a CPU (or the machine was\n"
                                                              "oversubscribed) while timed; (!) noisy: its rounds\n"
                                                              "disagree, or median/min wide"))
    if handles:
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0,
                  frameon=False)


def _flag_word(r: Result) -> str:
    """One word for why a row's time is not to be trusted: ``waited`` (it waited for a CPU, or the
    machine was oversubscribed while it was timed) or ``noisy`` (rounds disagree, median/min wide)."""
    waited = r.oversubscribed or any(f.startswith(("waited", "fresh rounds: waited")) for f in r.timing_flags)
    return "waited" if waited else "noisy"


def _short(text: str, n: int = 48) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 3] + "..."


def _ratio_text(v: float) -> str:
    """A heatmap cell's ratio in a few characters that never reads as zero: 2 decimals from 0.1 to
    10 (``0.95``, ``2.40``), whole numbers from 10, 2 significant digits below 0.1 (``0.031``,
    ``0.0031``, ``3.1e-05``)."""
    if v >= 10:
        return f"{v:.0f}"
    if v >= 0.1 or v == 0:
        return f"{v:.2f}"
    return f"{v:.2g}"


def _plot_heatmap(table, groups, ax, title, figsize):
    import numpy as np
    from matplotlib.colors import TwoSlopeNorm

    cols, ratio, state, noisy, best_cell, any_torch = _heatmap_cells(groups)
    if ax is None:
        fig = _new_figure(figsize or (max(7.0, 0.62 * len(cols) + 3.2), max(3.2, 0.42 * len(groups) + 2.9)))
        ax = fig.subplots()
    else:
        fig = ax.figure
    lr = np.log2(ratio)
    finite = lr[np.isfinite(lr)]
    m = max(1.0, float(np.nanmax(np.abs(finite)))) if finite.size else 1.0
    import matplotlib

    cmap = matplotlib.colormaps["RdYlGn_r"].with_extremes(bad=(0.0, 0.0, 0.0, 0.0))
    im = ax.imshow(np.ma.masked_invalid(lr), cmap=cmap, norm=TwoSlopeNorm(0.0, -m, m), aspect="auto",
                   interpolation="nearest")
    _heatmap_marks(ax, ratio, state, noisy, lr, m, best_cell)
    ax.set_xticks(range(len(cols)))
    ax.set_xticklabels(cols, rotation=55, ha="right", rotation_mode="anchor", fontsize=8)
    ax.set_yticks(range(len(groups)))
    ax.set_yticklabels([g for g, _ in groups], fontsize=8)
    ax.set_xticks(np.arange(-0.5, len(cols), 1), minor=True)
    ax.set_yticks(np.arange(-0.5, len(groups), 1), minor=True)
    ax.grid(which="minor", color="white", linewidth=0.6)
    ax.tick_params(which="minor", length=0)
    what = "torch default" if any_torch else "the fastest correct candidate"
    cb = fig.colorbar(im, ax=ax, fraction=0.035, pad=0.02)
    ticks = [t for t in range(-int(np.ceil(m)), int(np.ceil(m)) + 1) if -m <= t <= m]
    cb.set_ticks(ticks)
    cb.set_ticklabels([f"{2.0 ** t:g}x" for t in ticks])
    cb.set_label("time / torch default" if any_torch else "time / fastest", fontsize=8)
    cb.ax.tick_params(labelsize=7)
    banner = unreliable_banner(table.reliability())
    marks = "; !/dashed red: time not to be trusted" if noisy.any() else ""
    ax.set_title(title or (table.title + "\n" if table.title else "") +
                 f"median time relative to {what} (green: faster, red: slower); boxed: fastest correct; "
                 f"n/r: did not run; blank: not offered{marks}", fontsize=8.5, loc="left")
    if banner:
        fig.suptitle(_wrap_banner(banner, 120), color="#b00000", fontsize=9, x=0.01, ha="left")
    fig.tight_layout()
    return fig


def _heatmap_key(r: Result) -> str:
    """A heatmap column's name for the result ``r``: its choice (``(prepacked)`` added for prepacked
    weights), or ``torch: NAME``. Returns the name."""
    if r.backend == "torch":
        return f"torch: {r.name}"
    return r.choice + (" (prepacked)" if isinstance(r.extra, dict) and r.extra.get("weights") == "prepacked" else "")


def _heatmap_cells(groups: list) -> tuple:
    """:func:`_plot_heatmap`'s cells: a row per problem of ``groups``, a column per candidate (torch's
    default rows are the baseline, not columns). Returns ``(cols, ratio, state, noisy, best_cell,
    any_torch)``: the column names; per cell the median time over the baseline's (torch default,
    else the fastest correct; NaN when none), the state (0 absent, 1 ok, 2 wrong, 3 did not run)
    and whether its time is not to be trusted; {row: column} of each problem's fastest correct;
    whether any problem had a torch default."""
    import numpy as np

    cols: list[str] = []
    for _, rs in groups:
        for r in rs:
            k = _heatmap_key(r)
            if not r.torch_default and k not in cols:
                cols.append(k)
    ratio = np.full((len(groups), len(cols)), np.nan)
    state = np.zeros((len(groups), len(cols)), dtype=int)   # 0 absent, 1 ok, 2 wrong, 3 did not run
    noisy = np.zeros((len(groups), len(cols)), dtype=bool)  # its time (or torch default's) not to be trusted
    best_cell = {}
    any_torch = False
    for i, (_, rs) in enumerate(groups):
        ref = next((r for r in rs if r.torch_default and r.ok and finite(r.median_ms)), None)
        any_torch |= ref is not None
        best = _best_of(rs)
        base = ref.median_ms if ref is not None else (best.median_ms if best is not None else None)
        for r in rs:
            if r.torch_default:
                continue
            j = cols.index(_heatmap_key(r))
            if r.ran and finite(r.median_ms):
                state[i, j] = 2 if r.group == "wrong" else 1
                noisy[i, j] = bool(r.timing_flags) or bool(ref is not None and ref.timing_flags)
                if base:
                    ratio[i, j] = r.median_ms / base
            else:
                state[i, j] = state[i, j] or 3
            if r is best:
                best_cell[i] = j
    return cols, ratio, state, noisy, best_cell, any_torch


def _heatmap_marks(ax, ratio, state, noisy, lr, m: float, best_cell: dict) -> None:
    """Mark :func:`_plot_heatmap`'s cells on ``ax``: did-not-run and wrong cells patched and
    labelled, ok cells given their ratio (``ratio``; ``lr`` its log2, ``m`` the colour scale's
    bound) when the map is small enough, untrusted times (``noisy``) outlined dashed, each
    problem's fastest correct (``best_cell``) boxed. ``state`` as :func:`_heatmap_cells`. Returns
    None."""
    import numpy as np
    from matplotlib.patches import Rectangle

    n_rows, n_cols = state.shape
    for i in range(n_rows):
        for j in range(n_cols):
            s = state[i, j]
            if s == 3:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor="#d0d0d0", edgecolor="white", lw=0.5))
                ax.text(j, i, "n/r", ha="center", va="center", fontsize=7, color="#555555")
            elif s == 2:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor="#f6c4c4", edgecolor="white", lw=0.5,
                                       hatch="////"))
                ax.text(j, i, "wrong", ha="center", va="center", fontsize=7, color="#a00000", weight="bold",
                        bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5, "alpha": 0.8})
            elif s == 1 and np.isfinite(ratio[i, j]) and n_rows * n_cols <= 900:
                v = ratio[i, j]
                ax.text(j, i, _ratio_text(v) + ("!" if noisy[i, j] else ""), ha="center", va="center",
                        fontsize=7.5, color="white" if abs(lr[i, j]) > 0.6 * m else "black",
                        style="italic" if noisy[i, j] else "normal")
            if s in (1, 2) and noisy[i, j]:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="#b00000", lw=0.9,
                                       linestyle=(0, (2, 1.5))))
    for i, j in best_cell.items():
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="black", lw=1.6))
