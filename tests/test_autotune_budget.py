"""``budget_s``: one meaning (seconds of wall time per problem and direction) in the three
autotuners and ``convert``, checked by one function (issue 35); ``Options`` without the fields
nothing read."""
from __future__ import annotations

import math

import pytest
import torch

import rawconv.nn as rnn
from rawconv import ArgumentError, ArgumentTypeError, ConvProblem, onednn
from rawconv.core import autotune as _autotune, bench
from rawconv.core.options import Options, options_of


def _problem():
    return ConvProblem(n=1, c=4, k=8, in_spatial=(9, 9), kernel=(3, 3), pad_before=(1, 1), pad_after=(1, 1))


@pytest.mark.parametrize("bad,exc", [(0, ArgumentError), (-1.0, ArgumentError), (math.nan, ArgumentError),
                                     ("1", ArgumentTypeError), (True, ArgumentTypeError), ([1], ArgumentTypeError)])
def test_one_check_everywhere(bad, exc):
    """The same refusal from the check, the oneDNN autotune, the graph search's options and convert."""
    from rawconv.cudnn.graph import search as S

    with pytest.raises(exc, match="budget_s must be a positive number of seconds"):
        _autotune.check_budget(bad)
    plan = onednn.Convolution.from_problem(_problem())
    with pytest.raises(exc, match="budget_s must be a positive number of seconds"):
        plan.autotune(budget_s=bad)
    with pytest.raises(exc, match="budget_s must be a positive number of seconds"):
        S.SearchOptions(budget_s=bad)
    with pytest.raises(exc, match="autotune_budget_s must be a positive number of seconds"):
        rnn.convert(torch.nn.Conv2d(2, 2, 3), autotune_budget_s=bad)
    assert _autotune.check_budget(None) is None and _autotune.check_budget(2) == 2
    with pytest.raises(ArgumentTypeError):
        _autotune.check_budget(None, none_ok=False)


def test_budget_shares_what_is_left():
    b = _autotune.Budget(10.0)
    assert 0 < b.left() <= 10.0
    assert b.share(4) == pytest.approx(b.left() / 4, rel=1e-3)
    assert b.share(4, 0.5) == pytest.approx(b.left() / 8, rel=1e-3)
    assert _autotune.Budget(None).share(3) is None and _autotune.Budget(None).left() is None
    spent = _autotune.Budget(1e-9)
    assert spent.left() == 0.0 and spent.share(5) == 1e-3   # the floor: every candidate still gets a call


def test_onednn_budget_is_for_the_whole_search(monkeypatch):
    """oneDNN's timing rounds and confirmation get shares of one budget for the problem (they got the
    whole budget each, per implementation, before), and no limit without one."""
    seen = []
    real = bench.time_rounds

    def spy(cands, **kw):
        seen.append((len(cands), kw.get("budget_s")))
        return real(cands, **kw)
    monkeypatch.setattr(bench, "time_rounds", spy)
    budget = 0.5
    plan = onednn.Convolution.from_problem(_problem())
    plan.autotune(iterations=2, warmup=0, budget_s=budget, use_cache=False)
    assert len(seen) == 2   # the rounds, then the confirmation
    (n_rounds, per_rounds), (n_confirm, per_confirm) = seen
    assert 0 < per_rounds * n_rounds <= 0.7 * budget + 1e-3 * n_rounds
    assert 0 < per_confirm * n_confirm <= budget + 1e-3 * n_confirm
    seen.clear()
    plan.autotune(iterations=2, warmup=0, use_cache=False)
    assert [b for _n, b in seen] == [None, None]


def test_convert_passes_the_budget_per_problem(monkeypatch):
    """convert gives each distinct problem's oneDNN autotune autotune_budget_s as it is (no cap
    per implementation, no 0.25 s default)."""
    calls = []
    real = onednn.Convolution.autotune

    def spy(self, *a, **kw):
        calls.append(kw.get("budget_s"))
        return real(self, *a, **kw)
    monkeypatch.setattr(onednn.Convolution, "autotune", spy)
    rnn.clear_tuning()
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 5, 3, padding=1), torch.nn.Conv2d(5, 6, 3)).eval()
    x = torch.randn(1, 3, 10, 11)
    rnn.convert(model, autotune=x, autotune_budget_s=1.5)
    assert calls == [1.5, 1.5]
    calls.clear()
    rnn.clear_tuning()
    rnn.convert(model, autotune=torch.randn(1, 3, 12, 11))
    assert calls == [None, None]


def test_options_lost_the_fields_nothing_read():
    for name, where in (("budget_s", "autotune"), ("isolate", "isolate="), ("timeout_s", "timeout_s"),
                        ("logger", "logging")):
        with pytest.raises(ArgumentError, match=f"Options has no {name} any more.*{where}"):
            Options(**{name: 1})
        with pytest.raises(ArgumentError, match=f"Options has no {name}"):
            options_of({name: 1})
    with pytest.raises(ArgumentError, match="unknown option"):
        Options(colour="red")
    o = Options(precision="tf32", deterministic=True, workspace_limit=1 << 20, allow_known_bad=True)
    assert o.as_dict() == {"precision": "tf32", "deterministic": True, "workspace_limit": 1 << 20,
                           "allow_known_bad": True}
    assert o.with_(precision="bf16").precision == "bf16" and options_of({"precision": "any"}).precision == "any"
    with pytest.raises(ArgumentError, match="workspace_limit"):
        o.with_(workspace_limit=-1)


@pytest.mark.gpu
def test_legacy_budget_leaves_the_rest_out():
    """cuDNN's legacy autotune: a spent budget times one algo (Find's first usable), no budget all."""
    from rawconv import cudnn

    p = ConvProblem(n=2, c=16, k=16, in_spatial=(20, 20), kernel=(3, 3), pad_before=(1, 1), pad_after=(1, 1),
                    device="cuda")
    plan = cudnn.Convolution.from_problem(p)
    every = plan.autotune(iterations=2, warmup=1, use_cache=False)
    one = plan.autotune(iterations=2, warmup=1, use_cache=False, budget_s=1e-9)
    assert len(every) > 1 and len(one) == 1
    assert plan.tuning_record.key == plan.tuning_key()
