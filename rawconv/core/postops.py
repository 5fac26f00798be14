"""What every fused convolution (conv + bias (+ residual) (+ activation)) checks, and its result
computed in torch (zero-sized problems: no library call). Shared by the oneDNN post-op plan
(:mod:`rawconv.onednn.fused`), the cuDNN residual graph and the operator (:mod:`rawconv.fused`)."""
from __future__ import annotations

import torch

from .errors import ArgumentError, ArgumentTypeError
from .problem import ConvProblem, to_layout

ACTIVATIONS = ("none", "relu")


def _check_activation(activation) -> str:
    if activation is None:
        return "none"
    if not isinstance(activation, str):
        raise ArgumentTypeError(f"activation must be one of {list(ACTIVATIONS)}, got {type(activation).__name__}")
    if activation == "identity":
        activation = "none"
    if activation not in ACTIVATIONS:
        raise ArgumentError(f"activation must be one of {list(ACTIVATIONS)}, got {activation!r}")
    return activation


def _check_residual(residual, p: ConvProblem) -> torch.Tensor:
    if not isinstance(residual, torch.Tensor):
        raise ArgumentTypeError(f"residual must be a torch.Tensor, got {type(residual).__name__}")
    r = residual.unsqueeze(0) if p.unbatched and residual.dim() == p.ndim + 1 else residual
    if tuple(r.shape) != tuple(p.y_shape):
        raise ArgumentError(f"residual must have the output's shape {tuple(p.y_shape)}, got {tuple(residual.shape)}")
    if r.dtype != p.torch_dtype:
        raise ArgumentError(f"residual must be {p.torch_dtype} (the input's dtype), got {r.dtype}")
    if str(r.device) != p.device and not (r.device.type == "cuda" and p.device.startswith("cuda")
                                          and torch.device(p.device).index in (None, r.device.index)):
        raise ArgumentError(f"residual must be on {p.device}, got {r.device}")
    if r.is_nested or r.layout != torch.strided:
        raise ArgumentError("residual must be a dense (strided) tensor")
    return r


def _torch_tail(z: torch.Tensor, bias, residual, activation: str, p: ConvProblem) -> torch.Tensor:
    """``act(z + bias + residual)`` in torch (zero-sized problems: no library call)."""
    y = to_layout(z, p.layout)
    if bias is not None:
        y = y + bias.view(1, -1, *([1] * p.ndim))
    if residual is not None:
        y = y + _check_residual(residual, p)
    if activation == "relu":
        y = torch.relu(y)
    y = to_layout(y.contiguous(), p.layout) if p.layout == "nchw" else to_layout(y, p.layout)
    return y.squeeze(0) if p.unbatched else y
