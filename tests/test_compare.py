"""rawconv.compare's statuses, summary and exit codes, and the CLI's tables at fixed widths.

Rows here are built by hand (no convolution runs) except in the ``main`` tests, which run
``rawconv.cli.main`` in-process on a tiny problem with one oneDNN call patched to fail, raise or
return a wrong answer.
"""
from __future__ import annotations

import io
import json
import math
import re

import pytest
import torch

from rawconv import cli, compare
from rawconv.bench import SPREAD_LIMIT
from rawconv.compare import Row, exit_code, status_category, summary
from rawconv import ConvProblem
from rawconv.errors import ArgumentError, LibraryError, LibraryNotFoundError, NotSupportedError

TINY = ["mb1ic4ih6oc4oh6kh3ph1", "--iterations", "1", "--warmup", "0", "--budget", "0.05", "--threads", "1"]


def _ran(problem, backend, impl, median, mn, *, ok=True, runs=5, rel=1e-7, ws=0, detail="any; src abcd"):
    return Row(problem, backend, impl, detail, median_ms=median, min_ms=mn, runs=runs, gflops=12.3456,
               max_abs=rel * 3, max_rel=rel, ok=ok, workspace_bytes=ws, status="ok" if ok else "wrong")


def _table_rows():
    p = "p1"
    return [
        _ran(p, "torch", "default", 23.9730, 23.9467, detail="Mkldnn; torch's oneDNN ran jit:avx512_core + 2 reorder(s)"),
        _ran(p, "torch", "mkldnn disabled", 0.0320123, 0.0308),
        _ran(p, "onednn", "[0] brgconv_1x1:avx512_core_amx", 12345.678, 0.0001234, ws=1806464),
        _ran(p, "onednn", "[1] jit:avx512_core", 1.5, 1.25, ok=False, rel=3.2e-2, ws=12288),
        Row(p, "onednn", "[6] ref:any", "any; not run: estimated 12.2 s per call (--ref runs it)",
            error="not run: estimated 12.2 s per call (--ref runs it)", status="skipped"),
        Row(p, "onednn", "[7] ref:any", error="NotSupportedError: dnnl_unimplemented (3): oneDNN offers no "
            "implementation for 2d bfloat16 nchw x(2,8,12,12) w(8,8,3,3) p1,1 (forward, layouts user)",
            status="not supported"),
        Row(p, "cudnn", "IMPLICIT_PRECOMP_GEMM math=tensor_op_allow_conversion", error="LibraryError: boom",
            status="failed"),
        Row(p, "onednn", "[9] jit_1x1:avx2", status="crashed: SIGSEGV", error="child died"),
    ]


def _cpu_rows():
    """What a oneDNN comparison on an AVX-512 CPU prints (typical names, widths and numbers)."""
    p = "layer1.0.conv2"
    return [
        _ran(p, "torch", "default", 1.9734, 1.9467, detail="Mkldnn; torch's oneDNN ran brg_conv_fwd:avx512_core "
             "(src abcd, weights Acdb16a) + 2 reorder(s)"),
        _ran(p, "torch", "mkldnn disabled", 13.2001, 11.9461, detail="Slow2d"),
        _ran(p, "onednn", "[0] brgconv:avx512_core_amx", 1.4551, 1.4110, ws=12288,
             detail="any; src acdb weights Acdb16a dst acdb; reorders src,weights(once),dst"),
        _ran(p, "onednn", "[3] jit_1x1:avx512_core_bf16", 0.8811, 0.8789, ws=1806464),
        _ran(p, "onednn", "[5] x64:gemm:jit", 24.0180, 7.9601, ws=83072),
        Row(p, "onednn", "[6] ref:any", "any; not run: estimated 2.7 s per call (--ref runs it)",
            error="not run: estimated 2.7 s per call (--ref runs it)", status="skipped"),
    ]


# --------------------------------------------------------------------------- statuses and summary
def test_status_categories_are_a_small_documented_set():
    from rawconv.results import STATUSES as VOCABULARY

    assert compare.STATUSES == ("ok", "wrong", "failed", "not supported", "skipped")
    assert [status_category(s) for s in compare.STATUSES] == list(compare.STATUSES)
    assert all(VOCABULARY[s] == s for s in compare.STATUSES)     # rawconv's one status vocabulary
    assert status_category("crashed: SIGSEGV") == "failed"
    assert status_category("timed out after 30 s") == "failed"
    assert status_category("known bad") == "skipped"
    assert status_category("something new") == "failed"
    # a Row without an explicit status gets one from what it holds
    assert Row("p", "b", "i", error="x").status == "failed"
    assert Row("p", "b", "i", ok=True).status == "ok" and Row("p", "b", "i", ok=False).status == "wrong"


