"""Prepacked weights never go stale (issue 13).

Training paths (the function forms, rawconv.ops, rawconv.nn modules in any mode, the fused
function form) read the weights on every call; only an explicit snapshot keeps reordered weights
(``onednn.Convolution(..., prepack=True)``, ``repack``; the modules ``rawconv.nn.convert(...,
fuse=True)`` freezes, ``rawconv.nn.refresh``). Each way a tensor can change behind rawconv's back
(an update through ``.data``, structured pruning, a numpy view, a ``from_numpy`` alias, a write
through its storage, fused Adam / SGD steps, which leave ``_version`` unchanged) is applied to
weights whose changed bytes lie beyond the first 4 KiB, after a warm-up call; every path's output
must then match float64 on the weights as they are now, and the snapshot API must give what it
documents.
"""
from __future__ import annotations

import pytest
import torch

import rawconv.fused as fu
import rawconv.nn as rnn
import rawconv.ops as rops
from rawconv import ArgumentError, ConvProblem, check, onednn

pytestmark = pytest.mark.usefixtures("dnnl")

K, C = 64, 16                        # w (64, 16, 3, 3): 36 KiB of float32; channel 32 starts at 18 KiB


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, C, 8, 8, generator=g)
    w0 = torch.randn(K, C, 3, 3, generator=g)
    b0 = torch.randn(K, generator=g)
    return x, w0, b0


def _assert_f64(y, x, w, b=None, *, act=None):
    """``y`` within rawconv's float64 tolerance of conv(x, w, b, padding=1) (then ``act``)."""
    p = ConvProblem.from_torch(x.detach(), w.detach(), None if b is None else b.detach(), 1, 1)
    ref, ref_abs = check.reference(p, "forward", {"x": x, "w": w, "b": b}, activation=act)
    stats = check.check(p, y, ref, ref_abs)
    assert stats.ok, stats


# ---------------------------------------------------------------------------- ways a tensor changes
def _data_tail_zero(p):
    return lambda: p.data[32:].zero_()


def _structured_prune(p):        # prune output channels through .data (as pruning utilities written by hand do)
    return lambda: p.data.index_fill_(0, torch.tensor([33, 45, 60]), 0.0)


def _numpy_view(p):
    return lambda: p.detach().numpy()[40:].__imul__(-1.0)


