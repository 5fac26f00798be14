"""rawconv's modules and operators behave as torch.nn's where PyTorch's own convolution tests
(``test/nn/test_convolution.py``, run through ``tools/run_torch_conv_tests.py``) exercise them:

* an invalid ``output_size`` on ``ConvTranspose1d/2d/3d`` raises torch's ``ValueError`` (it was
  rawconv's InternalError, "please report");
* bad shapes raise :class:`ArgumentError`, which is also the ``RuntimeError`` torch code catches,
  with torch's words in the message;
* the output's memory format is torch's: channels_last when x **or** w is (an NCHW x with a
  channels_last weight gave NCHW), for y and the gradients, and the fake kernels say the same;
* zero input channels (C=0: y is the bias) run, as in torch, instead of being refused.
"""
from __future__ import annotations

import itertools
import re

import pytest
import torch
import torch.nn.functional as F

import rawconv.nn as rnn
import rawconv.ops as ops
from rawconv.errors import ArgumentError, InternalError, RawconvError, TorchFallbackWarning

pytestmark = pytest.mark.usefixtures("dnnl")

F_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
F_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
CL = {2: torch.channels_last, 3: torch.channels_last_3d}


def _cl(t: torch.Tensor) -> torch.Tensor:
    """``t`` channels last (NWC for a 3-D tensor)."""
    if t.dim() == 3:
        return t.transpose(1, 2).contiguous().transpose(1, 2)
    return t.contiguous(memory_format=torch.channels_last if t.dim() == 4 else torch.channels_last_3d)


def _fmt(t: torch.Tensor) -> str:
    """"cl", "contig", "both" (a shape where the two coincide) or "other"."""
    if t.dim() == 3:
        a, b = t.is_contiguous(), t.transpose(1, 2).is_contiguous()
    else:
        a, b = t.is_contiguous(), t.is_contiguous(memory_format=torch.channels_last if t.dim() == 4
                                                  else torch.channels_last_3d)
    return "both" if a and b else "contig" if a else "cl" if b else "other"


def _same_fmt(a: torch.Tensor, b: torch.Tensor) -> bool:
    fa, fb = _fmt(a), _fmt(b)
    return fa == fb or "both" in (fa, fb)


# ---------------------------------------------------------------------------- 1. output_size
@pytest.mark.parametrize("nd", [1, 2, 3])
def test_conv_transpose_invalid_output_size_raises_torchs_value_error(nd):
    """torch's ConvTransposeNd raises ValueError for an output_size no output_padding reaches (and
    one of the wrong length); rawconv's raised InternalError ("please report"), a RuntimeError."""
    torch.manual_seed(0)
    m = rnn.ConvTranspose1d if nd == 1 else rnn.ConvTranspose2d if nd == 2 else rnn.ConvTranspose3d
    mod = m(3, 4, 3, stride=3, padding=0, dilation=2)
    ref = getattr(torch.nn, f"ConvTranspose{nd}d")(3, 4, 3, stride=3, padding=0, dilation=2)
    ref.load_state_dict(mod.state_dict())
    x = torch.randn(2, 3, *[4] * nd)
    for bad in ((12,) * nd, (25,) * nd, (1,) * (nd + 3)):
        with pytest.raises(ValueError) as info:   # what torch's own module raises for it
            ref(x, output_size=bad)
        with pytest.raises(ValueError) as got:
            mod(x, output_size=bad)
        assert isinstance(got.value, ArgumentError) and not isinstance(got.value, InternalError)
        assert str(info.value) in str(got.value)   # torch's own message, as torch words it
    for good in ((14,) * nd, (16,) * nd, (2, 4) + (15,) * nd):
        y = mod(x, output_size=good)
        want = ref(x, output_size=good)
        assert y.shape == want.shape
        torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------- 2. error classes
