"""The ``rawconv`` command line's tables that fit a terminal: :class:`Column` s fitted to a width
(:func:`fit_columns`: narrow tables wrap names and leave out columns rather than split a number),
drawn with rich (:func:`render_table`), compare's rows as such a table (:func:`print_rows`), and the
console they print on (a terminal's width, or unwrapped lines through a pipe)."""
from __future__ import annotations

import functools
import math
import sys

from ..core.results import fmt_bytes, fmt_ms


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
