"""rawconv.core.autotune: the driver (:func:`autotune.drive`: the policy over a plan's candidates
and timing hook) with a scripted plan, and the tuning-cache half every backend's autotune runs,
with a fake plan and through oneDNN's autotune end to end."""
from __future__ import annotations

import math

import pytest
import torch

from rawconv import ConvProblem, onednn, tuning
from rawconv.core import autotune
from rawconv.errors import NotSupportedError


@pytest.fixture(autouse=True)
def fresh_cache(fresh_tuning_cache):
    """The process's tuning cache empty, in memory, before and after (conftest's fresh_tuning_cache)."""
    yield


class _Table(list):
    record = None


class _Plan:
    tuning_record = None


def _key():
    p = ConvProblem(n=1, c=2, k=3, in_spatial=(5, 5), kernel=(3, 3), pad_before=(1, 1), pad_after=(1, 1))
    return tuning.TuningKey.for_backend("onednn", p, "forward", onednn.key_options("strict"))


def test_cached_reads_only_when_wanted_and_attaches_the_hit(tmp_path):
    key, plan = _key(), _Plan()
    rec = tuning.TuningRecord(key, "x64:gemm:jit@any", {}, median_ms=1.5)
    tuning.cache().put(rec)
    calls = []

    def from_hit(hit):
        calls.append(hit)
        return _Table([hit.choice])

    assert autotune.cached(plan, key, None, from_hit) is None and calls == []   # no file: None reads nothing
    assert autotune.cached(plan, key, False, from_hit) is None and calls == []
    t = autotune.cached(plan, key, True, from_hit)
    assert t == ["x64:gemm:jit@any"] and t.record is rec and plan.tuning_record is rec and calls == [rec]
    tuning.set_cache_file(str(tmp_path / "c.json"))
    assert autotune.wanted(None) and not autotune.wanted(None, file_default=False)
    other = tuning.TuningKey.from_dict(dict(key.to_dict(), direction="backward_data"))
    assert autotune.cached(_Plan(), other, True, from_hit) is None     # a miss


def test_cached_searches_when_the_choice_no_longer_selects():
    key, plan = _key(), _Plan()
    tuning.cache().put(tuning.TuningRecord(key, "gone@any", {}))

    def from_hit(hit):
        raise NotSupportedError(f"{hit.choice} is not offered")

    assert autotune.cached(plan, key, True, from_hit) is None and plan.tuning_record is None


def test_keep_stores_and_attaches(tmp_path):
    tuning.set_cache_file(str(tmp_path / "c.json"))
    key, plan, table = _key(), _Plan(), _Table(["row"])
    rec = tuning.TuningRecord(key, "x64:gemm:jit@any", {}, median_ms=2.0, min_ms=1.0)
    assert autotune.keep(plan, table, rec) is table
    assert table.record is rec and plan.tuning_record is rec and tuning.cache().get(key) == rec
    assert (tmp_path / "c.json").exists()
    assert autotune.hit_times(rec) == (2.0, 1.0)
    assert all(math.isnan(v) for v in autotune.hit_times(tuning.TuningRecord(key, "c", {})))


def test_onednn_autotune_runs_the_driver():
    torch.manual_seed(0)
    x, w = torch.randn(1, 4, 8, 8), torch.randn(4, 4, 3, 3)
    plan = onednn.Convolution(x, w, padding=1)
    first = plan.autotune(iterations=2, warmup=0, use_cache=True)
    assert first.record is plan.tuning_record and tuning.cache().get(plan._tuning_key(False)) == first.record
    assert first.record.detail["driver"] == "rawconv.core.autotune.drive"    # the one driver's record
    assert first.record.detail["impl"] == plan.selected.name                  # with oneDNN's detail
    again = onednn.Convolution(x, w, padding=1)
    hit = again.autotune(iterations=2, warmup=0, use_cache=True)
    assert len(hit) == 1 and hit[0].phase == "cache" and hit.record == first.record
    assert again.selected.choice == first.record.choice
    ref = torch.nn.functional.conv2d(x.double(), w.double(), padding=1)
    assert (again.execute(x, w).double() - ref).abs().max() < 1e-4


# ---------------------------------------------------------------------------- drive()
class _Cand:
    backend, known_bad, workspace_bytes, notes = "onednn", "", 0, ()

    def __init__(self, name, known_bad=""):
        self.choice, self.known_bad = name, known_bad


