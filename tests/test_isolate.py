"""Crash isolation (rawconv.core.isolate): a crash or hang in the child is a row status; this process lives on.

Starting a worker costs a few seconds (the child imports torch), so the tests share workers:
``_isolate`` keeps one idle worker per (environment, threads), and every test here uses the same
environment and thread count (``ISO``).
"""
from __future__ import annotations

import os
import time

import pytest
import torch

from rawconv import ConvProblem, onednn
from rawconv.core import isolate as _isolate
from rawconv.onednn import isolated  # the oneDNN child and session (rawconv.core.isolate before issue 23)
from rawconv.errors import ArgumentError, ArgumentTypeError, NotSupportedError


# one environment and thread count for every test (one pool key: workers are reused); the #6035
# case is emulated on an AVX2 CPU, where it is deterministic with one thread
ISO = {"env": {"ONEDNN_MAX_CPU_ISA": "AVX2"}, "threads": 1, "timeout_s": 30}


# module-level functions the worker runs (the child imports this module by name)
def _add(a, b):
    return a + b, os.getpid(), os.environ.get("RAWCONV_ISOLATED_CHILD"), torch.get_num_threads()


def _abort():
    os.abort()


def _sleep(seconds):
    time.sleep(seconds)
    return "woke up"


def _not_supported():
    raise NotSupportedError("nothing here", library="test")


def test_injected_crash_and_hang_become_statuses():
    ok = _isolate.run(_add, 2, 3, isolate=ISO)
    assert ok.status == "ok" and ok.value[0] == 5
    assert ok.value[1] != os.getpid() and ok.value[2] == "1" and ok.value[3] == 1
    err = _isolate.run(_not_supported, isolate=ISO)
    assert err.status == "error" and err.error["not_supported"] and "nothing here" in err.detail
    again = _isolate.run(f"{__name__}:_add", 1, 1, isolate=ISO)
    assert again.ok and again.value[1] == ok.value[1]          # the same worker, reused
    crash = _isolate.run(_abort, isolate=ISO)
    print("injected os.abort():", crash.status)
    assert crash.status == "crashed: SIGABRT" and crash.died
    t0 = time.perf_counter()
    hang = _isolate.run(_sleep, 60, isolate=dict(ISO, timeout_s=2))
    print("injected sleep past the timeout:", hang.status)
    assert hang.status == "timed out after 2 s" and hang.died
    assert time.perf_counter() - t0 < 50     # killed at the timeout (plus a worker start), not after 60 s
    assert os.getpid() and torch.ones(2).sum() == 2   # and this process goes on


def test_arguments_are_checked_before_starting_anything():
    with pytest.raises(ArgumentError, match="timeout_s"):
        _isolate.options({"timeout_s": 0})
    with pytest.raises(ArgumentError, match="takes"):
        _isolate.options({"timeout": 5})
    with pytest.raises(ArgumentTypeError):
        _isolate.options("yes")
    with pytest.raises(ArgumentTypeError, match="env"):
        _isolate.Isolation(env={"A": 1})
    with pytest.raises(ArgumentTypeError, match="module-level"):
        _isolate.run(lambda: 1)
    with pytest.raises(ArgumentError, match="module:function"):
        _isolate.run("nocolon")
    x = torch.randn(1, 2, 5, 5)
    with pytest.raises(ArgumentTypeError, match="isolate"):
        onednn.implementations(x, torch.randn(2, 2, 3, 3), isolate=3)
    assert _isolate.options(False) is None and _isolate.options(True) == _isolate.Isolation()


# ------------------------------------------------------------------ oneDNN issue #6035 in a child
def _report_case():
    x = torch.randn(32, 4, 32, 32).to(memory_format=torch.channels_last)
    return x, torch.randn(8, 4, 1, 1)