def test_summary_leaves_out_failed_unsupported_skipped_and_wrong_rows_and_never_nan():
    rows = _table_rows()
    s = summary(rows)
    # p1: torch default 23.973 ms; fastest ok rawconv row is [0] (12345 ms; [1] is wrong)
    assert s["per_problem"][0]["best"] == "[0] brgconv_1x1:avx512_core_amx"
    assert math.isclose(s["geomean_torch_over_best"], 23.9730 / 12345.678)
    assert len(s["failed"]) == 2 and "crashed: SIGSEGV" in s["failed"][1]
    assert len(s["not_supported"]) == 1 and len(s["skipped"]) == 1 and len(s["outside_tolerance"]) == 1
    assert exit_code(s) == 1
    # nothing comparable: the geometric mean is None, not nan, and the JSON holds null
    only = [rows[0], rows[4], rows[5]]
    s = summary(only)
    assert s["geomean_torch_over_best"] is None and s["comparable_problems"] == 0
    assert s["no_rawconv_result"] == ["p1"] and exit_code(s) == 3
    assert "NaN" not in json.dumps(compare._finite_json(s), allow_nan=False)


def test_exit_codes_in_order_of_severity():
    ok = [_ran("p", "torch", "default", 2.0, 1.9), _ran("p", "onednn", "[0] a", 1.0, 0.9)]
    assert exit_code(summary(ok)) == 0
    failed = ok + [Row("p", "onednn", "[1] b", error="LibraryError: x", status="failed")]
    assert exit_code(summary(failed)) == 4
    torch_failed = ok + [Row("p", "torch", "mkldnn disabled", error="RuntimeError: x", status="failed")]
    assert exit_code(summary(torch_failed)) == 0 and summary(torch_failed)["failed"]   # listed, not counted
    notsup = ok + [Row("p", "onednn", "[1] b", error="NotSupportedError: x", status="not supported")]
    assert exit_code(summary(notsup)) == 0
    missing = [ok[0], Row("p", "onednn", "-", error="LibraryNotFoundError: x", status="failed",
                          extra={"library_not_loaded": True})]
    assert summary(missing)["libraries_not_loaded"] and exit_code(summary(missing)) == 3
    wrong = missing + [_ran("q", "onednn", "[0] a", 1.0, 0.9, ok=False)]
    assert exit_code(summary(wrong)) == 1
    assert set(compare.EXIT_CODES) == {0, 1, 2, 3, 4}


def test_spread_and_machine_marks_reach_the_summary():
    calm = {"seconds": 1.0, "cpus": 2, "threads": 2, "other_cpus": 0.0, "waited": 0.0, "loadavg": 0.1,
            "oversubscribed": False}
    rows = [_ran("p", "torch", "default", 2.0, 1.9), _ran("p", "onednn", "[0] a", 1.0, 0.95)]
    for r in rows:
        r.extra["machine"] = dict(calm)
    s = summary(rows)
    assert s["timings_trustworthy"] and not s["timing_warnings"] and s["machine"]["other_cpus"] == 0.0
    noisy = _ran("p", "onednn", "[1] b", 8.0, 1.0)
    noisy.extra["machine"] = dict(calm)
    assert noisy.unstable and noisy.spread == 8.0 > SPREAD_LIMIT
    s = summary(rows + [noisy])
    assert not s["timings_trustworthy"] and "1 of 3" in s["timing_warnings"][0]
    busy = dict(calm, other_cpus=1.0, waited=0.8, oversubscribed=True)
    for r in rows:
        r.extra["machine"] = dict(busy)
    s = summary(rows)
    assert not s["timings_trustworthy"] and "oversubscribed" in s["timing_warnings"][0]
    assert s["machine"]["oversubscribed"]
    d = rows[0].as_dict()
    assert d["status"] == "ok" and d["spread"] == pytest.approx(2.0 / 1.9) and d["category"] == "ok"


