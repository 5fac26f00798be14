"""Under torch.compile on CUDA a fused layer whose bias cuDNN runs unfused anyway hands its bias add,
residual add and activation to inductor as torch ops (rawconv.pytorch.modules._epilogue_to_inductor),
as inductor does with torch's own convolution (it peels the bias off aten.convolution on CUDA and
fuses the add into the next kernel). Inside the operator they were one more pass over the output
each: ConvNeXt-T converted and compiled ran at 0.95x torch.compile on an H100 (2.586 against 2.444 ms,
b32 fp16), its 18 depthwise layers "unfused:eng5" with a bias."""
from __future__ import annotations

import pytest
import torch

import rawconv.nn as rnn
from rawconv.pytorch.modules import _epilogue_to_inductor as split


class _Cuda:
    is_cuda = True


class _Cpu:
    is_cuda = False


B = torch.zeros(3)


@pytest.mark.parametrize("compiling, x, b, choice, act, res, groups, want", [
    (True, _Cuda(), B, "unfused:eng5", "none", None, 96, "eng5"),
    (True, _Cuda(), B, "unfused:nhwc:eng28{k2=4}", "silu", "r", 1, "nhwc:eng28{k2=4}"),
    (True, _Cuda(), B, "unfused:", "relu", None, 1, None),           # the convolution-only plan's default
    (True, _Cuda(), B, None, "none", None, 1, None),                 # a plain conv + bias: cuDNN's default splits
    (True, _Cuda(), B, None, "gelu", None, 8, None),                 # grouped, any epilogue: likewise
    (True, _Cuda(), B, None, "relu", None, 1, False),                # conv + bias + ReLU: cuDNN may fuse it
    (True, _Cuda(), B, None, "none", "r", 1, False),                 # a residual: likewise
    (True, _Cuda(), B, "eng11{k2=3}", "none", None, 1, False),        # a fused config chosen: kept whole
    (True, _Cuda(), None, "unfused:eng5", "relu", None, 1, False),   # no bias: nothing to hand over
    (False, _Cuda(), B, "unfused:eng5", "none", None, 1, False),     # eager: the operator's own path
    (True, _Cpu(), B, "unfused:eng5", "none", None, 1, False),       # the CPU: oneDNN fuses its bias
])
def test_which_layers_hand_their_epilogue_to_inductor(compiling, x, b, choice, act, res, groups, want):
    assert split(compiling, x, b, choice, act, res, groups) == want


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ["none", "silu"])
def test_cuda_compiled_layer_adds_its_bias_in_the_graph(activation):
    """The compiled graph of a converted depthwise conv + bias (+ SiLU) calls the operator without
    the bias and adds it after; the output is right against float64."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(32, 32, 7, padding=3, groups=32)
    layers = [conv] + ([torch.nn.SiLU()] if activation == "silu" else [])
    net = torch.nn.Sequential(*layers).cuda().eval().to(memory_format=torch.channels_last)
    x = torch.randn(4, 32, 28, 28, device="cuda").to(memory_format=torch.channels_last)
    ref = net.double()(x.double()).float()
    net = net.float()
    m = rnn.convert(net, fuse=True)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    with torch.no_grad():
        y = torch.compile(m, backend=backend, fullgraph=True)(x)
        yc = torch.compile(m)(x)
    for out in (y, yc):
        assert ((out - ref).abs().max() / ref.abs().max()).item() < 5e-3
    calls = [n for g in graphs for n in g.graph.nodes if n.op == "call_function" and "rawconv" in str(n.target)]
    assert calls and all(n.args[2] is None for n in calls), [(n.target, n.args[:3]) for n in calls]
    adds = [n for g in graphs for n in g.graph.nodes if n.op == "call_function" and "add" in str(n.target)]
    assert adds