def _needs_avx2():
    flags = open("/proc/cpuinfo").read()
    if " avx2" not in flags:
        pytest.skip("the CPU has no AVX2: oneDNN offers no jit_1x1:avx2 to reproduce oneDNN #6035 with")


def test_6035_through_isolation_is_a_status_and_the_parent_lives():
    _needs_avx2()
    x, w = _report_case()
    rows = onednn.implementations(x, w, stride=2, direction="backward_weights", isolate=ISO,
                                  allow_known_bad=True)
    for r in rows:
        print(r)
    bad = [r for r in rows if r.known_bad]
    if not any(r.name == "jit_1x1:avx2" for r in bad):
        pytest.skip("oneDNN under ONEDNN_MAX_CPU_ISA=AVX2 lists no jit_1x1:avx2 with a channels_last source here: "
                    + ", ".join(f"{r.name}@{r.layouts}" for r in rows))
    for r in bad:   # 1 thread: the write past the scratchpad lands in the child's guard band, counted
        assert r.status == "wrong" and "B past its" in r.detail, r
    # every other implementation ran (in a fresh worker after the crash) and is right vs float64
    assert all(r.status == "ok" for r in rows if not r.known_bad), [str(r) for r in rows]
    assert {r.name for r in rows} >= {"jit_1x1:avx2", "ref:any"}
    # without the override the known-bad rows are not run
    rows2 = onednn.implementations(x, w, stride=2, direction="backward_weights", isolate=ISO)
    assert [r.status for r in rows2 if r.known_bad] == ["known bad"] * len(bad)
    assert all(r.status == "ok" for r in rows2 if not r.known_bad)


def test_6035_autotune_isolated_reports_the_crash_and_never_selects_it():
    _needs_avx2()
    p = ConvProblem.from_benchdnn("mb32ic4ih32oc8oh16kh1sh2", layout="nhwc")
    plan = onednn.Convolution.from_problem(p, direction="backward_weights")
    rows = plan.autotune(iterations=2, warmup=1, isolate=ISO, allow_known_bad=True)
    for r in rows:
        print(r)
    child_bad = [r for r in rows if r.impl.name == "jit_1x1:avx2" and r.impl.layouts == "user"]
    if not child_bad:
        pytest.skip("no jit_1x1:avx2 with a channels_last source listed for this problem here")
    # the overrun is this row's (the guard band), never a crash surfacing in a later candidate's row
    assert child_bad[0].status == "wrong" and "B past its" in child_bad[0].detail, child_bad[0]
    assert not [r for r in rows if r.status.startswith(("crashed", "timed out"))], [str(r) for r in rows]
    timed = [r for r in rows if r.status == "ok"]
    assert timed and rows[:len(timed)] == timed and all(r.median_ms > 0 for r in timed)
    assert plan.selected.index == timed[0].impl.index
    assert not (plan.selected.name == "jit_1x1:avx2" and plan.selected.layouts == "user")


