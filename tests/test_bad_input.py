"""The bad-input table (issue 13): every row is an input to a public entry point, the rawconv
exception class it must raise, and words its message must contain.

Every exception must be a :class:`rawconv.RawconvError` (and the builtin its class derives from:
``ArgumentError`` is a ``ValueError``, ``AllocationError`` a ``MemoryError``...). Rows marked
``before_c`` run with the native libraries made unreachable (``rawconv.onednn._ffi.lib`` and
``rawconv.cudnn._ffi.lib`` raise): the error must come before any C call. CLI rows run
``rawconv.cli.main`` in this process: exit status 2 and exactly one line on stderr, no traceback.
docs/guides/errors.md ("Bad input") lists what is checked.
"""
from __future__ import annotations

import pytest
import torch

import rawconv
import rawconv.fused as fu
import rawconv.nn as rnn
import rawconv.ops as rops
from rawconv import ConvProblem, compare, cudnn, cudnn_graph, onednn, tuning
from rawconv.onednn import plan as onednn_plan   # the plan class's module (what it reads)
from rawconv.errors import (AllocationError, ArgumentError, ArgumentTypeError, DeviceNotAvailableError,
                            FileAccessError, InternalError, NotSupportedError, RawconvError)

GPU = torch.cuda.is_available()
X, W, B = (2, 3, 8, 8), (4, 3, 3, 3), (4,)


def x(*s, **kw):
    return torch.randn(*(s or X), **kw)


def w(*s, **kw):
    return torch.randn(*(s or W), **kw)


P = ConvProblem(n=2, c=3, k=4, in_spatial=(8, 8), kernel=(3, 3), pad_before=(1, 1), pad_after=(1, 1))


def _postops():
    from rawconv.core import postops

    return postops


def _leaf():
    return torch.zeros(2, 4, 6, 6, requires_grad=True)


def _inference():
    with torch.inference_mode():
        return torch.zeros(2, 4, 6, 6)


def _overlap():
    t = torch.randn(2, 4, 6, 6)
    return t, t


def _plan_call(fn):
    def call():
        return fn(onednn.Convolution(x(), w()))
    return call