# --------------------------------------------------------------------------- tables at fixed widths
def _render(rows, width):
    from rich.console import Console

    buf = io.StringIO()
    console = Console(width=width, file=buf, highlight=False, color_system=None)
    cli.print_rows(console, "p1: a test problem", rows)
    return buf.getvalue()


NUM = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$")


@pytest.mark.parametrize("width", [60, 80, 120, 200])
@pytest.mark.parametrize("make", [_cpu_rows, _table_rows])
def test_tables_fit_and_never_split_a_number(width, make):
    rows = make()
    text = _render(rows, width)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width, text
    shown = cli.fit_columns(cli._compare_columns(rows), width)
    headers = [c.name for c, _ in shown]
    notes = [i for i, ln in enumerate(lines) if re.match(r"  \S", ln)]
    table = lines[: notes[0]] if notes else lines
    # every number of every shown number column appears whole on its row's first line
    for r in rows:
        line = next(ln for ln in table if ln.startswith(r.backend) and r.implementation.split()[0][:6] in ln)
        tokens = line.split()
        for h, fmt, v in (("median ms", cli.fmt_ms, r.median_ms), ("min ms", cli.fmt_ms, r.min_ms),
                          ("med/min", cli._fmt_spread, r.spread), ("max rel err", cli._fmt_err, r.max_rel),
                          ("max abs err", cli._fmt_err, r.max_abs), ("GFLOP/s", cli._fmt_gflops, r.gflops)):
            if h in headers and fmt(v) != "-":
                assert fmt(v) in tokens, (h, fmt(v), line)
    # every numeric-looking token in the table parses as a float (a split "23.97" + "30" is caught above)
    for ln in table:
        for tok in ln.split():
            if NUM.match(tok):
                float(tok)
    assert {"backend", "implementation", "status", "median ms", "min ms"} <= set(headers)
    if "detail" not in headers:
        # the reasons rows did not run are still printed, as notes under the table
        assert "not run: estimated" in text
        assert make is _cpu_rows or "dnnl_unimplemented" in text
    if make is _table_rows:
        return
    if width >= 80:
        assert {"med/min", "max rel err"} <= set(headers)
    if width >= 120:
        # names do not wrap: each implementation name is whole on its row's line
        for r in rows:
            assert any(ln.startswith(r.backend) and r.implementation in ln for ln in table), r.implementation
        assert {"max abs err", "scratch", "GFLOP/s"} <= set(headers)
    if width >= 200:
        assert "detail" in headers


def test_fit_columns_drops_in_priority_order():
    cols = cli._compare_columns(_cpu_rows())
    order = []
    for width in range(260, 40, -1):
        kept = {c.name for c, _ in cli.fit_columns(cols, width)}
        order += [c.name for c in cols if c.name not in kept and c.name not in order]
    assert order == ["detail", "GFLOP/s", "scratch", "max abs err", "max rel err", "med/min"]


# --------------------------------------------------------------------------- the command, in-process
@pytest.fixture
def no_info(monkeypatch):
    """``rawconv info``'s data stubbed: the tests below patch oneDNN calls, and info's per-process
    capabilities cache must not keep what a patched call gave."""
    from rawconv.explore import info as _info

    monkeypatch.setattr(_info, "collect", lambda: {"onednn": {"version": "(stub)", "cpu_isa": "(stub)"}})


def _main(capsys, *args):
    code = cli.main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_main_exit_3_when_onednn_does_not_load(no_info, capsys, monkeypatch, tmp_path):
    from rawconv import onednn

    def missing(*a, **k):
        raise LibraryNotFoundError("libdnnl.so.3", [("$RAWCONV_DNNL_LIBRARY", "/nowhere/libdnnl.so.3: not found")])

    monkeypatch.setattr(onednn, "Convolution", missing)
    out = tmp_path / "r.json"
    code, text, _ = _main(capsys, "compare", *TINY, "--width", "100", "--json", str(out))
    assert code == 3, text
    assert "library not loaded" in text and "/nowhere/libdnnl.so.3" in text
    data = json.loads(out.read_text())
    assert data["summary"]["exit_code"] == 3 and data["summary"]["geomean_torch_over_best"] is None
    assert "no comparable rows" in text and "nan" not in text.lower().replace("nanosec", "")


