"""The known-bad table (rawconv.known_bad) and how rawconv's oneDNN layer uses it.

Nothing here runs a known-bad implementation: ``guard`` makes any attempt fail the test cleanly
(the real ones crash or hang the process; tests/test_isolate.py runs them in a child process).
"""
from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

from rawconv import ConvProblem, known_bad, onednn
from rawconv.errors import ArgumentError, ArgumentTypeError, KnownBadError, NotSupportedError

ISSUE = "https://github.com/uxlfoundation/oneDNN/issues/6035"
# the report's case: BWD_W mb32ic4ih32oc8oh16kh1sh2, channels_last
P6035 = ConvProblem(n=32, c=4, k=8, in_spatial=(32, 32), kernel=(1, 1), stride=(2, 2), layout="nhwc")


@pytest.fixture
def guard(monkeypatch):
    """Fail (instead of crashing) if rawconv executes an implementation marked known bad."""
    real = onednn._Built.run

    def run(self, *a, **k):
        assert not self.impl.known_bad, f"rawconv ran known-bad {self.impl.name} ({self.impl.layouts})"
        return real(self, *a, **k)

    monkeypatch.setattr(onednn._Built, "run", run)


def _report_inputs():
    x = torch.randn(32, 4, 32, 32).to(memory_format=torch.channels_last)
    gy = torch.randn(32, 8, 16, 16).to(memory_format=torch.channels_last)
    return x, gy


def _bad_rows(problem=P6035, direction="backward_weights"):
    plan = onednn.Convolution.from_problem(problem, direction=direction)
    return plan, [r for r in plan.implementations if r.known_bad]


# ------------------------------------------------------------------ the table alone (no library)
@pytest.mark.parametrize("name, block", [("jit_1x1:avx2", 8), ("jit_1x1:avx512_core", 16),
                                         ("jit_bf16_1x1:avx512_core_bf16", 16)])
