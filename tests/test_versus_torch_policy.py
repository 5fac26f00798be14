"""torch's own pick as a candidate: one policy (rawconv.core.autotune.versus_torch) for the CPU's
oneDNN layers (rawconv.pytorch.versus_cpu) and CUDA's cuDNN graph layers (rawconv.pytorch.search's
_cuda_pick). Timings are scripted: what is tested is the policy, never a speed; CUDA's wrapper runs
here on a fake plan (its GPU timing replaced)."""
from __future__ import annotations

import pytest

from rawconv.core import autotune
from rawconv.core.errors import NotSupportedError

CASES = {   # (torch ms, rawconv ms, torch / rawconv) per measurement: the pick's, then torch's pick's
    "slower_alt_faster": [(1.0, 2.0, 0.5), (1.0, 0.9, 1.0 / 0.9)],
    "slower_alt_not_faster": [(1.0, 2.0, 0.5), (1.0, 2.5, 0.4)],
    "within_3_percent": [(1.0, 1.02, 1.0 / 1.02)],
    "just_over_3_percent": [(1.0, 1.04, 1.0 / 1.04), (1.0, 1.0, 1.0)],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_policy_tries_torchs_pick_only_when_slower_and_keeps_it_only_when_faster(case):
    script, seen = list(CASES[case]), []

    def measure(c):
        seen.append(c)
        return script[len(seen) - 1]
    pick, out = autotune.versus_torch(measure, "mine", ["torchs", "other"], word="engine")
    if case in ("slower_alt_faster", "just_over_3_percent"):
        assert seen == ["mine", "torchs"] and pick == "torchs"
        assert out["rawconv_ms"] == script[1][1] and out["vs_torch"] == script[1][2]
        assert out["vs_torch_note"].startswith(f"mine measured {script[0][1]:.4f} ms against torch's 1.0000")
        assert out["vs_torch_note"].endswith("torch's engine torchs kept instead")
    elif case == "slower_alt_not_faster":
        assert seen == ["mine", "torchs"] and pick == "mine" and out["vs_torch"] == 0.5
        assert out["vs_torch_note"] == "torch's engine torchs measured no faster (2.5000 ms)"
    else:
        assert seen == ["mine"] and pick == "mine" and "vs_torch_note" not in out


def test_the_policy_without_an_alternative_or_a_ratio_keeps_the_choice():
    slow = (1.0, 3.0, 1 / 3)
    assert autotune.versus_torch(lambda c: slow, "mine", []) == ("mine", dict(torch_ms=1.0, rawconv_ms=3.0,
                                                                              vs_torch=1 / 3))
    pick, out = autotune.versus_torch(lambda c: (1.0, 0.0, None), "mine", ["torchs"])
    assert pick == "mine" and out["vs_torch"] is None and "vs_torch_note" not in out


@pytest.mark.parametrize("exc", [NotSupportedError("no engine 5 here"), RuntimeError("CUDA error")])
def test_the_policy_keeps_the_choice_when_torchs_pick_does_not_run(exc):
    def measure(c):
        if c == "torchs":
            raise exc
        return (1.0, 2.0, 0.5)
    pick, out = autotune.versus_torch(measure, "mine", ["torchs"], word="implementation")
    assert pick == "mine" and out["vs_torch"] == 0.5
    assert out["vs_torch_note"] == f"slower than torch; torch's implementation torchs did not run: {exc}"


def test_an_error_measuring_the_choice_itself_propagates():
    def measure(c):
        raise NotSupportedError("gone")
    with pytest.raises(NotSupportedError, match="gone"):
        autotune.versus_torch(measure, "mine", ["torchs"])


# ---------------------------------------------------------------------------- CUDA's wrapper
class _GraphPlan:
    """A tuned cuDNN graph plan as _cuda_pick sees it: ``selected_name``, ``select``, ``has_epilogue``."""

    def __init__(self, name, epilogue=False, refuse=()):
        self.selected_name, self.epilogue, self.refuse, self.selects = name, epilogue, refuse, []

    def has_epilogue(self):
        return self.epilogue

    def select(self, c):
        self.selects.append(c)
        if c in self.refuse:
            raise NotSupportedError(f"{c} does not finalize")
        self.selected_name = c


def _cuda(monkeypatch, plan, engines, script):
    from rawconv.cudnn.graph import search as S
    from rawconv.pytorch import search as P

    runs, timed = [], []

    def interleaved(fns, n):
        timed.append(plan.selected_name)
        t, r = script[len(timed) - 1]
        return (t, r), (t, r), (n, n)
    monkeypatch.setattr(S, "time_interleaved", interleaved)
    out = P._cuda_pick(plan, lambda: "torch", lambda: runs.append(plan.selected_name), engines,
                       {"torch_engine": "eng5"})
    return out, runs, timed


@pytest.mark.parametrize("epilogue", [False, True])
def test_cuda_keeps_torchs_engine_when_slower_and_it_measured_faster(monkeypatch, epilogue):
    plan = _GraphPlan("eng28{k2=3}", epilogue)
    out, runs, timed = _cuda(monkeypatch, plan, (5,), [(0.04, 0.60), (0.04, 0.038)])
    alt = ("unfused:" if epilogue else "") + "eng5"
    assert timed == ["eng28{k2=3}", alt] and runs == timed and plan.selected_name == alt
    assert out["torch_engine"] == "eng5" and out["vs_torch"] == pytest.approx(0.04 / 0.038)
    assert out["vs_torch_note"] == f"eng28{{k2=3}} measured 0.6000 ms against torch's 0.0400: torch's engine {alt} kept instead"


def test_cuda_goes_back_when_torchs_engine_is_no_faster_or_does_not_run(monkeypatch):
    plan = _GraphPlan("eng28")
    out, _runs, timed = _cuda(monkeypatch, plan, (5,), [(0.04, 0.06), (0.04, 0.07)])
    assert timed == ["eng28", "eng5"] and plan.selected_name == "eng28" and plan.selects == ["eng5", "eng28"]
    assert out["vs_torch"] == pytest.approx(0.04 / 0.06) and "measured no faster (0.0700 ms)" in out["vs_torch_note"]
    plan = _GraphPlan("eng28", refuse=("eng5",))
    out, _runs, timed = _cuda(monkeypatch, plan, (5,), [(0.04, 0.06)])
    assert timed == ["eng28"] and plan.selected_name == "eng28" and plan.selects == ["eng5", "eng28"]
    assert out["vs_torch_note"].startswith("slower than torch; torch's engine eng5 did not run: eng5 does not finalize")


@pytest.mark.parametrize("name,engines,script", [("eng28", (5,), [(0.04, 0.0408)]),      # within 3%
                                                 ("unfused:eng5", (5,), [(0.04, 0.06)]),    # on torch's engine already
                                                 ("eng28", (), [(0.04, 0.06)])])           # torch's engine unknown
def test_cuda_leaves_the_choice_alone(monkeypatch, name, engines, script):
    plan = _GraphPlan(name)
    out, _runs, timed = _cuda(monkeypatch, plan, engines, script)
    assert timed == [name] and plan.selects == [] and "vs_torch_note" not in out
    assert out["torch_ms"] == script[0][0] and out["rawconv_ms"] == script[0][1]


class _Ec:
    def __init__(self, engine, name):
        self.engine, self.name = engine, name


class _KnobPlan(_GraphPlan):
    """A plan whose heuristics offer torch's engine under several knob settings."""

    def __init__(self, name, epilogue=False, offers=None):
        super().__init__(name, epilogue)
        self.offers = offers or {}

    def unfused(self):
        return self

    def heuristic(self, mode):
        return [_Ec(int(n[3:].split("{")[0]), n) for n in self.offers.get(mode, ())]


def test_torch_engine_configs_are_the_heuristics_knob_settings_of_it():
    from rawconv.pytorch import search as P

    plan = _KnobPlan("eng5", True, {"instant": ["eng57{k2=3,k17=220}", "eng5", "eng57{k2=1,k17=88}"],
                                    "fallback": ["eng57{k2=3,k17=220}", "eng0"]})
    assert P.torch_engine_configs(plan, 57) == ["unfused:eng57{k2=3,k17=220}", "unfused:eng57{k2=1,k17=88}"]
    assert P.torch_engine_configs(plan, 9) == ["unfused:eng9"]   # none offered: the default knobs
    many = _KnobPlan("eng5", False, {"instant": [f"eng57{{k2={i}}}" for i in range(9)]})
    assert len(P.torch_engine_configs(many, 57)) == P.TORCH_ENGINE_CONFIGS


def test_cuda_tries_each_knob_setting_of_torchs_engine_and_keeps_the_fastest(monkeypatch):
    """The H100's efficientnet_b0 blocks.0.0.conv_dw: torch's eng57 with default knobs measured 8.6 ms
    (no faster, the choice kept at 0.92x torch); the heuristics' knob settings of eng57 are tried."""
    plan = _KnobPlan("unfused:eng5", True, {"instant": ["eng57{k2=3,k17=220}", "eng57{k2=1,k17=88}"]})
    # (torch, rawconv) per measurement: the choice, then each knob setting
    out, runs, timed = _cuda(monkeypatch, plan, (57,), [(0.073, 0.079), (0.073, 0.0725), (0.073, 0.0728)])
    assert timed == ["unfused:eng5", "unfused:eng57{k2=3,k17=220}", "unfused:eng57{k2=1,k17=88}"]
    assert plan.selected_name == "unfused:eng57{k2=3,k17=220}"   # the fastest, selected again after the last try
    assert out["vs_torch"] == pytest.approx(0.073 / 0.0725) and "kept instead" in out["vs_torch_note"]
    plan = _KnobPlan("unfused:eng5", True, {"instant": ["eng57{k2=3,k17=220}", "eng57{k2=1,k17=88}"]})
    out, runs, timed = _cuda(monkeypatch, plan, (57,), [(0.073, 0.079), (0.073, 0.09), (0.073, 0.085)])
    assert plan.selected_name == "unfused:eng5" and out["vs_torch_note"].count("measured no faster") == 2