def _storage_write(p):
    def change():
        alias = torch.empty(0, dtype=p.dtype).set_(p.untyped_storage())   # its own version counter
        alias[alias.numel() // 2:].mul_(2.0)
    return change


def _fused_optimizer(kind):
    def make(p):
        opt = (torch.optim.Adam([p], lr=0.5, fused=True) if kind == "adam"
               else torch.optim.SGD([p], lr=0.5, momentum=0.9, fused=True))
        g = torch.Generator().manual_seed(7)

        def step():
            grad = torch.zeros_like(p)
            grad[32:] = torch.randn(p[32:].shape, generator=g)    # gradients on the later channels only
            p.grad = grad
            opt.step()
            p.grad = None
        return step
    return make


CHANGES = {
    "w.data[32:].zero_()": _data_tail_zero,
    "structured pruning via .data": _structured_prune,
    "numpy view write": _numpy_view,
    "from_numpy alias write": None,     # made in _param: the array the parameter aliases
    "untyped_storage write": _storage_write,
    "torch.optim.Adam(fused=True)": _fused_optimizer("adam"),
    "torch.optim.SGD(fused=True)": _fused_optimizer("sgd"),
}


def _param(change: str, w0: torch.Tensor):
    """(a Parameter holding w0's values, a callable applying ``change`` to it)."""
    if change == "from_numpy alias write":
        arr = w0.numpy().copy()
        p = torch.nn.Parameter(torch.from_numpy(arr))

        def write():
            arr[40:] = 0.5
        return p, write
    p = torch.nn.Parameter(w0.clone())
    return p, CHANGES[change](p)


# ---------------------------------------------------------------------------- paths that must follow
def _paths(x, p, b):
    """name -> callable giving an output (and the activation its reference needs); every plan or
    module is made here, before the change, and called once (a warm plan) before it."""
    plan = onednn.Convolution(x, p.detach(), b, padding=1)                  # prepack=False: reads w per call
    snap_plan = onednn.Convolution(x, p.detach(), b, padding=1, prepack=True)
    mod = rnn.Conv2d(C, K, 3, padding=1)
    mod.weight, mod.bias = p, torch.nn.Parameter(b.clone())
    pd = p.detach()

    def module(mode):
        def run():
            if mode == "train":
                mod.train()
                return mod(x)
            mod.eval()
            if mode == "eval, no_grad":
                with torch.no_grad():
                    return mod(x)
            with torch.inference_mode():
                return mod(x)
        return run

    def no_grad(f):
        def run():
            with torch.no_grad():
                return f()
        return run

    return {
        "onednn.forward": (lambda: onednn.forward(x, pd, b, padding=1), None),
        "onednn.forward (autograd)": (lambda: onednn.forward(x, p, b, padding=1), None),
        "rawconv.ops.conv": (no_grad(lambda: rops.conv(x, p, b, padding=1)), None),
        "rawconv.ops.conv (autograd)": (lambda: rops.conv(x, p, b, padding=1), None),
        "rawconv.nn.conv (autograd)": (lambda: rnn.conv(x, p, b, padding=1), None),
        "rawconv.fused.conv_bias_act": (no_grad(lambda: fu.conv_bias_act(x, p, b, padding=1)), "relu"),
        "Convolution(x, w).execute(x)": (lambda: plan.execute(x), None),
        "Convolution(prepack=True).execute(x, w)": (lambda: snap_plan.execute(x, pd, b), None),
        "rawconv.nn.Conv2d, train": (module("train"), None),
        "rawconv.nn.Conv2d, eval, no_grad": (module("eval, no_grad"), None),
        "rawconv.nn.Conv2d, inference_mode": (module("inference_mode"), None),
    }


@pytest.mark.parametrize("change", list(CHANGES))
def test_every_training_path_follows_every_kind_of_weight_change(change):
    x, w0, b = _inputs()
    p, apply = _param(change, w0)
    paths = _paths(x, p, b)
    first = onednn.Convolution(x, w0, b, padding=1).selected
    assert "w" in first.reorders, f"{first}: the weights are not reordered, so staleness could not show here"
    for name, (call, act) in paths.items():
        _assert_f64(call(), x, p, b, act=act)                 # warm: plans built, weights reordered once
    before = p.detach().clone()
    apply()
    assert not torch.equal(before, p.detach()), "the change changed nothing"
    assert torch.equal(before[:4], p.detach()[:4]), "the change must leave the first 4 KiB alone"
    for name, (call, act) in paths.items():
        try:
            _assert_f64(call(), x, p, b, act=act)
        except AssertionError as exc:
            raise AssertionError(f"{name} after {change}: {exc}") from None


# ---------------------------------------------------------------------------- the snapshot API
def test_prepack_true_is_a_snapshot_of_the_construction_weights():
    x, w0, b = _inputs(1)
    w = w0.clone()
    plan = onednn.Convolution(x, w, b, padding=1, prepack=True)
    _assert_f64(plan.execute(x), x, w0, b)
    w.data[32:].zero_()
    w.mul_(3.0)                                   # in place, version bumped: still not seen
    _assert_f64(plan.execute(x), x, w0, b)        # the snapshot
    _assert_f64(plan.execute(x, w), x, w, b)      # an explicit w is always read now
    _assert_f64(plan.execute(x), x, w0, b)        # ... and does not replace the snapshot
    plan.repack()                                 # the construction tensor as it is now
    _assert_f64(plan.execute(x), x, w, b)
    w2 = torch.randn(K, C, 3, 3, generator=torch.Generator().manual_seed(5))
    plan.repack(w2)
    _assert_f64(plan.execute(x), x, w2, b)
    w2_then = w2.clone()
    w2.zero_()
    _assert_f64(plan.execute(x), x, w2_then, b)
    with pytest.raises(ArgumentError, match="shape"):
        plan.repack(torch.randn(K, C, 5, 5))


def test_prepack_false_reads_the_construction_weights_on_every_call():
    x, w0, b = _inputs(2)
    w = w0.clone()
    plan = onednn.Convolution(x, w, b, padding=1)
    assert plan.prepack is False
    _assert_f64(plan.execute(x), x, w, b)
    w.data[40:].mul_(-2.0)
    _assert_f64(plan.execute(x), x, w, b)
    plan.repack()                                 # an explicit snapshot from here on
    assert plan.prepack is True
    w.data[40:].zero_()
    _assert_f64(plan.execute(x), x, w0.clone().index_put_((torch.arange(40, K),), w0[40:] * -2.0), b)


def test_a_plan_from_a_problem_needs_weights_and_autotune_leaves_no_snapshot():
    x, w0, b = _inputs(3)
    problem = ConvProblem.from_torch(x, w0, None, 1, 1)
    plan = onednn.Convolution.from_problem(problem, prepack=True)
    with pytest.raises(ArgumentError, match="needs x and w"):
        plan.execute(x)
    plan.autotune(iterations=1, warmup=0, budget_s=0.05)   # times on a temporary snapshot of random weights
    with pytest.raises(ArgumentError, match="needs x and w"):
        plan.execute(x)
    _assert_f64(plan.execute(x, w0), x, w0)
    plan.repack(w0)
    _assert_f64(plan.execute(x), x, w0)


def test_backward_data_snapshot():
    x, w0, _ = _inputs(4)
    problem = ConvProblem.from_torch(x, w0, None, 1, 1)
    dy = torch.randn(problem.y_shape, generator=torch.Generator().manual_seed(9))
    plan = onednn.Convolution.from_problem(problem, direction="backward_data", prepack=True)
    w = w0.clone()
    plan.repack(w)
    want, want_abs = check.reference(problem, "backward_data", {"dy": dy, "w": w0})
    assert check.check(problem, plan.execute(grad_y=dy), want, want_abs, check.tolerance_for(
        problem, "backward_data")).ok
    w.data[32:].zero_()
    assert check.check(problem, plan.execute(grad_y=dy), want, want_abs, check.tolerance_for(
        problem, "backward_data")).ok                       # the snapshot
    now, now_abs = check.reference(problem, "backward_data", {"dy": dy, "w": w})
    assert check.check(problem, plan.execute(grad_y=dy, w=w), now, now_abs, check.tolerance_for(
        problem, "backward_data")).ok
    with pytest.raises(ArgumentError, match="no weights"):
        onednn.Convolution.from_problem(problem, direction="backward_weights").repack()


def _bn_model(seed=0):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Conv2d(C, K, 3, padding=1, bias=False), torch.nn.BatchNorm2d(K),
                            torch.nn.ReLU())
    with torch.no_grad():
        m[1].running_mean.uniform_(-1, 1)
        m[1].running_var.uniform_(0.5, 2)
    return m.eval()


