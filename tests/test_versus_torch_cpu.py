"""convert(autotune=...) on the CPU, per searched layer: what torch runs (its oneDNN implementation,
read from oneDNN's verbose trace of torch's own call), both calls timed in interleaved rounds, and
torch's pick kept where rawconv's measured more than 3% slower and torch's measured faster
(rawconv.pytorch.versus_cpu). The timings are scripted here: what is tested is the policy and the
names, never a speed."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import rawconv.nn as rnn
from rawconv.pytorch import versus_cpu as V
from rawconv.pytorch.torch_choice import torch_choice


def _call():
    torch.manual_seed(0)
    x = torch.randn(2, 16, 14, 14).contiguous(memory_format=torch.channels_last)
    w = torch.randn(32, 16, 3, 3).contiguous(memory_format=torch.channels_last)
    b = torch.randn(32)
    return dict(x=x, w=w, bias=b, stride=1, padding=1, dilation=1, groups=1)


def _torch_impl(call):
    tc = torch_choice(**call)
    convs = [r for r in tc.onednn if r.kind == "convolution"]
    if not convs or not tc.matches:
        pytest.skip(f"torch ran {tc.backend} with no oneDNN convolution that rawconv's oneDNN offers by name here")
    return convs[0].impl, list(tc.matches)


@pytest.mark.parametrize("case", ["slower_alt_faster", "slower_alt_not_faster", "within_3_percent"])
def test_torch_pick_is_tried_only_when_rawconv_is_slower_and_kept_only_when_faster(monkeypatch, case):
    call = _call()
    impl, matches = _torch_impl(call)
    scripted = {"slower_alt_faster": [(1.0, 2.0, 0.5), (1.0, 0.9, 1.11)],
                "slower_alt_not_faster": [(1.0, 2.0, 0.5), (1.0, 2.5, 0.4)],
                "within_3_percent": [(1.0, 1.02, 0.98)]}[case]
    ran = []

    def fake_ratio(peer, ours, rounds):
        ran.append(ours())
        return scripted[len(ran) - 1]
    monkeypatch.setattr(V, "_ratio", fake_ratio)
    choice, info = V.versus_torch_cpu(lambda: "torch", lambda c: (lambda: c), "x64:gemm:jit@user", call)
    assert info["torch_engine"] == impl and info["torch_pick"] == matches
    if case == "slower_alt_faster":
        assert ran == ["x64:gemm:jit@user", matches[0]] and choice == matches[0]
        assert info["vs_torch"] == 1.11 and "kept instead" in info["vs_torch_note"]
    elif case == "slower_alt_not_faster":
        assert choice == "x64:gemm:jit@user" and info["vs_torch"] == 0.5 and "no faster" in info["vs_torch_note"]
    else:
        assert ran == ["x64:gemm:jit@user"] and choice == "x64:gemm:jit@user" and "vs_torch_note" not in info


def test_converted_cpu_layers_report_what_torch_runs_and_the_ratio():
    """convert(autotune=x) on the CPU: each searched layer's report row names torch's oneDNN
    implementation and both times, and the model is right against float64."""
    _torch_impl(_call())
    torch.manual_seed(1)
    m = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1, groups=4)).eval()
    x = torch.randn(2, 3, 20, 20)
    c = rnn.convert(m, autotune=x, autotune_budget_s=0.2)
    searched = [t for t in c.rawconv_report.tuned if t.get("searched", True)]
    assert searched and all(t.get("torch_engine") not in (None, "-", "?") for t in searched), searched
    assert all(t["torch_ms"] > 0 and t["rawconv_ms"] > 0 and t["vs_torch"] > 0 for t in searched)
    table = c.rawconv_report.table()
    assert searched[0]["torch_engine"] in table
    with torch.no_grad():
        ref = m.double()(x.double())
        assert ((c(x).double() - ref).abs().max() / ref.abs().max()).item() < 1e-4