def test_main_exit_3_when_nothing_is_supported_and_4_when_one_fails(no_info, capsys, monkeypatch):
    from rawconv import onednn

    real_select = onednn.Convolution.select

    def unsupported(self, choice, **kw):
        raise NotSupportedError("oneDNN offers nothing like it here")

    # --no-ref: onednn.reference_seconds measures ref:any through select() and caches the rate
    monkeypatch.setattr(onednn.Convolution, "select", unsupported)
    code, text, _ = _main(capsys, "compare", *TINY, "--no-ref", "--width", "80")
    assert code == 3 and "not supported" in text and "no rawconv candidate ran on" in text

    def one_fails(self, choice, **kw):
        if choice == 0:
            raise LibraryError("oneDNN", "dnnl_primitive_create", 5, "dnnl_runtime_error", "injected")
        return real_select(self, choice, **kw)

    monkeypatch.setattr(onednn.Convolution, "select", one_fails)
    code, text, _ = _main(capsys, "compare", *TINY, "--no-ref", "--width", "80")
    assert code == 4, text
    assert "failed: " in text and "injected" in text


def test_main_exit_1_on_a_wrong_answer(no_info, capsys, monkeypatch):
    from rawconv import onednn

    real = onednn.Convolution.execute

    def wrong(self, *a, **k):
        y = real(self, *a, **k)
        return y + 1.0 if isinstance(y, torch.Tensor) else y

    monkeypatch.setattr(onednn.Convolution, "execute", wrong)
    code, text, _ = _main(capsys, "compare", *TINY, "--no-ref", "--width", "120")
    assert code == 1 and "outside tolerance:" in text and "wrong" in text


def test_main_ref_rows_are_skipped_by_their_estimate(no_info, capsys, monkeypatch, tmp_path):
    from rawconv import onednn

    monkeypatch.setattr(onednn, "reference_seconds", lambda p, d="forward", layouts=None: 42.0)
    out = tmp_path / "r.json"
    code, text, _ = _main(capsys, "compare", *TINY, "--width", "200", "--json", str(out))
    assert code == 0, text
    rows = json.loads(out.read_text())["rows"]
    refs = [r for r in rows if "ref:any" in r["implementation"]]
    assert refs and all(r["status"] == "skipped" and r["extra"]["estimated_s"] == 42.0 for r in refs)
    assert "not run: estimated 42.0 s per call (--ref runs it)" in text
    code, text, _ = _main(capsys, "compare", *TINY, "--width", "200", "--ref-limit", "100", "--json", str(out))
    refs = [r for r in json.loads(out.read_text())["rows"] if "ref:any" in r["implementation"]]
    assert code == 0 and refs and all(r["status"] == "ok" for r in refs)


def test_each_ref_row_is_skipped_by_its_own_layouts_estimate(no_info, capsys, monkeypatch, tmp_path):
    # the two ref:any rows (oneDNN's layouts and the tensors') differ about tenfold on NCHW: each is
    # estimated for its own layouts (both got the slower one's estimate, so the fast one was skipped too)
    from rawconv import onednn

    seen = []

    def estimate(p, d="forward", layouts=None):
        seen.append(layouts)
        return {"any": 0.01, "user": 42.0}[layouts]

    monkeypatch.setattr(onednn, "reference_seconds", estimate)
    out = tmp_path / "r.json"
    code, text, _ = _main(capsys, "compare", *TINY, "--width", "200", "--json", str(out))
    assert code == 0, text
    refs = {r["extra"]["choice"]: r for r in json.loads(out.read_text())["rows"] if "ref:any" in r["implementation"]}
    assert refs["ref:any@any"]["status"] == "ok"
    assert refs["ref:any@user"]["status"] == "skipped" and refs["ref:any@user"]["extra"]["estimated_s"] == 42.0
    assert set(seen) == {"any", "user"}   # (the plan asks again for the row it runs: its slow-call warning)


def test_reference_seconds_per_layouts():
    from rawconv import onednn

    p = ConvProblem(n=1, c=8, k=8, in_spatial=(12, 12), kernel=(3, 3), pad_before=(1, 1), pad_after=(1, 1))
    est = {lay: onednn.reference_seconds(p, "forward", lay) for lay in ("any", "user")}
    assert all(0 < v < 60 for v in est.values()), est
    assert onednn.reference_seconds(p) == max(est.values())
    with pytest.raises(ArgumentError, match="layouts"):
        onednn.reference_seconds(p, "forward", "blocked")