class _Scripted:
    """A plan of the contract whose timing hook replays ``times[name]`` (one value per call) and
    whose candidate ``"off"`` computes a wrong result (torch's convolution otherwise)."""

    def __init__(self, times, known_bad=()):
        self.problem = ConvProblem(n=1, c=2, k=3, in_spatial=(5, 5), kernel=(3, 3), pad_before=(1, 1),
                                   pad_after=(1, 1))
        self.direction, self.times, self.calls = "forward", {k: list(v) for k, v in times.items()}, []
        self._cands = [_Cand(n, "crashes" if n in known_bad else "") for n in times]
        self._sel, self.tuning_record = self._cands[0], None

    def candidates(self):
        return list(self._cands)

    def select(self, *, choice=None):
        self._sel = next((c for c in self._cands if c.choice == choice), None)
        if self._sel is None:
            raise NotSupportedError(f"no {choice}")
        return self._sel

    @property
    def selected(self):
        return self._sel

    def execute(self, x=None, w=None, bias=None, out=None, *, grad_y=None):
        y = torch.nn.functional.conv2d(x, w, bias, padding=1)
        return y + 1 if self._sel.choice == "off" else y

    def time_candidate(self, candidate, call, *, budget_s=None):
        assert self._sel is candidate
        self.calls.append(candidate.choice)
        t = self.times[candidate.choice].pop(0)
        if t is None:
            raise NotSupportedError("does not run")
        if isinstance(t, BaseException):
            raise t
        return autotune.Timing(t, t, 1)

    def tuning_key(self):
        return tuning.TuningKey.for_backend("onednn", self.problem, "forward", {"scripted": True},
                                            environment={"library": "x", "library_version": "1", "device": "cpu"})


def test_drive_checks_times_confirms_and_selects():
    """Order, check, confirmation: "off" (timed fastest, but wrong) is never timed; "b" and "c"
    within 15% of each other are timed again and the confirmation's best round ranks them;
    "slow" is timed once; the winner is selected and its record stored (the confirmation's median)."""
    plan = _Scripted({"slow": [9.0], "b": [1.0, 1.3, 1.3], "off": [0.1], "c": [1.1, 0.9, 1.0]})
    table = autotune.drive(plan, 10.0, use_cache=False)
    assert [(r.name, r.status) for r in table] == [("c", "ok"), ("b", "ok"), ("slow", "ok"), ("off", "wrong")]
    assert plan.calls == ["slow", "b", "c", "b", "c", "b", "c"]
    assert plan.selected.choice == "c" and table[0].median_ms == 0.9
    rec = plan.tuning_record
    assert rec.choice == "c" and rec.median_ms == 1.0 and rec.detail["rounds"] == 3
    assert tuning.cache().get(plan.tuning_key()) == rec


def test_drive_reads_the_cache_first_and_raises_when_nothing_runs():
    plan = _Scripted({"a": [2.0], "b": [1.0]})
    autotune.drive(plan, use_cache=False)
    again = _Scripted({"a": [], "b": []})   # nothing timed: a cache hit
    hit = autotune.drive(again, use_cache=True)
    assert len(hit) == 1 and hit[0].phase == "cache" and again.selected.choice == "b" and again.calls == []
    bad = _Scripted({"off": [1.0], "gone": [None], "kb": [1.0]}, known_bad=("kb",))
    bad.select(choice="kb")
    with pytest.raises(NotSupportedError, match="off: wrong.*gone: not supported.*kb: known bad"):
        autotune.drive(bad, use_cache=False)
    assert bad.selected.choice == "kb"   # what it ran before


def test_drive_with_an_unlimited_budget_records_its_winner():
    """budget_s=inf (accepted as "no limit", as oneDNN's autotune takes it) selects and records the
    winner like None: the search's result is not lost to the record's check of its detail."""
    plan = _Scripted({"a": [2.0], "b": [1.0]})
    table = autotune.drive(plan, math.inf, use_cache=False)
    assert table[0].name == "b" and plan.selected.choice == "b"
    assert plan.tuning_record.choice == "b" and plan.tuning_record.detail["budget_s"] is None