def test_6035_condition_is_the_one_found(name, block):
    nhwc = {"x": "acdb"}
    hit = known_bad.check("onednn", P6035, "backward_weights", name, "3.2.0", formats=nhwc, layouts="user")
    assert hit is not None and hit.link == ISSUE and set(hit.effects) == {"crash", "hang", "wrong result"}
    for ic in range(1, block):
        assert known_bad.check("onednn", P6035.with_(c=ic), "backward_weights", name, formats=nhwc)
    for ic in (block, block + block // 2, 2 * block):      # IC = ic_block and above are fine
        assert known_bad.check("onednn", P6035.with_(c=ic), "backward_weights", name, formats=nhwc) is None
    assert known_bad.check("onednn", P6035.with_(stride=(1, 1)), "backward_weights", name, formats=nhwc) is None
    for s in ((1, 2), (2, 1), (3, 3)):
        assert known_bad.check("onednn", P6035.with_(stride=s), "backward_weights", name, formats=nhwc)
    # a blocked source (the layouts=any rows, or NCHW input) is fine
    assert known_bad.check("onednn", P6035, "backward_weights", name, formats={"x": f"aBcd{block}b"}) is None
    assert known_bad.check("onednn", P6035.with_(layout="nchw"), "backward_weights", name) is None
    # 1-D too (acb)
    p1 = ConvProblem(n=8, c=4, k=8, in_spatial=(64,), kernel=(1,), stride=(2,), layout="nhwc")
    assert known_bad.check("onednn", p1, "backward_weights", name, formats={"x": "acb"})
    # other directions and implementations are not listed
    for d in ("forward", "backward_data"):
        assert known_bad.check("onednn", P6035, d, name, formats=nhwc) is None
    assert known_bad.check("onednn", P6035, "backward_weights", "jit:avx2", formats=nhwc) is None
    # without formats: the worst case for a channels_last problem's user rows; "any" rows are blocked
    assert known_bad.check("onednn", P6035, "backward_weights", name)
    assert known_bad.check("onednn", P6035, "backward_weights", name, layouts="any") is None


def test_versions_and_arguments():
    e = dataclasses.replace(known_bad.entries("onednn")[0], first="3.1", fixed="3.5")
    assert [e.applies_to_version(v) for v in ("3.0.9", "3.1.0", "3.2.0", "3.4.9", "3.5.0", "4.0")] == \
        [False, True, True, True, False, False]
    assert e.applies_to_version(None) and e.applies_to_version("unknown")
    assert ">= 3.1" in e.versions() and "< 3.5" in e.versions()
    assert "all known" in known_bad.entries("onednn")[0].versions()
    with pytest.raises(ArgumentError, match="backend"):
        known_bad.check("mkl", P6035, "forward", "x")
    with pytest.raises(ArgumentError, match="direction"):
        known_bad.check("onednn", P6035, "sideways", "x")
    assert known_bad.short(ISSUE) == "oneDNN#6035"
    assert known_bad.short("rawconv GPU tests") == "rawconv GPU tests"
    for e in known_bad.TABLE:
        assert e.effects and set(e.effects) <= set(known_bad.EFFECTS), e
        assert e.reference and e.condition and e.seen, e
        assert e.describe().startswith(e.library)


def test_cudnn_graph_reads_the_table():
    from rawconv import cudnn_graph as G

    assert G.KNOWN_WRONG == tuple(known_bad.entries(backend="cudnn_graph"))
    asym = ConvProblem(n=2, c=16, k=32, in_spatial=(10, 10), kernel=(3, 3), stride=(2, 2), pad_before=(1, 0),
                       pad_after=(2, 1), layout="nhwc")
    # the graph API's direction word and rawconv's, engine configs with knobs
    for d in ("backward_filter", "backward_weights"):
        for name in ("eng1", "eng20", "eng1{k2=3,k3=0}"):
            e = known_bad.check("cudnn_graph", asym, d, name)
            assert e is not None and e.library == "cuDNN" and e.effects == ("wrong result",)
    assert known_bad.check("cudnn_graph", asym, "backward_filter", "eng10") is None
    assert known_bad.check("cudnn_graph", asym, "backward_filter", "eng2") is None
    assert G.known_wrong(asym, "backward_filter", 20) == known_bad.check("cudnn_graph", asym, "backward_filter",
                                                                          "eng20").seen


# ------------------------------------------------------------------ oneDNN: listing, forcing, first choice
def test_listing_marks_exactly_the_rows_of_the_condition():
    plan, bad = _bad_rows()
    for r in plan.implementations:
        expected = known_bad.check("onednn", P6035, "backward_weights", r.name, formats=r.formats, layouts=r.layouts)
        assert (r.known_bad == ISSUE) == (expected is not None), r
        assert ("KNOWN BAD" in str(r)) == bool(r.known_bad)
    for r in bad:
        assert r.layouts == "user" and r.formats["x"] == "acdb" and "1x1" in r.name
    if not bad:
        pytest.skip("oneDNN offers no jit_1x1 backward-weights implementation with a channels_last source on this "
                    "CPU: " + ", ".join(f"{r.name}@{r.layouts}" for r in plan.implementations))
    # the same problem with 8/16 channels or stride 1 has no known-bad row
    assert not _bad_rows(P6035.with_(c=16))[1] and not _bad_rows(P6035.with_(stride=(1, 1)))[1]


def test_forcing_a_known_bad_implementation_raises_naming_the_issue(guard):
    plan, bad = _bad_rows()
    if not bad:
        pytest.skip("no known-bad row for the #6035 problem on this CPU (see test_listing_...)")
    x, gy = _report_inputs()
    r = bad[0]
    for impl in (r.index, f"{r.name}@user", r):
        with pytest.raises(KnownBadError, match="6035") as ei:
            onednn.backward_weights(x, gy, (8, 4, 1, 1), stride=2, impl=impl)
        assert isinstance(ei.value, NotSupportedError) and ei.value.link == ISSUE
        assert ei.value.implementation.startswith(r.name) and "allow_known_bad=True" in str(ei.value)
        with pytest.raises(KnownBadError):
            plan.select(impl)
        with pytest.raises(KnownBadError):
            onednn.Convolution.from_problem(P6035, direction="backward_weights", impl=impl)
    # the short name names both rows (issue 34: refused, the two listed, the known-bad one marked); the
    # known-bad error of the @user row points at the unaffected layouts=any row of the same implementation
    amb = str(pytest.raises(ArgumentError, plan.select, r.name).value)
    assert "ambiguous" in amb and f"{r.name}@user [{r.index}] (known bad)" in amb and f"{r.name}@any [" in amb
    assert f"impl='{r.name}@any'" in str(pytest.raises(KnownBadError, plan.select, f"{r.name}@user").value)
    # the override selects it (nothing runs here), on the plan or per call
    assert plan.select(r.index, allow_known_bad=True).index == r.index
    p2 = onednn.Convolution.from_problem(P6035, direction="backward_weights", allow_known_bad=True)
    assert p2.select(r.index).index == r.index
    with pytest.raises(ArgumentTypeError, match="allow_known_bad"):
        plan.select(r.index, allow_known_bad="yes")
    with pytest.raises(ArgumentTypeError, match="allow_known_bad"):
        onednn.backward_weights(x, gy, (8, 4, 1, 1), stride=2, impl=r.index, allow_known_bad=1)
    # a forced call that failed leaves nothing cached that would run it later
    dw = onednn.backward_weights(x, gy, (8, 4, 1, 1), stride=2, impl=f"{r.name}@any")
    ref = torch.nn.grad.conv2d_weight(x.double(), (8, 4, 1, 1), gy.double(), stride=2)
    assert torch.allclose(dw.double(), ref, rtol=1e-4, atol=1e-3)


def _mark_first(monkeypatch, problem, direction, names):
    """Make the rows called ``names`` (in ``problem``'s list) known bad for this test."""
    fake = known_bad.KnownBad(library="oneDNN", backend="onednn", direction=direction, implementations=tuple(names),
                              condition="test", when=lambda p, c: p == problem, effects=("wrong result",),
                              link="https://example.invalid/test", seen="test")
    monkeypatch.setattr(known_bad, "TABLE", known_bad.TABLE + (fake,))


TINY = ConvProblem(n=2, c=8, k=8, in_spatial=(10, 10), kernel=(3, 3), pad_before=(1, 1), pad_after=(1, 1))


def test_a_known_bad_first_choice_is_passed_over_with_a_warning(monkeypatch, guard):
    names = [r.name for r in onednn.Convolution.from_problem(TINY).implementations]
    first = names[0]
    _mark_first(monkeypatch, TINY, "forward", [first])
    x, w, _ = TINY.make_inputs()
    plan = onednn.Convolution.from_problem(TINY)
    assert plan.implementations[0].known_bad == "https://example.invalid/test"
    with pytest.warns(RuntimeWarning, match="first choice .* known bad"):
        sel = plan.selected
    assert sel.name != first and not sel.known_bad and sel.index == min(
        i for i, r in enumerate(plan.implementations) if not r.known_bad)
    y = plan.execute(x, w)
    assert torch.allclose(y.double(), TINY.reference(x, w), atol=1e-4)
    onednn.clear_cache()
    with pytest.warns(RuntimeWarning, match="known bad"):
        y2 = onednn.forward(x, w, padding=1)
    assert torch.equal(y2, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert onednn.Convolution.from_problem(TINY, allow_known_bad=True).selected.index == 0
    # every row known bad: the first choice raises instead
    _mark_first(monkeypatch, TINY, "forward", sorted(set(names)))
    with pytest.raises(KnownBadError, match="every implementation"):
        onednn.Convolution.from_problem(TINY).selected
    onednn.clear_cache()


def test_autotune_skips_known_bad_rows(monkeypatch, guard):
    names = [r.name for r in onednn.Convolution.from_problem(TINY).implementations if not r.name.startswith("ref")]
    if len(set(names)) < 2:
        pytest.skip(f"one non-reference implementation only: {names}")
    fastest_guess = names[0]
    _mark_first(monkeypatch, TINY, "forward", [fastest_guess])
    plan = onednn.Convolution.from_problem(TINY)
    rows = plan.autotune(iterations=2, warmup=1)
    skipped = [r for r in rows if r.status == "known bad"]
    assert skipped and all(r.impl.name == fastest_guess for r in skipped)
    assert all(r.status == "ok" for r in rows[:len(rows) - len(skipped)])   # timed rows first
    assert not plan.selected.known_bad and plan.selected.name != fastest_guess
    assert "known bad" in str(skipped[0])


def test_compare_reports_known_bad_rows_as_skipped(monkeypatch, guard):
    from rawconv.compare import compare_problem, summary

    p = TINY.with_(n=1)
    first = onednn.Convolution.from_problem(p).implementations[0].name
    _mark_first(monkeypatch, p, "forward", [first])
    rows = compare_problem(p, backends=("onednn",), iterations=1, warmup=0, include_ref=False)
    bad = [r for r in rows if r.implementation.startswith(first + "@") and r.error]
    assert bad and all(r.error == "skipped (known bad)" and "example.invalid" in r.detail for r in bad)
    assert all(r.ok for r in rows if not r.error)
    assert len(summary(rows)["skipped"]) == len(bad) and not summary(rows)["failed"]


def test_cli_list_marks_known_bad_rows(capsys):
    from rawconv.cli import main

    plan, bad = _bad_rows()
    assert main(["list", "mb32ic4ih32oc8oh16kh1sh2", "--layout", "nhwc", "--direction", "backward_weights",
                 "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert ("oneDNN#6035" in out) == bool(bad)
