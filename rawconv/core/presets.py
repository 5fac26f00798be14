"""Named sets of convolution layers from real networks, as :class:`~rawconv.problem.ConvProblem` lists.

``resnet50(batch)``: the distinct convolutions of torchvision's ResNet-50 (v1.5: stride in the
3x3 conv of each stage's first block) at 224x224 input, in network order, each named after its
first occurrence (``conv1``, ``layer1.0.conv1`` ...).
"""
from __future__ import annotations

from .problem import ConvProblem


def _resnet50_layers():
    layers = [("conv1", 3, 64, 224, 7, 2, 3)]
    inplanes, size = 64, 56
    for stage, (planes, blocks, stride) in enumerate([(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)], 1):
        for b in range(blocks):
            s = stride if b == 0 else 1
            pre = f"layer{stage}.{b}"
            layers.append((pre + ".conv1", inplanes, planes, size, 1, 1, 0))
            layers.append((pre + ".conv2", planes, planes, size, 3, s, 1))
            out_size = size // s
            layers.append((pre + ".conv3", planes, planes * 4, out_size, 1, 1, 0))
            if b == 0:
                layers.append((pre + ".downsample.0", inplanes, planes * 4, size, 1, s, 0))
            inplanes, size = planes * 4, out_size
    return layers


def resnet50(batch: int = 1, *, dtype: str = "float32", layout: str = "nchw", bias: bool = False) -> list[ConvProblem]:
    """The distinct convolution shapes of ResNet-50 (23 at 224x224), batch ``batch``, in network order.

    ``dtype`` ("float32", "bfloat16", "float16"), ``layout`` ("nchw" or "nhwc") apply to all.
    """
    seen, out = set(), []
    for name, c, k, size, ksz, stride, pad in _resnet50_layers():
        key = (c, k, size, ksz, stride, pad)
        if key in seen:
            continue
        seen.add(key)
        out.append(ConvProblem(n=batch, c=c, k=k, in_spatial=(size, size), kernel=(ksz, ksz), stride=(stride, stride),
                               pad_before=(pad, pad), pad_after=(pad, pad), dtype=dtype, layout=layout,
                               has_bias=bias, name=name))
    return out


PRESETS = {"resnet50": resnet50}


def get(name: str, batch: int = 1, **kw) -> list[ConvProblem]:
    """A preset by name (see :data:`PRESETS`). Raises :class:`~rawconv.errors.ArgumentError` for an unknown name."""
    from .errors import ArgumentError

    if name not in PRESETS:
        raise ArgumentError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
    return PRESETS[name](batch, **kw)
