"""``rawconv.nn`` (``rawconv/pytorch/nn.py``) only hands names on; the code lives in its parts
(``functional``, ``search``, ``modules``, ``report``, ``convert``, ``describe``). A setting or hook a
user or a test sets on the face (``rawconv.nn.VERSUS_TORCH = False``, ``monkeypatch.setattr(rnn,
"_tune_one", f)``) must reach the part that reads it, and a saved model must still name its classes
``rawconv.pytorch.nn.X``. CPU only."""
from __future__ import annotations

import io
import pickle

import torch
from torch import nn

import rawconv.nn as rnn
from conftest import face_routing_tests

PARTS = ("functional", "search", "modules", "report", "convert", "describe")


# the face's two routing tests, written once in conftest (as for the other split faces)
(test_a_name_set_on_the_face_is_set_in_the_part_that_reads_it,
 test_no_other_part_holds_its_own_binding_of_a_setting) = face_routing_tests(
    {rnn: tuple(f"rawconv.pytorch.{p}" for p in PARTS)})


def test_search_hooks_patched_on_the_face_are_the_ones_convert_calls(monkeypatch):
    """convert(autotune=x) in training mode: the per-call search (_tune_call), each backend's search
    of one problem (_tune_one) and of one backward direction (_search_direction), each patched on
    the face, are the functions called; the converted model computes as torch does in float64."""
    rnn.clear_tuning()
    called = {}
    for name in ("_tune_call", "_tune_one", "_search_direction"):
        real = getattr(rnn, name)

        def spy(*a, _real=real, _name=name, **k):
            called[_name] = called.get(_name, 0) + 1
            return _real(*a, **k)
        monkeypatch.setattr(rnn, name, spy)
    torch.manual_seed(3)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 3)).train()
    x = torch.randn(2, 3, 8, 8)
    m = rnn.convert(net, autotune=x, autotune_budget_s=0.02)
    assert set(called) == {"_tune_call", "_tune_one", "_search_direction"}, called
    assert called["_tune_call"] == 2 and called["_search_direction"] == 4   # two problems, two backward each
    with torch.no_grad():
        want = net.double()(x.double())
        got = m(x)
    assert torch.allclose(got.double(), want, rtol=1e-4, atol=1e-4)
    rnn.clear_tuning()


def test_use_ops_set_on_the_face_reaches_the_modules_and_the_functions(monkeypatch):
    """USE_OPS lives in ``functional``; the modules read it there: off, both run this package's own
    autograd function instead of the torch.library operator."""
    torch.manual_seed(0)
    m = rnn.Conv2d(3, 4, 3)
    x = torch.randn(1, 3, 6, 6, requires_grad=True)
    assert type(m(x).grad_fn).__name__ != "_ConvBackward"
    monkeypatch.setattr(rnn, "USE_OPS", False)
    assert type(m(x).grad_fn).__name__ == "_ConvBackward"
    assert type(rnn.conv(x, m.weight).grad_fn).__name__ == "_ConvBackward"
    want = torch.nn.functional.conv2d(x.double(), m.weight.double(), m.bias.double())
    assert torch.allclose(m(x).double(), want, rtol=1e-5, atol=1e-5)


def test_autocasting_set_on_the_face_is_what_the_modules_ask(monkeypatch):
    """The fused module's forward asks whether autocast is on (its eager path) where the face set it."""
    asked = []
    real = rnn._autocasting
    monkeypatch.setattr(rnn, "_autocasting", lambda: asked.append(1) or real())
    torch.manual_seed(2)
    m = rnn.ConvBiasAct2d(3, 4, 3, activation="relu")
    x = torch.randn(1, 3, 6, 6)
    with torch.no_grad():
        y = m(x)
        want = torch.relu(torch.nn.functional.conv2d(x.double(), m.weight.double(), m.bias.double()))
    assert asked
    assert torch.allclose(y.double(), want, rtol=1e-5, atol=1e-5)


def test_a_converted_model_saved_names_its_classes_on_the_face_and_loads():
    """torch.save pickles classes by path: the moved classes (modules, the fused Sequential, the
    pinned TunedChoice) keep ``rawconv.pytorch.nn``, the path models saved before the split name."""
    rnn.clear_tuning()
    torch.manual_seed(1)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3)).eval()
    x = torch.randn(2, 3, 8, 8)
    m = rnn.convert(net, fuse=True, autotune=x, autotune_budget_s=0.02)
    for cls in (rnn.Conv2d, rnn.ConvTranspose2d, rnn.ConvBiasAct2d, rnn._FusedSequential, rnn.TunedChoice,
                rnn.ConvertReport):
        assert cls.__module__ == "rawconv.pytorch.nn" and getattr(rnn, cls.__qualname__) is cls
    raw = pickle.dumps(m)
    assert b"rawconv.pytorch.nn" in raw
    for part in PARTS:
        assert f"rawconv.pytorch.{part}".encode() not in raw, part
    buf = io.BytesIO()
    torch.save(m, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=False)
    with torch.no_grad():
        assert torch.equal(back(x), m(x))
        want = net.double()(x.double())
    assert torch.allclose(back(x).double(), want, rtol=1e-4, atol=1e-4)
    assert rnn.pinned_choices(back) == rnn.pinned_choices(m)
    rnn.clear_tuning()


def test_a_setting_patched_with_unittest_mock_is_restored():
    """``unittest.mock.patch.object(rawconv.nn, "VERSUS_TORCH", False)``: set in the part inside the
    block, the value from before again after it."""
    from unittest import mock

    from rawconv.pytorch import search

    before = rnn.VERSUS_TORCH
    with mock.patch.object(rnn, "VERSUS_TORCH", not before):
        assert search.VERSUS_TORCH is (not before)
    assert search.VERSUS_TORCH is before and rnn.VERSUS_TORCH is before
