"""rawconv.onednn.flush_denormals applies to every thread oneDNN computes on (issue 13).

float32 inputs that are subnormal (``finfo.tiny / 256``) and weights of 0.5 (backward weights: x of
1.0) give outputs that are exact multiples of 2**-134 (subnormal forward and backward data, normal
backward weights): with flushing on, EVERY output of every listed implementation and direction must
be 0 (DAZ/FTZ on the master and on each OpenMP worker); with it off, every output must equal the
float64 result exactly. ``torch.set_flush_denormal(True)`` sets only the calling thread: rawconv's setting
must override it in both directions. The threads are at least 2 where the machine has 2 CPUs.
"""
from __future__ import annotations

import os
import platform

import pytest
import torch

from rawconv import ArgumentTypeError, ConvProblem, check, onednn

pytestmark = [pytest.mark.usefixtures("dnnl"),
              pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                                 reason="MXCSR's FTZ/DAZ are x86-64's")]

TINY = torch.finfo(torch.float32).tiny


@pytest.fixture
def threads():
    old = torch.get_num_threads()
    torch.set_num_threads(max(2, min(4, os.cpu_count() or 1)))
    yield torch.get_num_threads()
    onednn.flush_denormals(False)
    torch.set_flush_denormal(False)
    torch.set_num_threads(old)


def _cases():
    x = torch.full((8, 16, 16, 16), TINY / 256)                # subnormal, exact in float32
    w = torch.full((16, 16, 3, 3), 0.5)
    gy = torch.full((8, 16, 16, 16), TINY / 256)
    p = ConvProblem.from_torch(x, w, None, 1, 1)
    return p, {"forward": (x, w), "backward_data": (gy, w), "backward_weights": (torch.ones_like(x), gy)}


def _run(direction, tensors, impl):
    a, b = tensors
    if direction == "forward":
        return onednn.forward(a, b, padding=1, impl=impl)
    if direction == "backward_data":
        return onednn.backward_data(a, b, a.shape, padding=1, impl=impl)
    return onednn.backward_weights(a, b, (16, 16, 3, 3), padding=1, impl=impl)


@pytest.mark.parametrize("direction", ["forward", "backward_data", "backward_weights"])
def test_flush_denormals_reaches_every_thread_and_every_implementation(threads, direction):
    p, cases = _cases()
    tensors = cases[direction]
    names = {"forward": ("x", "w"), "backward_data": ("dy", "w"), "backward_weights": ("x", "dy")}[direction]
    ref, _ = check.reference(p, direction, dict(zip(names, tensors)))
    if direction != "backward_weights":
        assert ref.abs().max() < TINY and ref.abs().min() > 0    # every exact result is subnormal
    impls = onednn.implementations(*(cases["forward"]), padding=1, direction=direction)
    for impl in impls:
        if impl.known_bad:
            continue
        torch.set_flush_denormal(False)
        onednn.flush_denormals(True)
        y = _run(direction, tensors, impl.index)
        assert torch.count_nonzero(y) == 0, f"{impl}: {torch.count_nonzero(y)} of {y.numel()} not flushed"
        torch.set_flush_denormal(True)                     # the calling thread only: rawconv's setting wins
        onednn.flush_denormals(False)
        y = _run(direction, tensors, impl.index)
        torch.testing.assert_close(y.double(), ref, rtol=0, atol=0, msg=f"{impl}: subnormals were flushed")


def test_flush_denormals_takes_a_bool():
    with pytest.raises(ArgumentTypeError):
        onednn.flush_denormals(1)


def test_docs_denormals_snippet_runs_on_its_own():
    """The snippet of the Denormals page (docs/guides/denormals.md, moved there from the README) is
    complete (its imports included): run alone, in a fresh interpreter."""
    import os
    import re
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "docs", "guides", "denormals.md")) as f:
        text = f.read()
    section = text[text.index("# Denormals"):]
    snippet = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert "flush_denormals(True)" in snippet
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, env=env, timeout=120,
                       cwd=str(os.path.dirname(root)))
    assert r.returncode == 0, r.stderr