def test_scratchpad_guard_counts_bytes_written_past_the_scratchpad(monkeypatch):
    """The child's guard band (oneDNN #6035's detector) in-process, on any CPU: off in this process
    (no byte past the scratchpad); on, a correct implementation leaves it intact and a byte
    written N bytes past the end reads as an overrun of N + 1."""
    from rawconv.onednn import _Built

    assert _Built.guard_bytes == 0 and isolated.GUARD_BYTES >= 1 << 16
    p = ConvProblem(n=2, c=8, k=8, in_spatial=(7, 7), kernel=(3, 3), stride=(2, 2), pad_before=(1, 1),
                    pad_after=(1, 1), layout="nhwc")
    x, w, _ = p.make_inputs(seed=3)
    gy = torch.randn(p.y_shape).contiguous(memory_format=torch.channels_last)
    monkeypatch.setattr(_Built, "guard_bytes", 4096)
    plan = onednn.Convolution.from_problem(p, direction="backward_weights")
    with_sp = [i for i in plan.implementations if i.scratchpad_bytes and not i.known_bad]
    if not with_sp:
        pytest.skip("no implementation here needs a scratchpad for this problem")
    plan.select(with_sp[0])
    dw = plan.execute(x, grad_y=gy)
    b = plan._built[plan.selected.index]
    assert b.scratchpad.numel() == b.scratchpad_bytes + 4096 and b.overruns() == []
    torch.testing.assert_close(dw.double(), torch.ops.aten.convolution_backward(
        gy.double(), x.double(), w.double(), None, [2, 2], [1, 1], [1, 1], False, [0, 0], 1,
        [False, True, False])[1], rtol=1e-4, atol=1e-4)
    b.scratchpad[b.scratchpad_bytes + 99] = 0
    assert b.overruns() == [(f"{b.scratchpad_bytes} B scratchpad", 100)]
    # the reorder buffers rawconv hands the library are guarded the same way
    with_re = [i for i in plan.implementations if i.reorders and not i.known_bad]
    if with_re:
        plan.select(with_re[0])
        plan.execute(x, grad_y=gy)
        b = plan._built[plan.selected.index]
        bufs = [(n, t, size) for n, t, size in b._guarded if n.startswith("reorder buffer of ")]
        assert bufs and b.overruns() == [] and all(t.numel() == size + 4096 for _, t, size in bufs)
        name, t, size = bufs[0]
        t[size + 7] = 1
        assert b.overruns() == [(f"{size} B {name}", 8)]
    monkeypatch.setattr(_Built, "guard_bytes", 0)
    plan2 = onednn.Convolution.from_problem(p, direction="backward_weights")
    plan2.select(with_sp[0])
    plan2.execute(x, grad_y=gy)
    b2 = plan2._built[plan2.selected.index]
    assert b2.scratchpad.numel() == b2.scratchpad_bytes and b2.overruns() == []


def test_compare_rows_through_isolation():
    from rawconv.compare import compare_problem

    p = ConvProblem(n=1, c=4, k=4, in_spatial=(6, 6), kernel=(3, 3), pad_before=(1, 1), pad_after=(1, 1))
    rows = compare_problem(p, backends=("onednn",), iterations=2, warmup=1, isolate=ISO)
    assert rows and all("isolated" in r.detail for r in rows)
    # listed here, run in the child under ONEDNN_MAX_CPU_ISA=AVX2: an AVX-512 implementation of this
    # process's list is not offered there
    ran = [r for r in rows if not r.error.startswith("not supported")]
    assert ran and all(r.ok and r.median_ms > 0 for r in ran), [(r.implementation, r.error) for r in rows]
    assert all("avx512" in r.implementation for r in rows if r not in ran)
    direct = isolated.run_onednn_candidates(p, iterations=1, warmup=0, timeout_s=30, env=ISO["env"],
                                            threads=1, indices=[0], keep_output=True)
    assert len(direct) == 1 and direct[0]["status"] == "ok" and direct[0]["ok"]
    assert direct[0]["output"].shape == p.y_shape
    with pytest.raises(ArgumentError, match="indices"):
        isolated.run_onednn_candidates(p, timeout_s=30, env=ISO["env"], threads=1, indices=[99])


# ---------------------------------------------------------------- the command line (--isolate)
def _cli(args, env_extra, timeout=240):
    import os
    import subprocess
    import sys

    env = dict(os.environ, **env_extra)
    return subprocess.run([sys.executable, "-m", "rawconv.cli"] + args, capture_output=True, text=True, env=env,
                          timeout=timeout)


