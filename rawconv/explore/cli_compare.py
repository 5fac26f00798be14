"""``rawconv compare`` and ``rawconv replay``: each command's run (:func:`cmd_compare`,
:func:`cmd_replay`), its header (libraries, threads, the machine's load), its summary lines, its
outputs (JSON, CSV, plot, tuning records) and its exit status."""
from __future__ import annotations

from ..core import __version__
from ..core.errors import RawconvError
from ..core.results import fmt_ms
from .cli_args import _problems
from .cli_tables import (_STATUS_STYLE, Column, _console, _finite, _fmt_err, _warn, print_rows,
                         render_table)


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
                               isolate={"timeout_s": args.timeout} if args.isolate else None,
                               fit_threads=args.threads is None)
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
    from .measure import _round_plan
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
    rounds, calls = _round_plan(args.iterations)
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
        fitting = args.threads is None and nthreads > 1
        meta["machine_before"] = _warn_if_busy(
            console, nthreads, f"each problem is timed at the thread count that fits; a quiet machine for "
                               f"{nthreads}-thread figures" if fitting else hint)
        if fitting:
            console.print(f"a problem is timed at fewer than {nthreads} threads, torch's call and rawconv's alike, "
                          "where other processes leave fewer CPUs free (judged before it; the summary says which "
                          "and why); --threads N times at N regardless", style="dim")
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
