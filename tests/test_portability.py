"""Issue 36, item 5: a model autotuned on one CPU, saved, and loaded where oneDNN does not offer
the implementations it pinned (emulated with ``ONEDNN_MAX_CPU_ISA=AVX2`` in a child process) runs
oneDNN's first choice for those problems instead, warns once, and says which; its results (and a
training step's gradients) are torch's."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import rawconv.nn as rnn
from rawconv import onednn
from rawconv.pytorch import nn as _nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _beyond_avx2(direction: str, problem, w_layout: str) -> str | None:
    """An implementation oneDNN offers here for ``problem`` that AVX2 alone does not (an AVX-512 or
    AMX one, by name), as ``name@layouts``; None when there is none."""
    plan = onednn.Convolution.from_problem(problem, direction=direction, w_layout=w_layout)
    for impl in plan.implementations:
        if "avx512" in impl.name or "amx" in impl.name:
            return f"{impl.name}@{impl.layouts}"
    return None


def _pin_beyond_avx2(model) -> int:
    """Replace every pinned choice of ``model``'s layers by one AVX2 lacks (as an autotune on this
    CPU could have chosen); returns how many were replaced."""
    n = 0
    for m in model.modules():
        table = m.__dict__.get(_nn._TUNED_ATTR)
        for key, t in list((table or {}).items()):
            dirs = dict(t.directions)
            x = torch.empty(key[1]).as_strided(key[1], key[2])
            args = {"x": x, "padding": m.padding}
            if t.kind == "fused":
                args["residual"] = None
            probs = {_nn._forward_direction(t.kind): (_nn._problem_of(m, t.kind, args), onednn.weights_layout(m.weight))}
            if t.kind == "conv":
                probs.update(_nn._grad_problems(m, t.kind, args, "onednn"))
            for direction, (problem, wl) in probs.items():
                if dirs.get(direction) is None:
                    continue
                alt = _beyond_avx2(direction, problem, wl)
                if alt is not None:
                    dirs[direction] = alt
                    n += 1
            bwd = (dirs["backward_data"], dirs["backward_weights"]) if t.backward_choice is not None else None
            table[key] = dataclasses.replace(t, choice=dirs[_nn._forward_direction(t.kind)], backward_choice=bwd,
                                             directions=dirs)
            if t.kind == "fused" and m.activation != "none":   # as if convert had measured it faster unfused
                from rawconv import fused as _fu

                plan = _fu.FusedConvolution.for_problem(probs["forward"][0], activation="none")
                alt = next((f"{i.name}@{i.layouts}" for i in plan.implementations
                            if "avx512" in i.name or "amx" in i.name), None)
                if alt is not None:
                    m.__dict__[_nn._fusion.UNFUSED_ATTR] = {key: alt}
                    m.__dict__[_nn._UNFUSED_OFFERED_ON] = {key: _nn._onednn_here()}
                    n += 1
    return n


_CHILD = textwrap.dedent("""
    import json, sys, warnings
    sys.path.insert(0, sys.argv[1])
    import torch, torch.nn.functional as F
    import rawconv
    from rawconv import onednn
    out = {"isa": onednn._dnnl.effective_cpu_isa()}
    plain, fused, x = torch.load(sys.argv[2], weights_only=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            y = plain(x)
            yf = fused(x)
        loss = plain(x).square().sum()
        loss.backward()
    ref = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(16, 8, 3, padding=1))
    ref.load_state_dict(plain.state_dict())
    yr = ref(x)
    yr.square().sum().backward()
    out["y"] = float((y - yr).abs().max())
    out["yf"] = float((yf - yr.detach()).abs().max())
    out["grad"] = max(float((a.grad - b.grad).abs().max()) for a, b in zip(plain.parameters(), ref.parameters()))
    out["warnings"] = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    out["tuned"] = [t.as_dict() for m in plain.modules() for t in (m.__dict__.get("_rawconv_tuned") or {}).values()]
    out["unfused"] = [c for m in fused.modules() for c in (m.__dict__.get("_rawconv_unfused") or {}).values()]
    print(json.dumps(out))
""")


@pytest.mark.slow
def test_a_model_tuned_beyond_avx2_runs_where_only_avx2_is_offered(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(2, 8, 12, 12)
    base = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.Conv2d(16, 8, 3, padding=1))
    plain = rnn.convert(base, autotune=x, autotune_backward=True, autotune_budget_s=0.05)
    fused = rnn.convert(base.eval(), fuse=True, autotune=x, autotune_budget_s=0.05)
    if _pin_beyond_avx2(plain) == 0 or _pin_beyond_avx2(fused) == 0:
        pytest.skip("this CPU offers no implementation beyond AVX2 for these problems (nothing to fall back from)")
    pinned = [t.choice for m in plain.modules() for t in (m.__dict__.get(_nn._TUNED_ATTR) or {}).values()]
    with torch.no_grad():   # here, where the pins are offered, they run
        plain(x)
        fused(x)
    path = tmp_path / "model.pt"
    torch.save((plain, fused, x), path)
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2")
    run = subprocess.run([sys.executable, "-c", _CHILD, ROOT, str(path)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["isa"] == "avx2"
    assert out["y"] < 1e-4 and out["yf"] < 1e-4 and out["grad"] < 1e-2, out
    assert len(out["warnings"]) == 1, out["warnings"]   # once, for every layer and direction
    said = out["warnings"][0]
    assert any(p in said for p in pinned) and "not offer" in said and "instead" in said, said
    # the layers now pin nothing beyond AVX2: what runs is oneDNN's own first choice there
    for t in out["tuned"]:
        assert all(c is None or ("avx512" not in c and "amx" not in c) for c in t["directions"].values()), t
    # the layer measured faster unfused stays unfused, on an implementation offered here
    assert out["unfused"] and all("avx512" not in c and "amx" not in c for c in out["unfused"]), out["unfused"]
