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
import json
import sys

from ..core import __version__
from ..core.errors import RawconvError
from ..core.results import fmt_bytes, fmt_ms  # noqa: F401  (rawconv.cli.fmt_ms)
# the parts (this module is their face: ``rawconv.cli.X`` names each of them)
from .cli_args import (_devices, _direction, _ints, _nonneg_int, _positive_float, _positive_int,  # noqa: F401
                       _problems, _problems_on, _shape, _thread_count, _width)
from .cli_tables import (GAP, KEEP_RANK, MIN_WIDTH, UNWRAPPED_WIDTH, WRAP_MIN, Column, _break_long,  # noqa: F401
                         _compare_columns, _console, _fmt_err, _fmt_gflops, _fmt_spread, fit_columns, print_rows,
                         render_table)
from .cli_compare import cmd_compare, cmd_replay


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
                   help="torch/oneDNN threads for every problem (default: the CPUs this process may use, from its "
                        "affinity mask and cgroup quota, capped by torch's thread count, which OMP_NUM_THREADS sets; "
                        "more would oversubscribe the machine; and a problem is timed at fewer, torch's call and "
                        "rawconv's alike, where other processes leave fewer CPUs free; at most 8 per CPU, at least 64)")
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
