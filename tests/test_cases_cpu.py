"""Regression tests from public bug reports (../shared/cases/README.md, cases C1-C5)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from rawconv import ConvProblem, onednn
from rawconv.compare import torch_backend
from rawconv.problem import abs_reference, compare_to_reference


def test_c1_zero_sized_dims_give_torchs_empty_outputs():
    # pytorch #19599, #31425: libraries reject zero-sized dims
    x = torch.randn(0, 3, 3, 3)
    w = torch.randn(3, 3, 3, 3)
    y = onednn.forward(x, w)
    assert y.shape == (0, 3, 1, 1) == F.conv2d(x, w).shape
    x2 = torch.randn(2, 32, 0, 5)
    w2 = torch.randn(32, 32, 2, 2)
    b2 = torch.randn(32)
    y2 = onednn.forward(x2, w2, b2, padding=1)
    # torch 2.14's CPU kernels now refuse zero spatial sizes; its shape function still gives (2,32,1,6)
    assert y2.shape == (2, 32, 1, 6) == F.conv2d(x2.to("meta"), w2.to("meta"), padding=1).shape
    # every output window lies in the zero padding: the result is the bias alone
    torch.testing.assert_close(y2, b2.view(1, -1, 1, 1).expand(2, 32, 1, 6), rtol=0, atol=0)
    assert torch.equal(onednn.forward(x2, w2, padding=1), torch.zeros(2, 32, 1, 6))
    # backward passes of empty problems too
    gx = onednn.backward_data(torch.randn(2, 32, 1, 6), w2, (2, 32, 0, 5), padding=1)
    assert gx.shape == (2, 32, 0, 5)
    gw = onednn.backward_weights(x2, torch.randn(2, 32, 1, 6), (32, 32, 2, 2), padding=1)
    assert torch.equal(gw, torch.zeros(32, 32, 2, 2))


def test_c2_asymmetric_padding_every_implementation():
    # oneDNN #5080: one implementation wrote wrong boundary columns with asymmetric padding
    x = torch.randn(1, 1, 32, 64)
    w = torch.randn(1, 1, 2, 4)
    pad = [(0, 0), (1, 2)]
    want = F.conv2d(F.pad(x, (1, 2, 0, 0)), w, stride=(2, 1))
    p = ConvProblem.from_torch(x, w, stride=(2, 1), padding=pad)
    ref, ra = p.reference(x, w), abs_reference(p, x, w)
    for layout in ("nchw", "nhwc"):
        xl = x if layout == "nchw" else x.to(memory_format=torch.channels_last)
        impls = onednn.implementations(xl, w, stride=(2, 1), padding=pad)
        assert impls
        for impl in impls:
            y = onednn.forward(xl, w, stride=(2, 1), padding=pad, impl=impl.index)
            assert y.shape == want.shape
            assert compare_to_reference(p, y, ref, ra).ok, f"{impl}"
            torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)


def test_c3_listing_twice_gives_the_same_list_without_duplicates():
    # oneDNN 3.2 repeats the list when its primitive cache holds the problem's primitives
    x = torch.randn(2, 64, 56, 56)
    w = torch.randn(64, 64, 3, 3)
    onednn.clear_cache()
    first = onednn.implementations(x, w, padding=1)
    for impl in first:
        if not impl.name.startswith("ref"):
            onednn.forward(x, w, padding=1, impl=impl.index)   # fills oneDNN's primitive cache
    onednn.clear_cache()
    second = onednn.implementations(x, w, padding=1)
    key = lambda rows: [(r.index, r.name, r.layouts, tuple(r.formats.items())) for r in rows]  # noqa: E731
    assert key(first) == key(second)
    assert len({k[1:] for k in key(first)}) == len(first)


def test_c4_thread_count_changes_torchs_backend_not_a_pinned_impl():
    # pytorch #116369: torch picks its backend by thread count, results differ in the last bits
    x = torch.ones(8, 64, 64)
    w = torch.randn(64, 64, 1, generator=torch.Generator().manual_seed(0))
    p = ConvProblem.from_torch(x, w)
    old = torch.get_num_threads()
    backends, outs = {}, {}
    try:
        impl = next(i for i in onednn.implementations(x, w) if not i.name.startswith("ref"))
        for n in (1, 2):
            torch.set_num_threads(n)
            backends[n] = torch_backend(p, x, w, None)
            outs[n] = onednn.forward(x, w, impl=impl.index)
    finally:
        torch.set_num_threads(old)
    valid = {str(b).split(".")[-1] for b in torch._C._ConvBackend.__members__}
    assert backends[1] in valid and backends[2] in valid
    assert torch.equal(outs[1], outs[2])   # a pinned implementation is bitwise stable across threads
    ref, ra = p.reference(x, w), abs_reference(p, x, w)
    assert compare_to_reference(p, outs[1], ref, ra).ok


def test_c5_bf16_ones_give_four_for_every_implementation(requires_onednn):
    # pytorch #163347: one platform returned 1
    requires_onednn("forward", "bfloat16")
    x = torch.ones(1, 1, 2, 2, dtype=torch.bfloat16)
    w = torch.ones(1, 1, 2, 2, dtype=torch.bfloat16)
    impls = onednn.implementations(x, w)
    assert impls
    for impl in impls:
        y = onednn.forward(x, w, impl=impl.index)
        assert y.shape == (1, 1, 1, 1) and y.item() == 4.0, f"{impl}: {y.item()}"
