"""Calls that will run on oneDNN's reference implementation for long warn first (issue 13):
:func:`rawconv.onednn.reference_seconds`'s term counts are exact, a call whose selected
implementation is ``ref:*`` and whose estimate exceeds ``SLOW_REFERENCE_SECONDS`` warns
(:class:`rawconv.errors.SlowReferenceWarning`) before the library runs (so a filter turning it into
an error stops the call at once), once per plan and selection, and the CLI prints
it as one ``rawconv: warning:`` line. The estimate's accuracy is measured, not asserted (README)."""
from __future__ import annotations

import random
import warnings

import pytest
import torch

from rawconv import ConvProblem, onednn
from rawconv.onednn import plan as onednn_plan   # the plan class's module (what it reads)
from rawconv.errors import SlowReferenceWarning

pytestmark = pytest.mark.usefixtures("dnnl")


def _brute_valid(p: ConvProblem) -> int:
    """(output, kernel tap) pairs reading the input, counted one by one, times N*K*C/g."""
    per_dim = []
    for i, o, k, s, d, b in zip(p.in_spatial, p.out_spatial, p.kernel, p.stride, p.dilation, p.pad_before):
        per_dim.append(sum(1 for oo in range(o) for j in range(k) if 0 <= oo * s - b + j * d < i))
    n = 1
    for v in per_dim:
        n *= v
    return p.n * p.k * (p.c // p.groups) * n


def test_reference_term_counts_are_exact():
    rnd = random.Random(0)
    for _ in range(200):
        nd = rnd.choice((1, 2, 3))
        k = tuple(rnd.randint(1, 4) for _ in range(nd))
        d = tuple(rnd.randint(1, 3) for _ in range(nd))
        pb = tuple(rnd.randint(0, 6) for _ in range(nd))
        pa = tuple(rnd.randint(0, 6) for _ in range(nd))
        ins = tuple(max(rnd.randint(0, 9), (kk - 1) * dd + 1 - b - a) for kk, dd, b, a in zip(k, d, pb, pa))
        g = rnd.choice((1, 2))
        p = ConvProblem(n=rnd.randint(1, 2), c=2 * g, k=2 * g, in_spatial=ins, kernel=k,
                        stride=tuple(rnd.randint(1, 3) for _ in range(nd)), dilation=d, pad_before=pb, pad_after=pa,
                        groups=g)
        for direction in ("forward", "backward_data", "backward_weights"):
            e, taps, valid = onednn._ref_features(p, direction)
            assert valid == min(_brute_valid(p), taps), (p, direction)
            assert 0 <= valid <= taps


def _ref_only_problem():
    # padding far beyond the kernel: oneDNN 3.2 offers only its reference implementation here
    p = ConvProblem(n=1, c=1, k=1, in_spatial=(8, 8), kernel=(3, 3), pad_before=(4000, 4000),
                    pad_after=(4000, 4000))
    names = {i.name for i in onednn.Convolution.from_problem(p).implementations}
    if not names or not all(n.startswith("ref") for n in names):
        pytest.skip(f"oneDNN offers {sorted(names)} here, not only ref:*")
    return p


def test_a_long_reference_call_warns_before_it_runs(monkeypatch):
    p = _ref_only_problem()
    est = onednn.reference_seconds(p)
    assert est > 0.1
    monkeypatch.setattr(onednn, "SLOW_REFERENCE_SECONDS", est / 2)   # set on the face, read by the plan
    x = torch.randn(1, 1, 8, 8)
    w = torch.randn(1, 1, 3, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SlowReferenceWarning)   # the call stops at the warning: nothing runs
        with pytest.raises(SlowReferenceWarning, match="reference implementation ref:any.*estimated at"):
            onednn.forward(x, w, padding=4000)
        plan = onednn.Convolution(x, w, padding=4000)
        with pytest.raises(SlowReferenceWarning):
            plan.execute(x)


def test_the_warning_comes_once_per_plan_and_only_for_reference_implementations(monkeypatch):
    monkeypatch.setattr(onednn_plan, "SLOW_REFERENCE_SECONDS", 0.0)
    x, w = torch.randn(1, 4, 6, 6), torch.randn(4, 4, 3, 3)
    plan = onednn.Convolution(x, w, padding=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            plan.execute(x)                                   # oneDNN's first choice: not a reference one
        assert not any(issubclass(c.category, SlowReferenceWarning) for c in caught)
        ref = [i.index for i in plan.implementations if i.name.startswith("ref")][0]
        plan.select(ref)
        y = [plan.execute(x) for _ in range(3)]
    slow = [c for c in caught if issubclass(c.category, SlowReferenceWarning)]
    assert len(slow) == 1 and slow[0].filename == __file__    # once, pointing at the caller's line
    torch.testing.assert_close(y[-1], torch.nn.functional.conv2d(x, w, padding=1), rtol=1e-5, atol=1e-5)


def test_cli_prints_one_warning_line(monkeypatch, capsys):
    from rawconv.cli import main

    monkeypatch.setattr(onednn_plan, "SLOW_REFERENCE_SECONDS", 0.0)
    assert main(["compare", "--ref", "mb1ic2oc2ih6kh3", "--iterations", "1", "--warmup", "0", "--device", "cpu",
                 "--random"]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "reference implementation" in line]
    assert lines and all(line.startswith("rawconv: warning: rawconv.onednn: this forward call runs on oneDNN's "
                                         "reference implementation") for line in lines)
