"""The cuDNN faces (``rawconv.cudnn``, ``rawconv.cudnn_graph``) only hand names on; the plans' parts
read what they share where it lives (``cudnn/legacy/common.py``, ``cudnn/graph/common.py``). A setting
a user (or a test's monkeypatch) sets on a face must still reach the part that reads it: no GPU needed,
the parts' modules and one finalized-plan record are looked at directly."""
from __future__ import annotations

import pytest

pytest.importorskip("cffi")

from rawconv import cudnn, cudnn_graph  # noqa: E402
from rawconv.cudnn.graph import common as graph_common  # noqa: E402
from rawconv.cudnn.legacy import autotune as legacy_autotune, common as legacy_common  # noqa: E402


def test_gpu_time_set_on_the_legacy_face_reaches_the_legacy_autotune(monkeypatch):
    real = cudnn.gpu_time
    assert real is legacy_common.gpu_time

    def fake(fn, iterations=20, warmup=3, repeats=3):
        raise AssertionError("not called here")

    monkeypatch.setattr(cudnn, "gpu_time", fake)
    assert cudnn.gpu_time is fake
    assert legacy_common.gpu_time is fake
    assert legacy_autotune._o.gpu_time is fake, "the legacy autotune reads gpu_time where the face put it"
    from rawconv.cudnn import gpu_time as imported   # `from` imports go through the face too
    assert imported is fake
    monkeypatch.undo()
    assert cudnn.gpu_time is real and legacy_common.gpu_time is real


@pytest.mark.parametrize("on", [False, True])
def test_serialize_rtc_set_on_the_graph_face_reaches_the_finalized_plan(monkeypatch, on):
    monkeypatch.setattr(cudnn_graph, "SERIALIZE_RTC", on)
    assert graph_common.SERIALIZE_RTC is on and cudnn_graph.SERIALIZE_RTC is on
    rtc = graph_common.EngineConfig(4, behavior_notes=("RUNTIME_COMPILATION",))
    built = graph_common._Built(rtc, None, 0, {}, fused=True)
    assert built.serialize is on
    # a convolution-only graph never gets the barrier, whatever the setting
    assert graph_common._Built(rtc, None, 0, {}, fused=False).serialize is False


@pytest.mark.parametrize("name", ["environment", "reference"])
def test_graph_functions_set_on_the_face_reach_the_graph_autotune(monkeypatch, name):
    """The graph autotune reads environment() and reference() in common.py at call time (a CPU test of
    its relayout search patches them on the face)."""
    from rawconv.cudnn.graph import autotune as graph_autotune

    real = getattr(cudnn_graph, name)

    def fake(*a, **k):
        raise AssertionError("not called here")

    monkeypatch.setattr(cudnn_graph, name, fake)
    assert getattr(graph_common, name) is fake and graph_autotune._o is graph_common
    monkeypatch.undo()
    assert getattr(graph_common, name) is real


@pytest.mark.parametrize("name", ["CAPTURE_PROBE", "DEFAULT_UNFUSED"])
def test_graph_settings_read_by_the_plan_reach_it_from_the_face(monkeypatch, name):
    """GraphConvolution (in cudnn/graph/plan.py) reads these as its module's globals: set on the face,
    they are what it reads, and no other part holds a copy of its own."""
    from rawconv.cudnn.graph import plan as graph_plan

    monkeypatch.setattr(cudnn_graph, name, False)
    assert vars(graph_plan)[name] is False and getattr(cudnn_graph, name) is False
    assert cudnn_graph.GraphConvolution.has_epilogue.__globals__ is vars(graph_plan)
    assert not hasattr(graph_common, name)
    monkeypatch.undo()
    assert vars(graph_plan)[name] is True


def test_the_faces_hand_on_the_shared_names():
    for name in ("Algorithm", "TimedAlgorithm", "RunInfo", "ALGOS", "MATH_TYPES", "resolve_algo", "environment",
                 "key_options", "normalize_choice", "is_graph_choice"):
        assert getattr(cudnn, name) is getattr(legacy_common, name), name
    for name in ("EngineConfig", "HEURISTIC_MODES", "KNOWN_WRONG", "known_wrong", "torch_epilogue", "environment",
                 "reference"):   # (the last two through the face's module type)
        assert getattr(cudnn_graph, name) is getattr(graph_common, name), name
    from rawconv.cudnn import library

    assert cudnn.info is library.info and cudnn.library_version is library.library_version


@pytest.mark.parametrize("face, name, value", [("onednn", "SLOW_REFERENCE_SECONDS", 3.0),
                                               ("cudnn_graph", "SERIALIZE_RTC", False),
                                               ("cudnn_graph", "environment", lambda *a, **k: {}),
                                               ("cudnn", "gpu_time", lambda *a, **k: 0.0)])
def test_settings_patched_on_a_face_with_unittest_mock_are_restored(face, name, value):
    """``unittest.mock.patch.object`` (as ``monkeypatch.setattr``) on a face setting: set inside
    the block, the value from before again after it, and no error on leaving it."""
    from unittest import mock

    import rawconv

    target = getattr(rawconv, face)
    before = getattr(target, name)
    try:
        with mock.patch.object(target, name, value):
            assert getattr(target, name) is value
    finally:
        restored = getattr(target, name)
        if restored is not before:
            setattr(target, name, before)   # (leave the process as it was for the other tests)
    assert restored is before