# (id, call, exception class, words (all must appear, case-insensitive), before any C call)
ROWS = [
    # ---- rawconv.onednn.forward: tensors
    ("forward x int", lambda: onednn.forward(x().int(), w()), ArgumentError, ["dtype"], True),
    ("forward x complex", lambda: onednn.forward(x(dtype=torch.complex64), w()), ArgumentError, ["dtype"], True),
    ("forward x float64", lambda: onednn.forward(x().double(), w().double()), ArgumentError, ["float64"], True),
    ("forward x list", lambda: onednn.forward([1.0], w()), ArgumentTypeError, ["torch.Tensor"], True),
    ("forward w None", lambda: onednn.forward(x(), None), ArgumentTypeError, ["torch.Tensor"], True),
    ("forward x meta", lambda: onednn.forward(x(device="meta"), w(device="meta")), ArgumentError, ["CPU"], True),
    ("forward x sparse", lambda: onednn.forward(x().to_sparse(), w()), ArgumentError, ["dense"], True),
    ("forward x rank 2", lambda: onednn.forward(x(3, 8), w()), ArgumentError, ["4-D", "shape"], True),
    ("forward w rank 6", lambda: onednn.forward(x(), w(4, 3, 3, 3, 3, 3)), ArgumentError, ["weight", "5-D"], True),
    ("forward w zero kernel", lambda: onednn.forward(x(), w(4, 3, 0, 3)), ArgumentError, ["kernel", "positive"], True),
    ("forward channels mismatch", lambda: onednn.forward(x(), w(4, 5, 3, 3)), ArgumentError,
     ["expects", "input channels"], True),
    ("forward dtype mismatch", lambda: onednn.forward(x(), w().double()), ArgumentError, ["same dtype"], True),
    ("forward kernel > padded input", lambda: onednn.forward(x(2, 3, 2, 2), w()), ArgumentError,
     ["smaller than the dilated kernel"], True),
    ("forward bias shape", lambda: onednn.forward(x(), w(), torch.randn(4, 1)), ArgumentError, ["bias", "shape"], True),
    ("forward bias dtype", lambda: onednn.forward(x(), w(), torch.randn(4).double()), ArgumentError,
     ["bias", "dtype"], True),
    ("forward bias device", lambda: onednn.forward(x(), w(), torch.randn(4, device="meta")), ArgumentError,
     ["same device"], True),
    # ---- arguments
    ("forward stride 0", lambda: onednn.forward(x(), w(), stride=0), ArgumentError, ["stride", ">= 1"], True),
    ("forward stride float", lambda: onednn.forward(x(), w(), stride=1.5), ArgumentTypeError, ["stride"], True),
    ("forward stride bool", lambda: onednn.forward(x(), w(), stride=True), ArgumentTypeError, ["stride"], True),
    ("forward stride 2**64", lambda: onednn.forward(x(), w(), stride=2 ** 64), ArgumentError, ["stride", "2**31"],
     True),
    ("forward padding -1", lambda: onednn.forward(x(), w(), padding=-1), ArgumentError, ["padding", ">= 0"], True),
    ("forward padding 'full'", lambda: onednn.forward(x(), w(), padding="full"), ArgumentError,
     ["'same' or 'valid'"], True),
    ("forward padding same strided", lambda: onednn.forward(x(), w(), stride=2, padding="same"), ArgumentError,
     ["same", "strided"], True),
    ("forward asym padding dims", lambda: onednn.forward(x(), w(), padding=[(1, 1)] * 3), ArgumentError,
     ["one (before, after) pair per spatial dim"], True),
    ("forward asym padding negative", lambda: onednn.forward(x(), w(), padding=[(1, -1), (1, 1)]), ArgumentError,
     ["padding (after)"], True),
    ("forward dilation 0", lambda: onednn.forward(x(), w(), dilation=0), ArgumentError, ["dilation"], True),
    ("forward groups 0", lambda: onednn.forward(x(), w(), groups=0), ArgumentError, ["groups"], True),
    ("forward groups not dividing", lambda: onednn.forward(x(2, 4, 8, 8), w(4, 2, 3, 3), groups=3), ArgumentError,
     ["groups=3", "divide"], True),
    ("forward fpmath bad", lambda: onednn.forward(x(), w(), fpmath="fp8"), ArgumentError, ["fpmath"], True),
    ("forward algorithm bad", lambda: onednn.forward(x(), w(), algorithm="fft"), ArgumentError, ["algorithm"], True),
    ("forward impl bad type", lambda: onednn.forward(x(), w(), impl=1.5), ArgumentError, ["impl"], True),
    ("forward choice/impl disagree", lambda: onednn.forward(x(), w(), impl=0, choice=1), ArgumentError,
     ["disagree"], True),
    ("forward precision bad", lambda: onednn.forward(x(), w(), precision="fp8"), ArgumentError, ["precision"], True),
    ("forward allow_known_bad str", lambda: onednn.forward(x(), w(), allow_known_bad="yes"), ArgumentTypeError,
     ["allow_known_bad"], True),
    ("forward impl not offered", lambda: onednn.forward(x(), w(), impl="winograd:avx9"), NotSupportedError,
     ["offered"], False),
    ("forward impl position out of range", lambda: onednn.forward(x(), w(), impl=999), NotSupportedError,
     ["impl=999", "out of range"], False),
    # ---- out=
    ("out wrong shape", lambda: onednn.forward(x(), w(), out=torch.empty(5, 5)), ArgumentError, ["out", "shape"],
     False),
    ("out wrong dtype", lambda: onednn.forward(x(), w(), out=torch.empty(2, 4, 6, 6).half()), ArgumentError,
     ["out", "float32"], False),
    ("out not a tensor", lambda: onednn.forward(x(), w(), out=[1]), ArgumentError, ["out", "torch.Tensor"], False),
    ("out leaf requiring grad", lambda: onednn.forward(x(), w(), out=_leaf()), ArgumentError,
     ["out requires grad", "leaf"], False),
    ("out inference tensor", lambda: onednn.forward(x(), w(), out=_inference()), ArgumentError,
     ["inference tensor"], False),
    ("out overlaps x", lambda: onednn.forward(*_overlap(), w(4, 4, 1, 1), out=None) if False else
     (lambda t: onednn.forward(t, w(4, 4, 1, 1), out=t))(torch.randn(2, 4, 6, 6)), ArgumentError, ["overlaps x"],
     False),
    ("out strides", lambda: onednn.forward(x(), w(), out=torch.empty(2, 4, 6, 12)[..., ::2]), ArgumentError,
     ["strides"], False),
    ("out with grad inputs", lambda: onednn.forward(x(), w(requires_grad=True), out=torch.empty(2, 4, 6, 6)),
     ArgumentError, ["not differentiable", "out="], True),
    # ---- backward_data / backward_weights (x_shape / w_shape named)
    ("backward_data x_shape channels", lambda: onednn.backward_data(x(2, 4, 6, 6), w(), (2, 5, 8, 8)), ArgumentError,
     ["x_shape"], True),
    ("backward_data x_shape rank", lambda: onednn.backward_data(x(2, 4, 6, 6), w(), (2, 3, 8, 8, 8)), ArgumentError,
     ["x_shape"], True),
    ("backward_data x_shape str", lambda: onednn.backward_data(x(2, 4, 6, 6), w(), "2x3x8x8"), ArgumentTypeError,
     ["x_shape"], True),
    ("backward_data x_shape negative", lambda: onednn.backward_data(x(2, 4, 6, 6), w(), (2, 3, -8, 8)), ArgumentError,
     ["x_shape"], True),
    ("backward_data grad_y shape", lambda: onednn.backward_data(x(2, 4, 5, 5), w(), (2, 3, 8, 8)), ArgumentError,
     ["grad_y", "shape"], True),
    ("backward_data dtype mismatch", lambda: onednn.backward_data(x(2, 4, 6, 6).double(), w(), (2, 3, 8, 8)),
     ArgumentError, ["same dtype"], True),
    ("backward_weights w_shape channels", lambda: onednn.backward_weights(x(), x(2, 4, 6, 6), (4, 5, 3, 3)),
     ArgumentError, ["w_shape"], True),
    ("backward_weights w_shape str", lambda: onednn.backward_weights(x(), x(2, 4, 6, 6), "4x3x3x3"),
     ArgumentTypeError, ["w_shape"], True),
    ("backward_weights grad_y shape", lambda: onednn.backward_weights(x(), x(2, 4, 5, 5), W), ArgumentError,
     ["grad_y", "shape"], True),
    ("backward_weights bias str", lambda: onednn.backward_weights(x(), x(2, 4, 6, 6), W, bias="yes"),
     ArgumentTypeError, ["bias"], True),
    # ---- plans, prepacking
    ("Convolution prepack str", lambda: onednn.Convolution(x(), w(), prepack="yes"), ArgumentTypeError,
     ["prepack"], True),
    ("from_problem not a problem", lambda: onednn.Convolution.from_problem("ic3oc4"), ArgumentTypeError,
     ["ConvProblem", "from_benchdnn"], True),
    ("from_problem direction", lambda: onednn.Convolution.from_problem(P, direction="sideways"), ArgumentError,
     ["direction"], True),
    ("from_problem w_layout", lambda: onednn.Convolution.from_problem(P, w_layout="hwio"), ArgumentError,
     ["w_layout"], True),
    ("from_problem cuda", lambda: onednn.Convolution.from_problem(P.with_(device="cuda")), ArgumentError,
     ["CPU tensors"], True),
    ("execute x shape", _plan_call(lambda p: p.execute(x(1, 3, 8, 8))), ArgumentError, ["shape"], False),
    ("execute freed", _plan_call(lambda p: (p.free(), p.execute())), ArgumentError, ["freed"], True),
    ("execute grad_y on forward", _plan_call(lambda p: p.execute(grad_y=x())), ArgumentError, ["grad_y"], True),
    ("execute prepack plan without weights",
     lambda: onednn.Convolution.from_problem(P, prepack=True).execute(x()), ArgumentError, ["needs x and w"], True),
    ("repack wrong shape", _plan_call(lambda p: p.repack(w(4, 3, 5, 5))), ArgumentError, ["shape"], True),
    ("repack backward_weights", lambda: onednn.Convolution.from_problem(P, direction="backward_weights").repack(),
     ArgumentError, ["no weights"], True),
    ("repack nothing to snapshot", lambda: onednn.Convolution.from_problem(P).repack(), ArgumentError,
     ["no weights"], True),
    ("autotune iterations 0", _plan_call(lambda p: p.autotune(iterations=0)), ArgumentError, ["iterations"], True),
    ("autotune budget -1", _plan_call(lambda p: p.autotune(budget_s=-1)), ArgumentError, ["budget_s"], True),
    ("select bad impl", _plan_call(lambda p: p.select("nope")), NotSupportedError, ["offered"], False),
    # ---- sizes, memory, devices
    ("tensor over 2**31 elements", lambda: onednn.forward(torch.ones(1).expand(64, 1, 32768, 32768),
                                                          w(1, 1, 1, 1)), NotSupportedError,
     ["elements", "SIGFPE"], True),
    ("make_inputs beyond memory", lambda: ConvProblem(n=1, c=1, k=1, in_spatial=(2 ** 31 - 1,), kernel=(1,))
     .make_inputs(), AllocationError, ["needs about", "available"], True),
    ("make_inputs on_device beyond memory", lambda: ConvProblem(n=64, c=64, k=1, in_spatial=(2 ** 28,),
                                                                kernel=(1,)).make_inputs(on_device=True),
     AllocationError, ["on_device=True", "needs about", "available"], True),
    ("make_inputs on_device str", lambda: P.make_inputs(on_device="no"), ArgumentTypeError,
     ["on_device", "True or False"], True),
    ("make_inputs on_device None", lambda: P.make_inputs(on_device=None), ArgumentTypeError, ["on_device"], True),
    ("make_inputs seed float", lambda: P.make_inputs(seed=1.5, on_device=True), ArgumentTypeError,
     ["seed", "int"], True),
    ("make_inputs seed bool", lambda: P.make_inputs(seed=True), ArgumentTypeError, ["seed"], True),
    ("make_inputs seed 2**64", lambda: P.make_inputs(seed=2 ** 64), ArgumentError, ["seed", "2**64"], True),
    ("make_inputs scale str", lambda: P.make_inputs(scale="2", on_device=True), ArgumentTypeError,
     ["scale", "real number"], True),
    ("make_inputs scale nan", lambda: P.make_inputs(scale=float("nan")), ArgumentError, ["scale", "finite"], True),
    ("make_inputs device banana", lambda: P.make_inputs(device="banana", on_device=True), ArgumentError,
     ["device", "banana"], True),
    ("make_inputs device list", lambda: P.make_inputs(device=["cpu"]), ArgumentTypeError, ["device"], True),
    ("make_inputs on_device cuda without GPU", lambda: P.make_inputs(device="cuda", on_device=True),
     DeviceNotAvailableError, ["cuda", "no cuda gpu"], True),
    ("suggests_channels_last list", lambda: rawconv.problem.suggests_channels_last([1, 2]), ArgumentTypeError,
     ["torch.Tensor"], True),
    ("conv_layout w None", lambda: rawconv.problem.conv_layout(x(), None), ArgumentTypeError, ["torch.Tensor"], True),
    ("backward_data_layout int", lambda: rawconv.problem.backward_data_layout(3, w()), ArgumentTypeError,
     ["torch.Tensor"], True),
    ("backward_weights_layout str", lambda: rawconv.problem.backward_weights_layout(x(), "nhwc"), ArgumentTypeError,
     ["torch.Tensor"], True),
    ("random_tensor negative shape", lambda: rawconv.problem.random_tensor((-1, 3), 0, "cpu", torch.float32),
     ArgumentError, ["shape", "non-negative"], True),
    ("random_tensor shape int", lambda: rawconv.problem.random_tensor(5, 0, "cpu", torch.float32),
     ArgumentTypeError, ["shape", "tuple"], True),
    ("random_tensor beyond 2**40", lambda: rawconv.problem.random_tensor((2 ** 30, 2 ** 30, 2), 0, "cpu",
                                                                          torch.float32),
     ArgumentError, ["2**40"], True),
    ("random_tensor beyond memory", lambda: rawconv.problem.random_tensor((2 ** 20, 2 ** 19), 0, "cpu",
                                                                           torch.float32),
     AllocationError, ["needs about", "available"], True),
    ("random_tensor int dtype", lambda: rawconv.problem.random_tensor((2, 3), 0, "cpu", torch.int32),
     ArgumentError, ["dtype", "int32"], True),
    ("random_tensor dtype str", lambda: rawconv.problem.random_tensor((2, 3), 0, "cpu", "int8"),
     ArgumentTypeError, ["dtype"], True),
    ("random_tensor layout", lambda: rawconv.problem.random_tensor((2, 3, 4, 4), 0, "cpu", torch.float32, "nwhc"),
     ArgumentError, ["layout"], True),
    ("random_tensor device None", lambda: rawconv.problem.random_tensor((2, 3), 0, None, torch.float32),
     ArgumentTypeError, ["device"], True),
    ("random_tensor seed str", lambda: rawconv.problem.random_tensor((2, 3), "0", "cpu", torch.float32),
     ArgumentTypeError, ["seed"], True),
    ("random_tensor scale inf", lambda: rawconv.problem.random_tensor((2, 3), 0, "cpu", torch.float32,
                                                                       scale=float("inf")),
     ArgumentError, ["scale", "finite"], True),
    ("elements beyond 2**40", lambda: ConvProblem(n=2 ** 20, c=2 ** 20, k=1, in_spatial=(2,), kernel=(1,)),
     ArgumentError, ["2**40"], True),
    ("device banana", lambda: ConvProblem(n=1, c=1, k=1, in_spatial=(3,), kernel=(1,), device="banana"),
     ArgumentError, ["device", "banana"], True),
    ("reference_seconds direction", lambda: onednn.reference_seconds(P, "sideways"), ArgumentError,
     ["direction"], True),
    ("reference_seconds not a problem", lambda: onednn.reference_seconds("ic3oc4"), ArgumentTypeError,
     ["ConvProblem"], True),
    ("flush_denormals int", lambda: onednn.flush_denormals(1), ArgumentTypeError, ["True or False"], True),
    ("verbose 5", lambda: onednn.verbose(5), ArgumentError, ["0, 1 or 2"], True),
    ("capabilities refresh str", lambda: onednn.capabilities("yes"), ArgumentTypeError, ["refresh"], True),
    ("implementations isolate bad", lambda: onednn.implementations(x(), w(), isolate="yes"), RawconvError,
     ["isolate"], True),
    # ---- cuDNN on a machine without a GPU / CPU tensors
    ("cudnn.forward CPU tensors", lambda: cudnn.forward(x(), w()), ArgumentError, ["CUDA tensors", "onednn"], True),
    ("cudnn.backward_data CPU tensors", lambda: cudnn.backward_data(x(2, 4, 6, 6), w(), X), ArgumentError,
     ["CUDA"], True),
    ("cudnn_graph.forward CPU tensors", lambda: cudnn_graph.forward(x(), w()), ArgumentError, ["CUDA tensors"], True),
    ("cudnn plan on cuda without GPU", lambda: cudnn.Convolution.from_problem(P.with_(device="cuda")),
     DeviceNotAvailableError, ["no such device"], False),
    ("graph plan on cuda without GPU", lambda: cudnn_graph.GraphConvolution.from_problem(P.with_(device="cuda")),
     DeviceNotAvailableError, ["no such device"], False),
    ("graph engine name bad", lambda: cudnn_graph.forward(x(device="meta"), w(device="meta"), engine="engX"),
     ArgumentError, [], True),
    # ---- rawconv.ops, rawconv.nn, rawconv.fused
    ("ops.conv backend", lambda: rops.conv(x(), w(), backend="mkl"), ArgumentError, ["backend"], True),
    ("ops.conv cudnn on CPU", lambda: rops.conv(x(), w(), backend="cudnn"), ArgumentError, ["CUDA tensors"], True),
    ("ops.conv precision", lambda: rops.conv(x(), w(), precision="fp8"), ArgumentError, ["precision"], True),
    ("ops.conv choice type", lambda: rops.conv(x(), w(), choice=1.5), ArgumentTypeError, ["choice"], True),
    ("ops.conv backward_choice triple", lambda: rops.conv(x(), w(), backward_choice=("a", "b", "c")),
     ArgumentError, ["backward_choice"], True),
    ("ops.conv_backward_data x_shape", lambda: rops.conv_backward_data(x(2, 4, 6, 6), w(), "2x3x8x8"),
     ArgumentTypeError, ["x_shape"], True),
    ("ops.conv_backward_weights w_shape", lambda: rops.conv_backward_weights(x(), x(2, 4, 6, 6), (4, 5, 3, 3)),
     ArgumentError, ["w_shape"], True),
    ("ops.conv_transpose string padding", lambda: rops.conv_transpose(x(2, 4, 6, 6), w(4, 3, 3, 3), padding="same"),
     ArgumentError, ["numeric padding"], True),
    ("ops.conv_transpose output_padding", lambda: rops.conv_transpose(x(2, 4, 6, 6), w(4, 3, 3, 3), stride=2,
                                                                       output_padding=2), ArgumentError,
     ["output_padding"], True),
    ("ops.conv_transpose channels", lambda: rops.conv_transpose(x(2, 5, 6, 6), w(4, 3, 3, 3)), ArgumentError,
     ["channels"], True),
    ("ops.conv_transpose bias shape", lambda: rops.conv_transpose(x(2, 4, 6, 6), w(4, 3, 3, 3), torch.randn(4)),
     ArgumentError, ["bias"], True),
    ("ops.conv_transpose dtype", lambda: rops.conv_transpose(x(2, 4, 6, 6).double(), w(4, 3, 3, 3).double()),
     ArgumentError, ["float64"], True),
    ("ops.conv_transpose backward_choice type", lambda: rops.conv_transpose(x(2, 4, 6, 6), w(4, 3, 3, 3),
                                                                             backward_choice=3), ArgumentTypeError,
     ["backward_choice"], True),
    ("ops.conv_transpose cudnn on CPU", lambda: rops.conv_transpose(x(2, 4, 6, 6), w(4, 3, 3, 3), backend="cudnn"),
     ArgumentError, ["CUDA tensors"], True),
    ("ops.selected on CUDA problem", lambda: rops.selected(x(device="meta"), w(device="meta")), RawconvError, [],
     True),
    ("ops.conv training step unknown direction", lambda: rops.conv(x(), w(), choice={"fwd": "a"}), ArgumentError,
     ["unknown direction", "backward_data"], True),
    ("ops.conv training step and backward_choice", lambda: rops.conv(x(), w(), choice={"forward": None},
                                                                     backward_choice="a"),
     ArgumentError, ["training step", "backward_choice"], True),
    ("ops.split_choice not a step", lambda: rops.TrainingChoice.of([1, 2]), ArgumentTypeError,
     ["TrainingChoice", "list"], True),
    ("ops.conv ambiguous short name", lambda: rops.conv(x(), w(), choice="ref:any"), ArgumentError,
     ["ambiguous", "ref:any@any", "ref:any@user"], False),   # (the listing asks oneDNN)
    ("nn.Conv2d training step unknown direction", lambda: rnn.Conv2d(3, 4, 3, choice={"backward": "a"}),
     ArgumentError, ["unknown direction"], True),
    ("nn.conv x list", lambda: rnn.conv([1.0], w()), ArgumentTypeError, ["torch.Tensor"], True),
    ("nn.Conv2d backend", lambda: rnn.Conv2d(3, 4, 3, backend="mkl"), ArgumentError, ["backend"], True),
    ("nn.Conv2d cudnn on CPU", lambda: rnn.Conv2d(3, 4, 3, backend="cudnn")(x()), ArgumentError, ["CUDA"], True),
    ("nn.Conv2d wrong channels", lambda: rnn.Conv2d(5, 4, 3)(x()), ArgumentError, ["channels"], True),
    ("nn.ConvTranspose2d output_padding", lambda: rnn.conv_transpose(x(2, 4, 6, 6), w(4, 3, 3, 3),
                                                                     output_padding=3), ArgumentError,
     ["output_padding"], True),
    ("nn.convert not a module", lambda: rnn.convert(3), ArgumentTypeError, ["torch.nn.Module"], True),
    ("nn.convert fuse in training", lambda: rnn.convert(torch.nn.Conv2d(3, 4, 3), fuse=True), ArgumentError,
     ["eval"], True),
    ("nn.convert autotune without example", lambda: rnn.convert(torch.nn.Conv2d(3, 4, 3), autotune=True),
     ArgumentError, ["example_input"], True),
    ("nn.convert autotune_backward str", lambda: rnn.convert(torch.nn.Conv2d(3, 4, 3), autotune_backward="yes"),
     ArgumentTypeError, ["autotune_backward"], True),
    ("nn.convert autotune_new", lambda: rnn.convert(torch.nn.Conv2d(3, 4, 3), autotune_new="always"),
     ArgumentError, ["autotune_new", "search"], True),
    ("nn.ConvBiasAct2d.from_conv bn of another rank", lambda: rnn.ConvBiasAct2d.from_conv(
        torch.nn.Conv2d(3, 4, 3), bn=torch.nn.BatchNorm1d(4)), ArgumentError, ["BatchNorm2d"], True),
    ("nn.ConvBiasAct2d.from_conv bn channels", lambda: rnn.ConvBiasAct2d.from_conv(
        torch.nn.Conv2d(3, 4, 3), bn=torch.nn.BatchNorm2d(5)), ArgumentError, ["output channels"], True),
    ("nn.refresh not a module", lambda: rnn.refresh(3), ArgumentTypeError, ["torch.nn.Module"], True),
    ("fused activation", lambda: fu.conv_bias_act(x(), w(), torch.randn(4), activation="mish"), ArgumentError,
     ["activation"], True),
    ("fused activation misspelt", lambda: fu.conv_bias_act(x(), w(), torch.randn(4), activation="gelu-tanh"),
     ArgumentError, ["activation", "gelu_tanh"], True),
    ("fused activation type", lambda: fu.conv_bias_act(x(), w(), torch.randn(4), activation=torch.relu),
     ArgumentTypeError, ["activation"], True),
    ("fusion decision not callables", lambda: _postops().decide_fusion(1, 2), ArgumentTypeError, ["callables"], True),
    ("fusion decision rounds", lambda: _postops().decide_fusion(int, int, rounds=0), ArgumentError, ["rounds"], True),
    ("fused residual shape", lambda: fu.conv_bias_act(x(), w(), torch.randn(4), torch.randn(2, 4, 5, 5)),
     ArgumentError, ["residual", "shape"], True),
    ("fused residual type", lambda: fu.conv_bias_act(x(), w(), torch.randn(4), [1.0]), ArgumentTypeError,
     ["residual"], True),
    ("fused plan residual str", lambda: fu.FusedConvolution(x(), w(), residual="yes"), ArgumentTypeError,
     ["residual"], True),
    # ---- benchdnn descriptors, ConvProblem
    ("benchdnn empty", lambda: ConvProblem.from_benchdnn(""), ArgumentError, ["non-empty"], True),
    ("benchdnn None", lambda: ConvProblem.from_benchdnn(None), ArgumentError, ["non-empty string"], True),
    ("benchdnn unknown key", lambda: ConvProblem.from_benchdnn("ic3oc4ih8xx1"), ArgumentError, ["cannot parse"], True),
    ("benchdnn missing oc", lambda: ConvProblem.from_benchdnn("ic3ih8"), ArgumentError, ["lacks oc"], True),
    ("benchdnn duplicate key", lambda: ConvProblem.from_benchdnn("ic3oc4ih10ih12"), ArgumentError,
     ["ih twice", "ih10", "ih12"], True),
    ("benchdnn duplicate mb", lambda: ConvProblem.from_benchdnn("mb2ic3mb4oc4ih10"), ArgumentError, ["mb twice"],
     True),
    ("benchdnn implausible oh", lambda: ConvProblem.from_benchdnn("ic3oc4ih10oh100"), ArgumentError,
     ["oh100", "trailing pad of 90"], True),
    ("benchdnn implausible ow", lambda: ConvProblem.from_benchdnn("ic3oc4iw10ow14kw3"), ArgumentError,
     ["ow14", "trailing pad"], True),
    ("benchdnn impossible oh", lambda: ConvProblem.from_benchdnn("ic3oc4ih10oh20kh3sh2"), ArgumentError,
     ["oh20"], True),
    ("benchdnn no sizes", lambda: ConvProblem.from_benchdnn("ic3oc4kh3"), ArgumentError, ["neither input nor output"],
     True),
    ("to_benchdnn unwritable asymmetric", lambda: P.with_(pad_before=(1, 1), pad_after=(1, 3)).to_benchdnn(),
     ArgumentError, ["cannot be written as a benchdnn descriptor", "ow10", "trailing pad of 3"], True),
    ("ConvProblem 4 spatial dims", lambda: ConvProblem(n=1, c=1, k=1, in_spatial=(2, 2, 2, 2), kernel=(1,) * 4),
     ArgumentError, ["1-D, 2-D and 3-D"], True),
    ("ConvProblem dtype", lambda: ConvProblem(n=1, c=1, k=1, in_spatial=(2,), kernel=(1,), dtype="int8"),
     ArgumentError, ["dtype"], True),
    ("ConvProblem layout", lambda: ConvProblem(n=1, c=1, k=1, in_spatial=(2,), kernel=(1,), layout="hwc"),
     ArgumentError, ["layout"], True),
    # ---- tuning records and files
    ("tuning load missing", lambda: tuning.cache().load("/nonexistent/x.json"), ArgumentError, ["does not exist"],
     True),
    ("tuning load malformed", lambda: tuning.cache().load(_malformed()), ArgumentError, ["not valid JSON"], True),
    ("tuning save into a missing dir", lambda: tuning.cache().save("/nonexistent/d/x.json"), FileAccessError,
     ["No such file or directory"], True),
    ("tuning save over a device", lambda: tuning.cache().save("/dev/null"), ArgumentError,
     ["not a regular file"], True),
    ("TuningRecord.load missing", lambda: tuning.TuningRecord.load("/nonexistent.json"), ArgumentError,
     ["does not exist"], True),
    ("set_cache_file int", lambda: tuning.set_cache_file(42), ArgumentTypeError, ["path"], True),
    ("tuning load over a FIFO", lambda: tuning.cache().load(_fifo()), ArgumentError, ["not a regular file"], True),
    ("tuning load nested too deeply", lambda: tuning.cache().load(_nested()), ArgumentError, ["nested"], True),
    ("TuningRecord threads beyond the limit", lambda: tuning.TuningRecord.from_json(_many_threads()), ArgumentError,
     ["options.threads", "1024"], True),
    # ---- the plans' byte budget
    ("set_cache_limit negative", lambda: rawconv.set_cache_limit(-1), ArgumentError, ["bytes >= 0"], True),
    ("set_cache_limit str", lambda: rawconv.set_cache_limit("1G"), ArgumentTypeError, ["int number of bytes"], True),
    ("cudnn_graph load_tuning_cache missing", lambda: cudnn_graph.load_tuning_cache("/nonexistent.json"),
     ArgumentError, ["does not exist"], True),
    # ---- compare
    ("compare.write_json disk full", lambda: compare.write_json("/dev/full", [], {}), FileAccessError,
     ["No space left"], True),
    ("compare_problem x shape", lambda: compare.compare_problem(P, x=torch.randn(2, 2)), RawconvError, [], False),
]


