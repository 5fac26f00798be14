"""rawconv's convolutions as PyTorch custom operators (``torch.library``), differentiable to any order.

Quick use::

    import rawconv.ops
    y = rawconv.ops.conv(x, w, b, padding=1)                                  # oneDNN on CPU, cuDNN on CUDA
    y = rawconv.ops.conv(x, w, padding=1, choice="brgconv:avx512_core")     # exactly that implementation
    y = rawconv.ops.conv(x, w, padding=1, choice="eng28{k2=3}")             # a cuDNN graph engine config
    y = torch.ops.rawconv.conv_forward(x, w, None, [1, 1], [1, 1], [1, 1], [1, 1], 1,
                                       "auto", "", "strict", "", "")           # the operator itself

Operators (namespace ``rawconv``; schemas exactly as registered)::

    conv_forward(Tensor x, Tensor w, Tensor? bias, int[] stride, int[] pad_before, int[] pad_after,
                 int[] dilation, int groups, str backend, str choice, str precision,
                 str bwd_data_choice, str bwd_weights_choice) -> Tensor
    conv_backward_data(Tensor grad_y, Tensor w, SymInt[] x_shape, int[] stride, int[] pad_before,
                       int[] pad_after, int[] dilation, int groups, str backend, str choice,
                       str precision) -> Tensor
    conv_backward_weights(Tensor x, Tensor grad_y, SymInt[] w_shape, int[] stride, int[] pad_before,
                          int[] pad_after, int[] dilation, int groups, bool bias, str backend,
                          str choice, str precision) -> (Tensor, Tensor)

Arguments, shared by all three:

* tensors as ``torch.nn.functional.conv{1,2,3}d``: ``x`` (N, C, *spatial) or unbatched (C, *spatial),
  ``w`` (K, C/groups, *kernel), ``bias`` (K,), ``grad_y`` (N, K, *out); float32, bfloat16 or
  float16 (oneDNN: where this CPU offers them), also float64 on cuDNN; NCHW or channels_last.
* ``stride``, ``dilation`` (torch's: 1 = none), ``pad_before``, ``pad_after``: one int per spatial dim
  (asymmetric padding is allowed); ``groups``.
* ``backend``: ``"onednn"`` (CPU tensors), ``"cudnn"`` (CUDA tensors: cuDNN's legacy API, or its
  graph API when ``choice`` names an engine config), ``"cudnn_graph"`` (CUDA, graph API always),
  ``"auto"`` (by the tensors' device).
* ``choice``: ``""`` = the library's own first choice (oneDNN's first implementation, on
  channels-last tensors its first on their own layouts: see below; cuDNN's heuristic), else a stable name: a oneDNN implementation (``"brgconv:avx512_core"``, optionally
  ``"name@any"`` / ``"name@user"``), a cuDNN legacy algorithm ``"ALGO@math"``
  (``"IMPLICIT_PRECOMP_GEMM@fma"``; ``"@tensor_op"`` sets only the math type; ``"fastest"`` runs
  cuDNN's Find once per problem), or a graph engine config (``"eng28{k2=3}"``, ``"nhwc:eng72"``,
  ``"fastest"`` = autotune for ``cudnn_graph``).
* ``precision``: ``"strict"``, ``"tf32"``, ``"bf16"``, ``"f16"``, ``"any"`` (:mod:`rawconv.options`:
  oneDNN's fpmath mode, cuDNN's math type).

Results:

* ``conv_forward``: y (N, K, *out) in torch's memory format for it: channels_last when x **or** w
  is (:func:`rawconv.problem.conv_layout`, torch's ``mkldnn_conv_use_channels_last`` /
  ``cudnn_conv_suggest_memory_format``; never for float64; a 1-D convolution follows w alone); an
  x in another format is copied into it. An unbatched x gives an unbatched y.
* ``conv_backward_data``: dx of ``x_shape``, channels_last when grad_y or w is (torch's cuDNN
  backward-data rule; a grad_y whose shape cannot tell NCHW from NHWC counts as NCHW, as in torch).
* ``conv_backward_weights``: ``(dw, db)``: dw of ``w_shape``, channels_last when x or grad_y is
  (torch's cuDNN backward-weights rule; for 1-D grad_y alone decides); db of shape
  (K,) (grad_y summed over batch and space) when ``bias`` is True, else **an empty tensor of
  shape (0,)** (a schema's output count is fixed; an empty tensor costs nothing and tells the
  caller there is no bias gradient).

Kernels: CPU on cached oneDNN plans (:mod:`rawconv.onednn`, keyed by problem, direction, choice,
precision and thread; weights reordered on every call, never prepacked: an operator cannot know
when a tensor changes behind its back); CUDA on cuDNN's cached plans (:mod:`rawconv.cudnn`,
:mod:`rawconv.cudnn_graph`). Fake (meta) kernels compute shapes, dtypes, devices and strides
from :class:`~rawconv.problem.ConvProblem` (or the same formulas on symbolic sizes) without a
library call, so ``torch.compile(fullgraph=True)`` traces models using the operators.

Autograd (an Autograd kernel, as ``torch.library.register_autograd`` registers one) runs rawconv's
own ops, so gradients of any order come from the same libraries:

* d conv_forward: dx = ``conv_backward_data(gy, w)`` with ``bwd_data_choice``, (dw, db) =
  ``conv_backward_weights(x, gy)`` with ``bwd_weights_choice``;
* d conv_backward_data (linear in grad_y and w): d grad_y = ``conv_forward(g, w)``,
  dw = ``conv_backward_weights(g, grad_y)``;
* d conv_backward_weights (linear in x and grad_y): dx = ``conv_backward_data(grad_y, g_w)``,
  d grad_y = ``conv_forward(x, g_w, g_b)``.

**Backward choices: a pinned training step.** A forward ``choice`` name does not carry over to
the backward passes: the libraries list forward, backward-data and backward-weights candidates
separately (oneDNN names them differently; cuDNN's algorithm enums differ per direction), so there
is no honest mapping. The backward passes run ``bwd_data_choice`` / ``bwd_weights_choice`` when
given, else the library's own first choice for that backward problem (oneDNN on channels-last
tensors, in every direction: its first implementation on the tensors' own layouts, as torch's
oneDNN is asked, with no conversion of x and y / dy on every call:
:meth:`rawconv.onednn.Convolution.first_on_tensor_layouts`; the function forms keep oneDNN's first
choice): still one fixed candidate for a given problem,
library version and machine (:func:`selected` says which). To pin the whole
training step, pass one :class:`TrainingChoice` or a dict per direction as ``choice``
(``{"forward": ..., "backward_data": ..., "backward_weights": ...}``; what :func:`selected`
returns is such a dict): :func:`conv` and ``rawconv.nn``'s modules then run exactly those three
on every call. The derivatives of the backward operators (second order) run the library's first
choice.

This module is the face: the code lives in its parts, each handing its names on through here
(``rawconv.ops.X`` as before the split): :mod:`.ops_kernels` (the schemas, argument checks, CPU,
CUDA and fake kernels, flop formulas), :mod:`.ops_autograd` (the autograd Functions and Autograd
kernels, the direct backward), :mod:`.ops_functions` (:func:`conv` and the other functions,
:class:`TrainingChoice`) and :mod:`.ops_forms` (the backends' function forms on tensors that need
grad). The hooks and caches a test sets on this face (``_cuda_last``, ``_fwd_call``, the CUDA
kernels' checked paths, ``_direct_backward``) are set in the part that reads them
(:func:`rawconv.core.face.route_settings`).
"""
from __future__ import annotations