def test_cli_compare_isolate_survives_an_injected_abort():
    """One candidate aborts in the child (RAWCONV_ISOLATE_CRASH): its row says so, the others ran
    and were checked, and the parent exits 4 (a rawconv candidate failed)."""
    r = _cli(["compare", "mb1ic8ih10oc8oh10kh3ph1", "--isolate", "--no-ref", "--iterations", "1", "--warmup", "0",
              "--threads", "1", "--width", "160"], {"RAWCONV_ISOLATE_CRASH": "x64:gemm:jit"})
    assert r.returncode == 4, r.stdout + r.stderr
    line = next(ln for ln in r.stdout.splitlines() if "x64:gemm:jit" in ln and "crashed" in ln)
    assert "crashed: SIGABRT" in line
    assert any(" ok " in ln for ln in r.stdout.splitlines() if ln.startswith("onednn"))


def test_cli_list_isolate_reports_onednn_6035_as_a_row_status():
    """oneDNN #6035 (jit_1x1:avx2, backward weights, NHWC, stride 2, IC < 8) through ``rawconv list
    --isolate``: the known-bad row runs in the child, whose guard band after the scratchpad counts
    the bytes written past it; the row says so, the other rows ran right, and the parent exits 1."""
    r = _cli(["list", "mb32ic4ih32oc8oh16kh1sh2", "--layout", "nhwc", "--direction", "backward_filter", "--isolate",
              "--allow-known-bad", "--timeout", "20", "--width", "160"],
             {"ONEDNN_MAX_CPU_ISA": "AVX2", "OMP_NUM_THREADS": "1"})
    rows = [ln for ln in r.stdout.splitlines() if "jit_1x1:avx2" in ln and "user" in ln]
    assert rows and "oneDNN#6035" in rows[0], r.stdout
    # the write past the scratchpad lands in the child's guard band: a "wrong" row (exit 1, as compare's
    # wrong answers), never a crash of a later row; 1 thread leaves dW right, so only the guard tells
    assert "wrong: wrote " in rows[0] and " B past its " in rows[0], r.stdout
    assert r.returncode == 1 and "exit status 1: a result is outside tolerance" in r.stdout, r.stdout + r.stderr
    others = [ln for ln in r.stdout.splitlines() if ln.lstrip()[:1].isdigit() and "oneDNN#6035" not in ln]
    assert others and all(ln.rstrip().endswith(" ok") for ln in others), r.stdout


def test_a_fused_plans_isolated_autotune_times_the_fused_primitive():
    # the child builds the parent's primitive WITH its post-ops (bias, residual sum, ReLU): the plain
    # convolution it built before has other implementations and times, so the search timed
    # something else than what the fused plan runs
    from rawconv import fused

    g = torch.Generator().manual_seed(7)
    x, w, b = (torch.randn(1, 8, 6, 6, generator=g), torch.randn(8, 8, 3, 3, generator=g),
               torch.randn(8, generator=g))
    plan = fused.FusedConvolution(x, w, b, padding=1, residual=True, activation="relu")
    tensors = plan._example_tensors()
    r0 = tensors["out"].clone()   # the residual the sum post-op reads from the destination
    iso = _isolate.options(ISO)
    session = isolated._onednn_session(plan.problem, "forward", tensors, fpmath="strict", prepack=False, iso=iso,
                                       plan_threads=plan.threads_arg, post_ops=plan._post_ops)
    try:
        assert session.setup().ok
        impl = next(i for i in session.impls if not i.name.startswith("ref"))
        row = session.run(impl, iterations=0, check=False, keep_output=True)   # one call: the sum reads out once
        assert row["status"] == "ok", row
        t = tensors
        ref = torch.relu(torch.nn.functional.conv2d(t["x"].double(), t["w"].double(), t["bias"].double(), padding=1)
                         + r0.double())
        torch.testing.assert_close(row["output"].double(), ref, rtol=1e-4, atol=1e-4)
    finally:
        session.close()
    # and the search through it selects and records as the plan's own search does
    table = plan.autotune(iterations=1, warmup=0, isolate=ISO, use_cache=False)
    assert table[0].status == "ok" and plan.selected.choice == table[0].choice
    assert [list(op) for op in plan.tuning_record.key.options["post_ops"]] == [list(op) for op in plan._post_ops]