def test_a_busy_stretch_is_not_averaged_away():
    calm = {"seconds": 1.0, "cpus": 2, "threads": 2, "other_cpus": 0.0, "waited": 0.0, "loadavg": 0.1,
            "oversubscribed": False}
    busy = dict(calm, other_cpus=1.5, waited=0.3, oversubscribed=True)
    rows = []
    for i, m in enumerate([calm] * 10 + [busy] * 2):
        r = _ran("p", "onednn", f"[{i}] x", 1.0, 0.99)
        r.extra["machine"] = dict(m)
        rows.append(r)
    rep = compare.machine_report(rows)
    assert rep.oversubscribed and rep.seconds == 2.0 and rep.other_cpus == 1.5
    rep = compare.machine_report(rows[:11])            # 1 s of 11 busy: below a tenth, the average stands
    assert not rep.oversubscribed and rep.seconds == 11.0


def test_compare_says_when_small_problems_run_on_one_thread(no_info, capsys):
    args = [a if a != "1" or i != len(TINY) - 1 else "2" for i, a in enumerate(TINY)]   # --threads 2
    code, text, _ = _main(capsys, "compare", *args, "--no-ref", "--width", "120")
    assert code == 0, text
    assert "1 problem(s) of fewer than 2**17 FLOPs" in text and "one thread" in text
    code, text, _ = _main(capsys, "compare", *TINY, "--no-ref", "--width", "120")   # --threads 1: nothing to say
    assert "2**17 FLOPs" not in text


def test_a_flagged_row_says_so_in_plain_text():
    """A row whose own rounds waited for a CPU or disagree says it in its status cell: the yellow
    median a terminal shows is lost in a pipe or a log (a new user read 'median 31 ms, x torch 0.89'
    with nothing on the row)."""
    from rawconv.results import Result

    p = ConvProblem(n=1, c=4, k=4, in_spatial=(6, 6), kernel=(3, 3), name="tiny")
    waited = {"flags": ["waited for a CPU: no clean call in 8 of 9 rounds (per call wall 31 ms, CPU 0.4 ms)"]}
    spread = {"flags": ["rounds disagree: per-round times 0.3-0.9 ms around 0.5 ms"]}
    rows = [Result("torch", "default", p, status="ok", median_ms=0.5, min_ms=0.4, runs=9, extra={"rounds": {"flags": []}}),
            Result("onednn", "jit:avx2@any", p, status="ok", median_ms=31.0, min_ms=0.36, runs=9,
                   extra={"rounds": waited}),
            Result("onednn", "jit:sse41@any", p, status="ok", median_ms=0.6, min_ms=0.3, runs=9,
                   extra={"rounds": spread, "confirmed": {"flags": waited["flags"]}})]
    text = _render(rows, 200)
    line = {r.implementation: next(ln for ln in text.splitlines() if r.implementation in ln) for r in rows}
    assert "(waited)" in line["jit:avx2@any"] and "(spread" not in line["jit:avx2@any"]
    assert "(spread, waited)" in line["jit:sse41@any"]
    assert "(" not in line["default"].split("ok", 1)[1].split()[0]   # a clean row: plain "ok"


def test_a_wrong_shape_row_says_shape_mismatch_in_the_table_and_summary():
    # breaker D9: torch's rows of zero input channels (result (1, 0, 6, 6)) were "wrong" with "-" for both
    # errors and no reason shown; the reason now reaches the table's notes and the summary
    p = ConvProblem.from_benchdnn("mb1ic0ih8oc4kh3")
    rows = compare.compare_problem(p, iterations=1, warmup=0, include_ref=False)
    bad = [r for r in rows if r.status == "wrong"]
    if not bad:
        pytest.skip("this torch returns the reference's shape for zero input channels")
    for r in bad:
        assert r.backend == "torch" and r.error.startswith("shape mismatch: result (1, 0, 6, 6), reference (1, 4, 6, 6)")
        assert "shape mismatch" in r.detail
    s = summary(rows)
    assert s["outside_tolerance"] and all("shape mismatch" in line for line in s["outside_tolerance"])
