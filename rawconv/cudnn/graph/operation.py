"""A graph plan's operation graph and the checks it shares (a part of :mod:`rawconv.cudnn_graph`, the
face, which hands its names on): :class:`OperationGraph` (the backend descriptors of one problem's
graph), the helpers the plan and the function forms use (:func:`check_activation`,
:func:`tolerance_args`, :func:`check_result`, ...). ``check_result`` set on the face (a test's
monkeypatch) is set here, where the plan reads it (``_op.check_result``)."""
from __future__ import annotations

from typing import Sequence

import torch

from . import _backend_api as B
from ...core import check as _check
from ...core.backend import canonical_direction
from ...core.check import ErrorStats, Tolerance, tolerance_for
from ...core.errors import ArgumentError
from ...core.problem import ConvProblem, dense_strides
from .common import ACTIVATIONS, ALIGNMENT, UID, _GRAPH_NAMES, _ROLES, _VENDOR_DIRECTION, _VIRTUAL_UIDS

FACE = "rawconv.cudnn.graph"   # where this module's names live (rawconv.cudnn_graph): pickles, messages


# ---------------------------------------------------------------------------- helpers


def _lift(shape: Sequence[int]) -> list[int]:
    """1-D (N, C, W) -> (N, C, 1, W): cuDNN's convolution engines take 4-D and 5-D tensors."""
    shape = list(shape)
    return shape[:2] + [1] + shape[2:] if len(shape) == 3 else shape


def _norm_direction(direction: str) -> str:
    """rawconv's direction name (:func:`rawconv._backend.canonical_direction`)."""
    return canonical_direction(direction)


def check_activation(activation, direction: str, has_bias: bool) -> str | None:
    if activation in (None, "identity", "none"):
        activation = None
    elif activation not in ACTIVATIONS:
        raise ArgumentError(f"activation must be None or one of {list(ACTIVATIONS)}, got {activation!r}")
    if direction != "forward" and (activation or has_bias):
        raise ArgumentError("bias and activation fuse into forward graphs only")
    return activation


def _device_index(p: ConvProblem) -> int:
    d = torch.device(p.device)
    if d.type != "cuda":
        raise ArgumentError(f"rawconv.cudnn_graph runs on CUDA tensors; got tensors on {p.device} "
                            "(use rawconv.onednn for CPU tensors)")
    return d.index if d.index is not None else torch.cuda.current_device()


def tolerance_args(p: ConvProblem, notes: Sequence[str], direction: str = "forward",
                   activation: str | None = None) -> dict:
    """Keyword arguments for :func:`rawconv.check.tolerance` that the numerical ``notes`` of an
    engine config imply for problem ``p`` (:func:`rawconv.check.tolerance_for`, the one policy)."""
    return tolerance_for(p, direction, notes=notes, activation=activation).kwargs()


def check_result(p: ConvProblem, y: torch.Tensor, ref: torch.Tensor, ref_abs: torch.Tensor, **tol_kw) -> ErrorStats:
    """:func:`rawconv.check.check` with :func:`rawconv.check.tolerance` keyword arguments."""
    return _check.check(p, y, ref, ref_abs, Tolerance(**tol_kw))


# ---------------------------------------------------------------------------- the graph
class OperationGraph:
    """The backend descriptors of one problem's graph: tensors, convolution, operations
    (built without a GPU) and, on demand, the operation graph (needs a handle)."""

    def __init__(self, p: ConvProblem, direction: str, activation: str | None, w_layout: str,
                 residual: bool = False):
        # residual (forward only): y = act(conv(x, w) + b + r), r a tensor of y's shape and layout
        # (uid UID["r"]), added by one more pointwise node before the activation
        if residual and direction != "forward":
            raise ArgumentError("a residual add fuses into forward graphs only")
        self.problem, self.direction, self.activation = p, direction, activation
        self.residual = residual
        compute = "float64" if p.dtype == "float64" else "float32"
        self.compute = compute
        lay = p.layout
        nd = max(p.ndim, 2)
        lift = p.ndim == 1
        shapes = {"x": p.x_shape, "y": p.y_shape, "w": p.w_shape}
        shapes.update(dx=p.x_shape, dy=p.y_shape, dw=p.w_shape)
        self.strides = {}       # role -> strides the torch tensor must have (its own rank)
        self.tensors = {}       # role -> tensor descriptor
        for role in _ROLES[direction]:
            shape = shapes[role]
            layout = w_layout if role in ("w", "dw") else lay
            st = dense_strides(shape, layout)
            self.strides[role] = st
            gshape, gst = _lift(shape), dense_strides(_lift(shape), layout)
            self.tensors[role] = B.tensor(UID[role], gshape, gst, p.dtype, alignment=ALIGNMENT)
        pre, post = list(p.pad_before), list(p.pad_after)
        st, dil = list(p.stride), list(p.dilation)
        if lift:
            pre, post, st, dil = [0] + pre, [0] + post, [1] + st, [1] + dil
        self.conv = B.convolution(nd, compute, dilations=dil, strides=st, pre_paddings=pre, post_paddings=post)
        ops = []
        named = {_GRAPH_NAMES[r]: t for r, t in self.tensors.items()}
        if direction == "forward" and (p.has_bias or activation or residual):
            ydesc = self.tensors["y"]
            ygshape = _lift(p.y_shape)
            ygst = dense_strides(ygshape, lay)
            v1 = B.tensor(_VIRTUAL_UIDS[0], ygshape, ygst, compute, alignment=ALIGNMENT, virtual=True)
            ops.append(B.conv_operation("forward", {**named, "Y": v1}, self.conv, compute))
            cur = v1
            if p.has_bias:
                bshape = [1, p.k] + [1] * nd
                self.strides["b"] = [1]
                self.tensors["b"] = B.tensor(UID["b"], bshape, dense_strides(bshape, lay), p.dtype,
                                             alignment=ALIGNMENT)
                nxt = ydesc if not (activation or residual) else B.tensor(
                    _VIRTUAL_UIDS[1], ygshape, ygst, compute, alignment=ALIGNMENT, virtual=True)
                ops.append(B.pointwise_operation(B.pointwise("add", compute), cur, nxt, self.tensors["b"]))
                cur = nxt
            if residual:
                self.strides["r"] = dense_strides(p.y_shape, lay)
                self.tensors["r"] = B.tensor(UID["r"], ygshape, ygst, p.dtype, alignment=ALIGNMENT)
                nxt = ydesc if not activation else B.tensor(_VIRTUAL_UIDS[2], ygshape, ygst, compute,
                                                            alignment=ALIGNMENT, virtual=True)
                ops.append(B.pointwise_operation(B.pointwise("add", compute), cur, nxt, self.tensors["r"]))
                cur = nxt
            if activation:
                ops.append(B.pointwise_operation(B.pointwise(activation, compute), cur, ydesc))
        else:
            ops.append(B.conv_operation(_VENDOR_DIRECTION.get(direction, direction), named, self.conv, compute))
        self.ops = ops
        extra = [r for r in ("b", "r") if r in self.tensors]
        self.uids = [UID[r] for r in _ROLES[direction]] + [UID[r] for r in extra]
        self.roles = list(_ROLES[direction]) + extra
        self.packer = None   # its B.VariantPacker (made on the first execute: it needs the library)
        self.graph = None
        self.global_count = None

    def build(self, handle) -> B.Descriptor:
        """The finalized operation graph (``CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR``)."""
        if self.graph is None:
            self.graph = B.operation_graph(handle, self.ops)
            self.global_count = B.engine_global_count(self.graph)
        return self.graph


OperationGraph.__module__ = FACE