def _fifo():
    import os
    import tempfile

    path = os.path.join(tempfile.mkdtemp(), "fifo.json")
    os.mkfifo(path)
    return path


def _nested():
    import tempfile

    f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    f.write("[" * 50000 + "]" * 50000)
    f.close()
    return f.name


def _many_threads():
    key = tuning.TuningKey("onednn", "forward", P, None, {"threads": 2**31 - 1})
    d = {"schema": 1, **key.to_dict(), "choice": "jit:avx2"}
    import json

    return json.dumps(d)


def _malformed():
    import tempfile

    f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    f.write("{not json")
    f.close()
    return f.name


@pytest.fixture
def no_c_calls(monkeypatch):
    from rawconv.cudnn import _ffi as _cudnn
    from rawconv.onednn import _ffi as _dnnl

    def boom(*_a, **_k):
        raise AssertionError("a C function was called")
    monkeypatch.setattr(_dnnl, "lib", boom)
    monkeypatch.setattr(_cudnn, "lib", boom)
    onednn.clear_cache()
    rops.clear_cache()


def _check(call, exc, words):
    with pytest.raises(RawconvError) as info:
        call()
    err = info.value
    assert isinstance(err, exc), f"{type(err).__name__}: {err}"
    if issubclass(exc, (ArgumentError, AllocationError, FileAccessError, ArgumentTypeError)):
        base = {ArgumentError: ValueError, AllocationError: MemoryError, FileAccessError: OSError,
                ArgumentTypeError: TypeError}[exc]
        assert isinstance(err, base)
    text = str(err).lower()
    for word in words:
        assert word.lower() in text, f"{word!r} not in {str(err)!r}"
    assert "\n" not in str(err).strip() or isinstance(err, rawconv.LibraryNotFoundError)