BAD_SHAPES = [   # (module, input): torch raises RuntimeError for each
    ("kernel larger than input 1d", lambda: (torch.nn.Conv1d, (3, 33, 10)), (1, 3, 4),
     r"Calculated padded input size per channel: \(4\). Kernel size: \(10\). Kernel size can't be greater"),
    ("kernel larger than input 2d dilated", lambda: (torch.nn.Conv2d, (1, 1, 3), dict(dilation=2, stride=2)),
     (1, 1, 4, 4), r"Calculated padded input size per channel: \(4 x 4\). Kernel size: \(5 x 5\)"),
    ("kernel larger than input 3d", lambda: (torch.nn.Conv3d, (1, 1, 3)), (3, 1, 2, 2, 2),
     r"Kernel size can't be greater than actual input size"),
    ("channels", lambda: (torch.nn.Conv2d, (3, 4, 3)), (2, 5, 8, 8), r"Given groups=1, weight"),
    ("rank", lambda: (torch.nn.Conv2d, (3, 4, 3)), (1, 3, 1, 8, 8),
     r"Expected 3D \(unbatched\) or 4D \(batched\) input to conv2d"),
    ("negative stride", lambda: (torch.nn.Conv1d, (3, 6, 3), dict(stride=-1)), (1, 3, 4),
     r"non-positive stride is not supported"),
    ("zero stride", lambda: (torch.nn.Conv2d, (3, 6, 4), dict(stride=0)), (1, 3, 4, 4),
     r"non-positive stride is not supported"),
    ("transposed rank", lambda: (torch.nn.ConvTranspose2d, (3, 8, 3)), (2, 2, 2, 2, 2), None),
]


@pytest.mark.parametrize("case", BAD_SHAPES, ids=[c[0] for c in BAD_SHAPES])
def test_bad_shapes_raise_the_runtime_error_torch_code_catches(case):
    """Code written for torch catches RuntimeError (torch's test file: ``assertRaises(RuntimeError)``,
    with a message regex): rawconv's ArgumentError is one now, still a ValueError, with torch's words."""
    _, make, x_shape, pattern = case
    spec = make()
    cls, args = spec[0], spec[1]
    kw = spec[2] if len(spec) > 2 else {}
    torch_mod = cls(*args, **kw)
    mod = getattr(rnn, cls.__name__)(*args, **kw)
    x = torch.randn(x_shape)
    with pytest.raises(RuntimeError, match=pattern) as want:
        torch_mod(x)
    with pytest.raises(RuntimeError, match=pattern) as got:
        mod(x)
    assert isinstance(got.value, ArgumentError) and isinstance(got.value, ValueError), type(got.value)
    assert type(want.value) is RuntimeError


def test_argument_error_is_both_value_error_and_runtime_error():
    assert issubclass(ArgumentError, ValueError) and issubclass(ArgumentError, RuntimeError)
    assert issubclass(ArgumentError, RawconvError)
    with pytest.raises(RuntimeError):
        ops.conv(torch.randn(1, 3, 2, 2), torch.randn(4, 3, 3, 3))
    with pytest.raises(ValueError):
        ops.conv(torch.randn(1, 3, 2, 2), torch.randn(4, 3, 3, 3))


# ---------------------------------------------------------------------------- 3. memory formats
def test_suggests_channels_last_is_torchs_rule():
    """suggests_channels_last agrees with torch's suggest_memory_format, seen through F.conv2d with
    an NCHW weight (its output is channels_last exactly when x suggests it), on permuted, sliced,
    size-1 and ambiguous tensors."""
    from rawconv.problem import suggests_channels_last

    w2, w3 = torch.randn(2, 3, 1, 1), torch.randn(2, 3, 1, 1, 1)
    shapes = [(2, 3, 4, 5), (1, 3, 1, 1), (2, 3, 1, 1), (1, 3, 4, 1), (2, 3, 1, 5), (4, 3, 2, 2)]
    seen = set()
    for shape in shapes:
        for perm in itertools.permutations(range(4)):
            base = torch.randn([shape[p] for p in perm]).permute([perm.index(i) for i in range(4)])
            sliced = torch.randn([shape[p] * (2 if p == 1 else 1) for p in perm]).permute(
                [perm.index(i) for i in range(4)])[:, ::2]   # not dense
            for t in (base, sliced):
                if t.shape[1] != 3:
                    continue
                y = F.conv2d(t, w2)
                want = y.is_contiguous(memory_format=torch.channels_last) and not y.is_contiguous()
                if y.is_contiguous() and y.is_contiguous(memory_format=torch.channels_last):
                    continue   # y's own shape cannot tell
                assert suggests_channels_last(t) == want, (tuple(t.shape), t.stride())
                seen.add(want)
    assert seen == {True, False}
    for perm in itertools.permutations(range(5)):
        t = torch.randn([(2, 3, 4, 5, 6)[p] for p in perm]).permute([perm.index(i) for i in range(5)])
        y = F.conv3d(t, w3)
        assert suggests_channels_last(t) == (not y.is_contiguous()), (tuple(t.shape), t.stride())
    assert not suggests_channels_last(torch.randn(2, 3, 5).transpose(1, 2).contiguous().transpose(1, 2))
    assert not suggests_channels_last(torch.empty(1).expand(2, 3, 4, 4))   # zero strides: NCHW