from ..core.face import route_settings as _route_settings
from ..core.problem import ConvProblem  # noqa: F401 - rawconv.ops.ConvProblem, as before
from . import ops_autograd as _autograd, ops_kernels as _kernels
from .ops_kernels import (BACKENDS, _DEVICE_OF, _lib, _ARGS, _fwd_op, _bwd_data_op, _bwd_weights_op, _check_strings,
                          _padding, _device_type, _batched, _layout, _dx_layout, _enforce_layout,
                          _grads_of_forward_layout, _cpu_cache, _get_ident, _onednn_choice, _forward_cpu_plan,
                          _forward_cpu, _cpu_last, _backward_data_plan, _backward_data_cpu, _data_result,
                          _backward_data_cpu_plan, _backward_weights_problem, _backward_weights_cpu, _weights_result,
                          _backward_weights_cpu_plan, _legacy_choice, _GRAPH_MATH, _api, _graph_default,
                          _forward_cuda, _forward_cuda_checked, _cuda_last, _thread, _backward_data_cuda,
                          _backward_data_cuda_checked, _bias_grad_of, _backward_weights_cuda,
                          _backward_weights_cuda_checked, _concrete, _out_spatial, _fake_args, _forward_fake,
                          _backward_data_fake, _backward_weights_fake, _register_flop_formulas)  # noqa: F401
from .ops_autograd import (_grad_enabled, _dispatch_modes, _function_mode, _functorch, _tracing, _legacy_batched,
                           _compiling, _autocasting, _AFTER_AUTOGRAD, _CPU_ONLY, _CUDA_ONLY, _below_autograd,
                           _KEYSETS, _run_below_autograd, _grad_like, _Conf, _add, _no_autocast, RawconvConvForward,
                           RawconvConvBackwardData, RawconvConvBackwardWeights, _fwad, _classic, _FwdFn, _BwdDataFn,
                           _BwdWeightsFn, _fwd_call, _bwd_data_call, _bwd_weights_call, _under_transform, _PUBLIC_OF,
                           _needs, _forward_autograd, _backward_data_autograd, _backward_weights_autograd,
                           _plain_backward, _direct_backward)  # noqa: F401
from .ops_functions import (_choice_name, DIRECTIONS, _DIRECTION_KEYS, TrainingChoice, _is_step, split_choice,
                            _backward_choices, _conv_args, _key, _conv_cache, _PLAIN, _plain, _autocast_inputs,
                            _prepare_conv, _new_entry, _conv_entry, conv, conv_backward_data, RawconvConvTranspose,
                            _TransposeFn, _ConvTransposeJvp, conv_transpose, conv_backward_weights, selected,
                            clear_cache)  # noqa: F401
from .ops_forms import (_refuse, _onednn_impl_choice, _onednn_function, _PRECISION_OF_MATH, _cudnn_choice, canonical,
                        _cudnn_function, _graph_function)  # noqa: F401

__all__ = ["conv", "conv_transpose", "conv_backward_data", "conv_backward_weights", "selected", "BACKENDS",
           "clear_cache", "TrainingChoice", "split_choice"]

# name -> the part that reads it: a hook or cache set on this face (a test's ``monkeypatch.setattr(ops,
# "_cuda_last", rec)``) is set there, where the parts' code reads it (``_k.NAME`` / ``_ag.NAME`` elsewhere)
_SETTINGS = {"_cuda_last": _kernels, "_forward_cuda_checked": _kernels, "_backward_data_cuda_checked": _kernels,
             "_backward_weights_cuda_checked": _kernels, "_fwd_call": _autograd, "_direct_backward": _autograd}

_route_settings(__name__, _SETTINGS)   # (rawconv.core.face: unittest.mock.patch.object restores them too)