@pytest.mark.usefixtures("dnnl")
@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_bad_input(row, request):
    name, call, exc, words, before_c = row
    if exc is DeviceNotAvailableError and GPU:
        pytest.skip("the machine has a GPU: this row is about machines without one")
    if before_c:
        request.getfixturevalue("no_c_calls")
    _check(call, exc, words)


_ALLOC = ("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: you tried to "
          "allocate 8589934592 bytes.")


@pytest.mark.usefixtures("dnnl")
@pytest.mark.parametrize("where", ["empty_like_layout", "_restride"])
def test_allocation_failures_are_memory_errors(monkeypatch, where):
    """torch's allocator failing while rawconv allocates an output (``empty_like_layout``) or a
    layout copy of an input (``_restride``) is an AllocationError, a MemoryError, naming the entry
    point (on a machine with enough memory for every problem oneDNN is given, the allocator's
    failure is simulated with its own message)."""
    def fail(*_a, **_k):
        raise RuntimeError(_ALLOC)
    monkeypatch.setattr(onednn_plan, where, fail)   # where the plan reads them
    onednn.clear_cache()
    xx = x() if where == "empty_like_layout" else x().transpose(2, 3)   # a layout the plan must copy
    with pytest.raises(AllocationError, match="rawconv.onednn.*: out of memory") as info:
        onednn.forward(xx, w())
    assert isinstance(info.value, MemoryError) and isinstance(info.value.__cause__, RuntimeError)