LAYOUT_CASES = [(nd, xc, wc) for nd in (1, 2, 3) for xc in (False, True) for wc in (False, True)]


@pytest.mark.parametrize("nd,x_cl,w_cl", LAYOUT_CASES,
                         ids=[f"{nd}d-x{'CL' if xc else 'C'}-w{'CL' if wc else 'C'}" for nd, xc, wc in LAYOUT_CASES])
@pytest.mark.parametrize("transposed", [False, True], ids=["conv", "transposed"])
def test_output_and_gradient_layouts_are_torchs(nd, x_cl, w_cl, transposed):
    """y, dx and dw (torch.autograd.grad, which returns them as computed) have torch's memory
    format and values: channels_last when x or w is (1-D: when w is), where rawconv followed x
    alone (an NCHW x with a channels_last weight gave an NCHW y)."""
    torch.manual_seed(0)
    x = torch.randn(2, 4, *[6] * nd)
    w = torch.randn(4, 5, *[3] * nd) if transposed else torch.randn(5, 4, *[3] * nd)
    b = torch.randn(5)
    x, w = (_cl(x) if x_cl else x), (_cl(w) if w_cl else w)
    outs = []
    for fn in ((F_T[nd], ops.conv_transpose) if transposed else (F_CONV[nd], ops.conv)):
        xr, wr, br = (t.detach().clone().requires_grad_() for t in (x, w, b))   # clone keeps the format
        y = fn(xr, wr, br, padding=1)
        gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(1))
        dx, dw, db = torch.autograd.grad(y, (xr, wr, br), gy)
        outs.append((y, dx, dw, db))
    for name, want, got in zip(("y", "dx", "dw", "db"), *outs):
        assert _same_fmt(got, want), f"{name}: rawconv {_fmt(got)}, torch {_fmt(want)}"
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


UNBATCHED_CASES = [(nd, tr, api) for nd in (1, 2, 3) for tr in (False, True) for api in ("module", "function")]


@pytest.mark.parametrize("nd,transposed,api", UNBATCHED_CASES,
                         ids=[f"{nd}d-{'T' if tr else 'C'}-{api}" for nd, tr, api in UNBATCHED_CASES])