@pytest.mark.parametrize("bad", [math.nan, -1.0, math.inf])
def test_drive_refuses_an_impossible_timing_and_keeps_the_previous_choice(bad):
    """A timing hook that returns NaN, a negative or an infinite time is the backend's bug: the
    search stops with a clear error naming the hook, and the plan runs what it ran before (a NaN
    row used to be ranked and selected, and only the record's check raised)."""
    from rawconv.core.errors import ArgumentError

    plan = _Scripted({"a": [2.0], "b": [bad]})
    plan.select(choice="a")
    with pytest.raises(ArgumentError, match="time_candidate returned an impossible timing for 'b'"):
        autotune.drive(plan, use_cache=False)
    assert plan.selected.choice == "a" and plan.tuning_record is None


def test_drive_from_four_threads_on_one_plan_times_each_candidate_selected():
    """Four threads driving one plan: each search holds the plan (the hook's assertion that the
    candidate it times is the one selected held in every call; before, 9 calls timed another)."""
    import threading

    plan = _Scripted({"a": [2.0] * 40, "b": [1.0] * 40, "c": [1.05] * 40})
    errors = []

    def run():
        try:
            for _ in range(3):
                autotune.drive(plan, use_cache=False)
        except BaseException as exc:   # noqa: BLE001 - reported below
            errors.append(exc)
    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and plan.selected.choice == "b"


def test_drive_candidate_failed_is_a_row_status_first_and_when_timed_again():
    """A hook's CandidateFailed (a crash in a child process) gives the row its status; failing in
    the confirmation drops the contender (its row says "when timed again") and the other wins."""
    plan = _Scripted({"crash": [autotune.CandidateFailed("crashed: SIGSEGV", "in the child")],
                      "a": [1.0, autotune.CandidateFailed("timed out after 2 s", "hung")], "b": [1.1, 1.2, 1.3]})
    table = autotune.drive(plan, use_cache=False)
    assert [(r.name, r.status) for r in table] == [("b", "ok"), ("crash", "crashed: SIGSEGV"),
                                                   ("a", "timed out after 2 s")]
    assert table[2].message == "when timed again: hung" and plan.selected.choice == "b"
    assert plan.tuning_record.choice == "b" and plan.tuning_record.median_ms == 1.3   # (its two confirmations)


def test_drive_interrupted_keeps_the_previous_choice():
    plan = _Scripted({"a": [2.0], "b": [KeyboardInterrupt()]})
    plan.select(choice="a")
    with pytest.raises(KeyboardInterrupt):
        autotune.drive(plan, use_cache=False)
    assert plan.selected.choice == "a" and plan.tuning_record is None


class _Together(autotune.Search):
    """A search timing the checked candidates together (as oneDNN's interleaved rounds), scripted:
    ``passes`` gives each pass's milliseconds by name."""

    together, time_wrong = True, True

    def __init__(self, plan, passes):
        super().__init__(plan)
        self.passes, self.groups = list(passes), []

    def time_together(self, candidates, budget_s, confirm):
        ms = self.passes.pop(0)
        self.groups.append(([c.choice for c in candidates], confirm))
        return [autotune.Timing(ms[c.choice], ms[c.choice] * 0.9, 4, {"pass": len(self.groups)}) for c in candidates]


def test_drive_times_together_then_confirms_the_pick_without_reranking():
    """Together: every checked candidate (the wrong one too: shown, never selected) in one pass,
    then the pick and its contenders within 15% in a fresh pass (the pick first), which gives the
    record's time; the first pass's ranking stands."""
    plan = _Scripted({"slow": [], "b": [], "off": [], "c": []})
    search = _Together(plan, [{"slow": 9.0, "b": 1.0, "off": 0.1, "c": 1.1}, {"b": 1.4, "c": 1.0}])
    table = autotune.drive(plan, 10.0, use_cache=False, search=search)
    assert search.groups == [(["slow", "b", "c", "off"], False), (["b", "c"], True)]
    assert [(r.name, r.status) for r in table] == [("b", "ok"), ("c", "ok"), ("slow", "ok"), ("off", "wrong")]
    assert table[3].median_ms == 0.1 and table[0].extra["pass"] == 2 and table[2].extra["pass"] == 1
    assert plan.selected.choice == "b" and plan.tuning_record.median_ms == 1.4 and plan.calls == []
    assert search.title == table.title and plan.tuning_record.timing["run_trustworthy"] is True


def test_drive_together_without_the_hook_says_so():
    plan = _Scripted({"a": [], "b": []})
    search = autotune.Search(plan)
    search.together = True
    with pytest.raises(NotImplementedError):
        autotune.drive(plan, use_cache=False, search=search)
    assert plan.selected.choice == "a"