def test_convert_fuse_freezes_and_refresh_repacks():
    x, _, _ = _inputs(5)
    model = rnn.convert(_bn_model(), fuse=True)
    fused = [m for m in model.modules() if fu.frozen(m)]
    assert len(fused) == 1
    m = fused[0]
    bn = m.__dict__[fu.BN_KEY]

    def folded():   # conv then the eval BatchNorm, as the snapshot folds them (in float64, then rounded)
        return fu._fold(m.weight.detach(), None, bn)

    w_then, b_then = folded()
    assert not any("frozen" in k for k in model.state_dict())            # snapshots stay out of state_dict
    with torch.no_grad():
        _assert_f64(model(x), x, w_then, b_then, act="relu")
        m.weight.data[32:].zero_()                      # a write through .data: no version counter sees it
        _assert_f64(model(x), x, w_then, b_then, act="relu")               # frozen: the snapshot
    with torch.inference_mode():
        _assert_f64(model(x), x, w_then, b_then, act="relu")
    y = model(x)                                                           # autograd through the parameters
    assert y.requires_grad
    _assert_f64(y, x, *folded(), act="relu")                               # reads them as they are
    assert rnn.refresh(model) is model
    with torch.no_grad():
        _assert_f64(model(x), x, *folded(), act="relu")                    # the new snapshot
    model.load_state_dict({k: v * 0.5 if v.is_floating_point() else v for k, v in model.state_dict().items()})
    with torch.no_grad():
        _assert_f64(model(x), x, *folded(), act="relu")                    # seen without refresh (versions)
        m.weight.mul_(-1.0)
        _assert_f64(model(x), x, *folded(), act="relu")


def test_frozen_layers_of_the_same_shape_keep_their_own_snapshots():
    x, _, _ = _inputs(6)
    torch.manual_seed(6)
    seq = torch.nn.Sequential(torch.nn.Conv2d(C, C, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Conv2d(C, C, 3, padding=1), torch.nn.ReLU()).eval()
    model = rnn.convert(seq, fuse=True)
    mods = [m for m in model.modules() if fu.frozen(m)]
    assert len(mods) == 2
    with torch.no_grad():
        ref = torch.relu(torch.nn.functional.conv2d(x.double(), mods[0].weight.double(), mods[0].bias.double(), 1, 1))
        ref = torch.relu(torch.nn.functional.conv2d(ref, mods[1].weight.double(), mods[1].bias.double(), 1, 1))
        for _ in range(3):
            y = model(x)
            assert (y.double() - ref).abs().max() <= 1e-4 * ref.abs().max()
    plans = [list(m.__dict__[fu._FROZEN_PLANS].values()) for m in mods]
    assert all(len(p) == 1 for p in plans) and plans[0][0] is not plans[1][0]
    for m, (plan,) in zip(mods, plans):
        assert plan._snap[0] is m._buffers[fu.FROZEN_WEIGHT]


def test_frozen_module_copies_and_moves_keep_their_snapshot():
    import copy
    import pickle

    x, _, _ = _inputs(7)
    model = rnn.convert(_bn_model(1), fuse=True)
    with torch.no_grad():
        y = model(x)
        for other in (copy.deepcopy(model), pickle.loads(pickle.dumps(model)), model.to(torch.float32)):
            torch.testing.assert_close(other(x), y, rtol=0, atol=0)