def test_unexpected_errors_become_internal_errors(monkeypatch):
    """A failure rawconv does not expect below a public function is an InternalError (a
    RawconvError) with the original chained, not the raw exception."""
    def broken(*_a, **_k):
        raise KeyError("boom")
    monkeypatch.setattr(onednn, "cached_plan", broken)
    onednn.clear_cache()
    with pytest.raises(InternalError, match="unexpected KeyError") as info:
        onednn.forward(x(), w())
    assert isinstance(info.value.__cause__, KeyError)


# ---------------------------------------------------------------------------- the command line
CLI_ROWS = [
    ("list huge descriptor", ["list", "mb100000ic3oc4ih1000kh1"], ["needs about", "available"]),
    ("list 2**31-1 input", ["list", "--input", "1x1x2147483647", "--weight", "1x1x1"], ["needs about"]),
    ("compare padding 100000", ["compare", "--padding", "100000", "--input", "1x3x8x8", "--weight", "4x3x3x3"],
     ["needs about"]),
    ("list resnet50 batch 100000", ["list", "resnet50", "--batch", "100000"], ["needs about"]),
    ("compare json /dev/full", ["compare", "--json", "/dev/full", "--input", "1x3x8x8", "--weight", "4x3x3x3",
                                "--iterations", "1", "--warmup", "0", "--no-ref", "--device", "cpu", "--random"],
     ["no space left", "--json /dev/full"]),
    ("compare json into missing dir", ["compare", "--json", "/nonexistent/o.json", "mb1ic3oc4ih8kh3"],
     ["cannot write there"]),
    ("width 0", ["compare", "--width", "0", "mb1ic3oc4ih8kh3"], ["at least 60"]),
    ("width -5", ["list", "--width", "-5", "mb1ic3oc4ih8kh3"], ["at least 60"]),
    ("ref and no-ref", ["compare", "--ref", "--no-ref", "mb1ic3oc4ih8kh3"], ["not allowed with"]),
    ("ref-limit with ref", ["compare", "--ref", "--ref-limit", "3", "mb1ic3oc4ih8kh3"], ["--ref-limit"]),
    ("layers with a descriptor", ["list", "mb1ic3oc4ih8kh3", "--layers", "1"], ["--layers", "single problem"]),
    ("layers with input", ["list", "--input", "1x3x8x8", "--weight", "4x3x3x3", "--layers", "1"], ["--layers"]),
    ("engines abc", ["compare", "--engines", "abc", "mb1ic3oc4ih8kh3"], ["--engines", "'all'"]),
    ("engines on cpu", ["compare", "--engines", "all", "--device", "cpu", "mb1ic3oc4ih8kh3"], ["--engines", "GPU"]),
    ("fpmath on cuda only", ["compare", "--fpmath", "bf16", "--device", "cuda", "mb1ic3oc4ih8kh3"],
     ["cuda"]),
    ("implausible oh", ["list", "ic3oc4ih10oh100"], ["oh100", "trailing pad"]),
    ("duplicate key", ["list", "ic3oc4ih10ih12"], ["ih twice"]),
    ("unknown preset", ["list", "resnet9000"], ["unknown problem"]),
    ("input without weight", ["list", "--input", "1x3x8x8"], ["--input and --weight"]),
    ("bad shape", ["list", "--input", "1x3x8x", "--weight", "4x3x3x3"], ["shape"]),
    ("stride 0", ["list", "--input", "1x3x8x8", "--weight", "4x3x3x3", "--stride", "0"], ["stride"]),
    ("device cuda without GPU", ["list", "--device", "cuda", "mb1ic3oc4ih8kh3"], ["no cuda device"]),
    ("device banana", ["list", "--device", "banana", "mb1ic3oc4ih8kh3"], ["--device"]),
    ("over 2**31 elements", ["list", "--input", "64x1x32768x32768", "--weight", "1x1x1x1"], []),
]


@pytest.mark.usefixtures("dnnl")
@pytest.mark.parametrize("row", CLI_ROWS, ids=[r[0] for r in CLI_ROWS])
def test_cli_bad_input(row, capsys):
    from rawconv.cli import main

    name, argv, words = row
    if GPU and ("cuda" in name or "GPU" in name or argv[-1:] == ["cuda"]):
        pytest.skip("the machine has a GPU")
    try:
        code = main(argv)
    except SystemExit as exc:     # argparse's own errors exit through _Parser.error
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("rawconv: warning:")]
    assert len(lines) == 1, err
    assert lines[0].startswith("rawconv") and "error:" in lines[0] and "Traceback" not in err
    for word in words:
        assert word.lower() in lines[0].lower(), f"{word!r} not in {lines[0]!r}"