def test_unbatched_input_with_a_channels_last_weight_gives_torchs_gradient_layouts(nd, transposed, api):
    """An unbatched x (C, *spatial) with a channels-last w: torch lays y, dx and dw out as its
    forward (x.unsqueeze(0) and w), so dw is channels last; the backward-weights operator, which
    sees x and grad_y alone, gave a contiguous dw. Values against torch's float64. (3-D: groups=2
    keeps torch's CPU on oneDNN; its native Slow3d path, for small ungrouped batch-1 3-D problems,
    lays everything out contiguous, see docs/guides/operators.md.)"""
    torch.manual_seed(0)
    groups = 2 if nd == 3 else 1
    x = torch.randn(4, *[6] * nd)
    w = _cl(torch.randn(4, 6 // groups, *[3] * nd) if transposed else torch.randn(6, 4 // groups, *[3] * nd))
    b = torch.randn(6)
    mods = {(False, 1): (torch.nn.Conv1d, rnn.Conv1d), (False, 2): (torch.nn.Conv2d, rnn.Conv2d),
            (False, 3): (torch.nn.Conv3d, rnn.Conv3d), (True, 1): (torch.nn.ConvTranspose1d, rnn.ConvTranspose1d),
            (True, 2): (torch.nn.ConvTranspose2d, rnn.ConvTranspose2d),
            (True, 3): (torch.nn.ConvTranspose3d, rnn.ConvTranspose3d)}[transposed, nd]
    outs = []
    for i, dtype in enumerate((torch.float32, torch.float32, torch.float64)):
        xr, wr, br = (t.detach().clone().to(dtype).requires_grad_() for t in (x, w, b))   # clone keeps formats
        if i == 1 and api == "function":
            fn = ops.conv_transpose if transposed else ops.conv
            y = fn(xr, wr, br, padding=1, groups=groups)
        elif i == 1:
            m = mods[1](4, 6, 3, padding=1, groups=groups, dtype=dtype)
            m.weight, m.bias = torch.nn.Parameter(wr), torch.nn.Parameter(br)
            xr, wr, br = xr, m.weight, m.bias
            y = m(xr)
        else:
            y = (F_T if transposed else F_CONV)[nd](xr, wr, br, padding=1, groups=groups)
        gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(dtype)
        outs.append((y,) + torch.autograd.grad(y, (xr, wr, br), gy))
    (torch_f32, got, ref) = outs
    for name, want, g, r in zip(("y", "dx", "dw", "db"), torch_f32, got, ref):
        assert _same_fmt(g, want), f"{name}: rawconv {_fmt(g)} {g.stride()}, torch {_fmt(want)} {want.stride()}"
        torch.testing.assert_close(g.double(), r, rtol=1e-4, atol=1e-4)


EMPTY_CASES = [(nd, tr, xc, wc) for nd in (1, 2, 3) for tr in (False, True) for xc in (False, True)
               for wc in (False, True)]


@pytest.mark.parametrize("nd,transposed,x_cl,w_cl", EMPTY_CASES,
                         ids=[f"{nd}d-{'T' if tr else 'C'}-x{'CL' if xc else 'C'}-w{'CL' if wc else 'C'}"
                              for nd, tr, xc, wc in EMPTY_CASES])
def test_an_empty_batch_gives_torchs_strides_and_zero_gradients(nd, transposed, x_cl, w_cl):
    """N = 0: torch runs no library (ConvBackend::Empty): y is contiguous, dx and dw are
    zeros_like(x) and zeros_like(w), in their own strides. rawconv followed the channels-last rule
    for y and the operators' rules for dx and dw (empty tensors: only the strides tell)."""
    x = torch.randn(0, 4, *[6] * nd)
    w = torch.randn(4, 6, *[3] * nd) if transposed else torch.randn(6, 4, *[3] * nd)
    x, w = (_cl(x) if x_cl else x), (_cl(w) if w_cl else w)
    b = torch.randn(6)
    outs = []
    for fn in ((F_T[nd], ops.conv_transpose) if transposed else (F_CONV[nd], ops.conv)):
        xr, wr, br = (t.detach().clone().requires_grad_() for t in (x, w, b))   # clone keeps the format
        y = fn(xr, wr, br, padding=1)
        outs.append((y,) + torch.autograd.grad(y.sum(), (xr, wr, br)))
    (y0, dx0, dw0, db0), (y1, dx1, dw1, db1) = outs
    assert y1.shape == y0.shape and y1.stride() == y0.stride(), (y1.stride(), y0.stride())
    assert dx1.shape == dx0.shape and dx1.stride() == dx0.stride(), (dx1.stride(), dx0.stride())
    assert dw1.stride() == dw0.stride() and not dw1.any() and not db1.any(), (dw1.stride(), dw0.stride())


@pytest.mark.parametrize("nd", [1, 2])
@pytest.mark.parametrize("transposed", [False, True], ids=["conv", "transposed"])
def test_an_empty_batch_double_backward_has_a_graph(nd, transposed):
    """A gradient penalty on an empty batch (create_graph=True): dx and dw carry a graph, as torch's
    (they were plain tensors: the second grad raised "does not require grad"); second-order
    gradients are zero (torch's are None: unused)."""
    x = _cl(torch.randn(0, 4, *[7] * nd)).requires_grad_() if nd == 2 else torch.randn(0, 4, 7, requires_grad=True)
    w = (torch.randn(4, 6, *[3] * nd) if transposed else torch.randn(6, 4, *[3] * nd)).requires_grad_()
    y = (ops.conv_transpose if transposed else ops.conv)(x, w, None, padding=1)
    dx, dw = torch.autograd.grad(y, [x, w], torch.randn_like(y), create_graph=True)
    assert dx.grad_fn is not None and dw.grad_fn is not None and dx.stride() == x.stride()
    g = torch.autograd.grad((dx ** 2).sum() + (dw ** 2).sum(), [x, w], allow_unused=True)
    assert all(t is None or not t.any() for t in g)


@pytest.mark.parametrize("nd", [2, 3])
def test_modules_with_a_channels_last_weight_give_channels_last(nd):
    """torch's test_conv_thnn_nhwc: an NCHW input (one channel: ambiguous too) with a channels_last
    weight gives a channels_last output; leaf gradients keep their tensors' formats."""
    m = rnn.Conv2d(1, 8, 3) if nd == 2 else rnn.Conv3d(1, 8, 3)
    ref = torch.nn.Conv2d(1, 8, 3) if nd == 2 else torch.nn.Conv3d(1, 8, 3)
    ref.load_state_dict(m.state_dict())
    m = m.to(memory_format=CL[nd])
    x = torch.randn(2, 1, *[10] * nd, requires_grad=True)
    y = m(x)
    assert y.is_contiguous(memory_format=CL[nd]) and not y.is_contiguous()
    torch.testing.assert_close(y, ref(x), rtol=1e-4, atol=1e-5)
    y.backward(torch.ones_like(y))
    assert m.weight.grad.is_contiguous(memory_format=CL[nd])


def test_fake_kernels_give_the_real_kernels_strides_for_every_format():
    """Under FakeTensorMode the three operators' outputs have the real kernels' strides for each
    (x, w, grad_y) format combination, 1-D to 3-D (torch.compile traces with them)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    fwd, bwd_d, bwd_w = (torch.ops.rawconv.conv_forward.default, torch.ops.rawconv.conv_backward_data.default,
                         torch.ops.rawconv.conv_backward_weights.default)
    cases = []
    for nd, xc, wc, gc in itertools.product((1, 2, 3), (0, 1), (0, 1), (0, 1)):
        x = torch.randn(2, 4, *[5] * nd)
        w = torch.randn(6, 4, *[3] * nd)
        x, w = (_cl(x) if xc else x), (_cl(w) if wc else w)
        a = ([1] * nd, [1] * nd, [1] * nd, [1] * nd, 1)
        y = fwd(x, w, None, *a, "auto", "", "strict", "", "")
        gy = _cl(torch.randn(y.shape)) if gc else torch.randn(y.shape)
        dx = bwd_d(gy, w, list(x.shape), *a, "auto", "", "strict")
        dw, _ = bwd_w(x, gy, list(w.shape), *a, False, "auto", "", "strict")
        cases.append((x, w, gy, a, (y, dx, dw)))
    with FakeTensorMode() as mode:
        for x, w, gy, a, reals in cases:
            fx, fw, fgy = mode.from_tensor(x), mode.from_tensor(w), mode.from_tensor(gy)
            fakes = (fwd(fx, fw, None, *a, "auto", "", "strict", "", ""),
                     bwd_d(fgy, fw, list(x.shape), *a, "auto", "", "strict"),
                     bwd_w(fx, fgy, list(w.shape), *a, False, "auto", "", "strict")[0])
            for name, real, fake in zip(("y", "dx", "dw"), reals, fakes):
                assert (fake.shape, fake.stride()) == (real.shape, real.stride()), \
                    (name, tuple(x.shape), x.stride(), w.stride(), gy.stride())


def test_compiled_conv_with_a_channels_last_weight_matches_eager():
    """torch.compile (aot_eager, fullgraph) of ops.conv with an NCHW x and a channels_last w: the
    fake kernel's layout is the real one's, so the compiled result and gradients equal eager's."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    w = torch.randn(4, 3, 3, 3).to(memory_format=torch.channels_last).requires_grad_()

    def f(x, w):
        return ops.conv(x, w, padding=1)

    y = f(x, w)
    gx, gw = torch.autograd.grad(y.square().sum(), (x, w))
    torch._dynamo.reset()
    cf = torch.compile(f, fullgraph=True, backend="aot_eager")
    yc = cf(x, w)
    assert yc.is_contiguous(memory_format=torch.channels_last)
    cgx, cgw = torch.autograd.grad(yc.square().sum(), (x, w))
    torch.testing.assert_close(yc, y)
    torch.testing.assert_close(cgx, gx)
    torch.testing.assert_close(cgw, gw)


# ---------------------------------------------------------------------------- 4. zero input channels
ZERO_C = [(1, (2, 0, 15), (8, 0, 2), dict(stride=2), 1), (2, (2, 0, 9, 10), (6, 0, 3, 3), dict(padding=1), 1),
          (2, (3, 0, 5, 5), (4, 0, 3, 3), {}, 2), (3, (2, 0, 4, 5, 6), (8, 0, 1, 2, 3), dict(stride=2), 4)]


@pytest.mark.parametrize("case", ZERO_C, ids=[f"{c[0]}d-g{c[4]}" for c in ZERO_C])
def test_zero_input_channels_give_the_bias(case):
    """A convolution over zero input channels: y = bias over (N, K, *out) (zeros without bias), dx
    empty, dw zeros, db = grad_y summed: what the sum over no channels is. It was refused."""
    nd, xs, ws, kw, g = case
    torch.manual_seed(0)
    x = torch.randn(xs, requires_grad=True)
    w = torch.randn(ws, requires_grad=True)
    b = torch.randn(ws[0], requires_grad=True)
    want_shape = F_CONV[nd](torch.randn(xs[0], g, *xs[2:]), torch.randn(ws[0], 1, *ws[2:]), None, groups=g,
                            **kw).shape
    y = ops.conv(x, w, b, groups=g, **kw)
    assert y.shape == want_shape
    torch.testing.assert_close(y, b.detach().view(1, -1, *[1] * nd).expand(want_shape))
    assert torch.count_nonzero(ops.conv(x.detach(), w.detach(), None, groups=g, **kw)) == 0
    gy = torch.randn(y.shape)
    dx, dw, db = torch.autograd.grad(y, (x, w, b), gy)
    assert dx.shape == x.shape and dw.shape == w.shape and torch.count_nonzero(dw) == 0
    torch.testing.assert_close(db, gy.sum([0] + list(range(2, gy.dim()))))


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_zero_in_channels_modules_run_and_other_channel_counts_still_raise(nd):
    """torch's test_conv_empty_channel: ConvNd(0, K, ...) runs on an (N, 0, ...) input as torch's own
    module does (the module runs torch's kernel: rawconv.pytorch.fallback); an input of another channel
    count raises the RuntimeError torch raises ("Given groups=1, weight"). A pinned choice runs
    rawconv's own zero-channel convolution: y is the bias."""
    from rawconv.pytorch import fallback

    fallback.reset()   # (said once per reason and process)
    cls = getattr(rnn, f"Conv{nd}d")
    mod = cls(0, 8, 2, stride=2)
    ref = getattr(torch.nn, f"Conv{nd}d")(0, 8, 2, stride=2)
    ref.load_state_dict(mod.state_dict())
    inp = torch.randn(2, 0, *[9] * nd, requires_grad=True)
    with pytest.warns(TorchFallbackWarning, match="in_channels=0"):
        y = mod(inp)
    assert y.shape == ref(inp).shape
    y.sum().backward()
    assert inp.grad.shape == inp.shape
    with pytest.raises(RuntimeError, match="Given groups=1, weight"):
        mod(torch.randn(2, 1, *[9] * nd))
    pinned = cls(0, 8, 2, stride=2, choice="x64:gemm:jit")
    y = pinned(inp)
    assert y.shape == (2, 8) + (4,) * nd
    torch.testing.assert_close(y, pinned.bias.detach().view(1, -1, *[1] * nd).expand(y.shape))


def test_zero_output_channels_are_refused_as_in_torch():
    with pytest.raises(RuntimeError, match="expected weight to be at least 1 at dimension 0"):
        F.conv2d(torch.randn(1, 3, 5, 5), torch.randn(0, 3, 3, 3))
    with pytest.raises(ArgumentError, match="expected weight to be at least 1 at dimension 0"):
        ops.conv(torch.randn(1, 3, 5, 5), torch.randn(0, 3, 3, 3))


def test_zero_input_channels_fake_kernel_and_compile():
    """The fake kernel gives (N, K, *out) for C=0 too, and a compiled call equals eager."""
    x, w, b = torch.randn(2, 0, 7, 7), torch.randn(4, 0, 3, 3), torch.randn(4)

    def f(x, w, b):
        return ops.conv(x, w, b, padding=1)

    torch._dynamo.reset()
    y = torch.compile(f, fullgraph=True, backend="aot_eager")(x, w, b)
    assert y.shape == (2, 4, 7, 7)
    torch.testing.assert_close(y, f(x, w, b))


# ---------------------------------------------------------------------------- GPU (the lead runs these)
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
@pytest.mark.parametrize("nd,x_cl,w_cl", LAYOUT_CASES)
@pytest.mark.parametrize("backend", ["cudnn", "cudnn_graph"])
def test_cuda_output_layout_is_torchs(nd, x_cl, w_cl, dtype, backend):
    """cuDNN's rule (cudnn_conv_suggest_memory_format): channels_last when x or w is, never for
    float64; rawconv's y and gradients have torch's format and values."""
    if backend == "cudnn_graph" and dtype == torch.float64:
        pytest.skip("graph engines for float64 are few; the legacy API covers it")
    torch.manual_seed(0)
    x = torch.randn(2, 8, *[6] * nd, device="cuda", dtype=dtype)
    w = torch.randn(8, 8, *[3] * nd, device="cuda", dtype=dtype)
    x, w = (_cl(x) if x_cl else x), (_cl(w) if w_cl else w)
    outs = []
    for fn in (lambda a, b: F_CONV[nd](a, b, padding=1),
               lambda a, b: ops.conv(a, b, padding=1, backend=backend)):
        xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            y = fn(xr, wr)
            dx, dw = torch.autograd.grad(y, (xr, wr), torch.ones_like(y))
        outs.append((y, dx, dw))
    tol = dict(rtol=1e-2, atol=1e-2) if dtype == torch.float16 else dict(rtol=1e-4, atol=1e-4)
    for name, want, got in zip(("y", "dx", "dw"), *outs):
        assert _same_fmt(got, want), f"{name}: rawconv {_fmt(got)}, torch {_fmt(want)}"
        torch.testing.assert_close(got, want, **tol)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cudnn", "cudnn_graph"])
def test_cuda_zero_input_channels_give_the_bias(backend):
    x = torch.randn(2, 0, 9, 9, device="cuda", requires_grad=True)
    w = torch.randn(6, 0, 3, 3, device="cuda", requires_grad=True)
    b = torch.randn(6, device="cuda", requires_grad=True)
    y = ops.conv(x, w, b, padding=1, backend=backend)
    assert y.shape == (2, 6, 9, 9)
    torch.testing.assert_close(y, b.detach().view(1, -1, 1, 1).expand(y.shape))
    gy = torch.randn_like(y)
    dx, dw, db = torch.autograd.grad(y, (x, w, b), gy)
    assert dx.shape == x.shape and torch.count_nonzero(dw) == 0
    torch.testing.assert_close(db, gy.sum([0, 2, 3]))
    from rawconv.pytorch import fallback

    fallback.reset()   # (said once per reason and process)
    m = rnn.Conv1d(0, 4, 2).cuda()   # a module with in_channels=0 runs torch's own kernel (as on the CPU:
    t = torch.nn.Conv1d(0, 4, 2).cuda()   # test_dropin): its answer, torch's Empty backend's, is kept
    t.load_state_dict(m.state_dict())
    xm = torch.randn(3, 0, 5, device="cuda")
    with pytest.warns(TorchFallbackWarning, match="in_channels=0"):
        y = m(xm)
    assert y.shape == t(xm).shape
    torch.testing.assert_close(y, t(xm))


@pytest.mark.gpu
def test_cuda_transposed_output_size_raises_value_error():
    m = rnn.ConvTranspose2d(3, 4, 3, 3, 0, 2).cuda()
    with pytest.raises(ValueError, match="requested an output size"):
        m(torch.randn(2, 3, 6, 6, device="cuda"), output_size=(15, 15))
    assert m(torch.randn(2, 3, 6, 6, device="cuda"), output_size=(19, 20)).shape == (2, 4, 19, 20)


def test_messages_keep_rawconvs_detail_after_torchs_words():
    """The torch wording leads; rawconv's own explanation (which dim, which argument) follows."""
    with pytest.raises(ArgumentError) as info:
        ops.conv(torch.randn(1, 3, 4, 2), torch.randn(4, 3, 3, 3))
    text = str(info.value)
    assert re.search(r"Kernel size can't be greater than actual input size", text)
    assert "spatial dim 1: padded input size 2 is smaller than the dilated kernel size 3" in text
