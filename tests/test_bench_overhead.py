"""benchmarks/bench_overhead.py (issue 38): its floor operators compute torch's results with
rawconv's schemas, and the script runs end to end on the CPU (no timing is asserted)."""
from __future__ import annotations

import functools
import importlib.util
import pathlib
import subprocess
import sys

import pytest
import torch

import rawconv.ops  # noqa: F401  (torch.ops.rawconv)

_PATH = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "bench_overhead.py"


@functools.lru_cache(maxsize=None)
def _module():   # loaded once: its floor operators are registered once per process
    spec = importlib.util.spec_from_file_location("bench_overhead", _PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("bias", [False, True])
def test_floor_operators_match_rawconv_and_share_its_schemas(layout, bias):
    f_fwd, f_data, f_wts = _module().register_floor()
    for f, r in ((f_fwd, torch.ops.rawconv.conv_forward.default),
                 (f_data, torch.ops.rawconv.conv_backward_data.default),
                 (f_wts, torch.ops.rawconv.conv_backward_weights.default)):
        assert str(f._schema).split("(", 1)[1] == str(r._schema).split("(", 1)[1]
    fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 7, 6, generator=g).contiguous(memory_format=fmt)
    w = torch.randn(5, 4, 3, 3, generator=g).contiguous(memory_format=fmt)
    b = torch.randn(5, generator=g) if bias else None
    s, p = [2, 1], [1, 1]
    y = f_fwd(x, w, b, s, p, p, [1, 1], 1, "auto", "", "strict", "", "")
    torch.testing.assert_close(y, torch.ops.rawconv.conv_forward(x, w, b, s, p, p, [1, 1], 1, "auto", "", "strict",
                                                                 "", ""), rtol=1e-4, atol=1e-4)
    gy = torch.randn(y.shape, generator=g)
    dx = f_data(gy, w, list(x.shape), s, p, p, [1, 1], 1, "auto", "", "strict")
    assert dx.shape == x.shape
    torch.testing.assert_close(dx, torch.ops.rawconv.conv_backward_data(gy, w, list(x.shape), s, p, p, [1, 1], 1,
                                                                        "auto", "", "strict"), rtol=1e-4, atol=1e-4)
    dw, db = f_wts(x, gy, list(w.shape), s, p, p, [1, 1], 1, bias, "auto", "", "strict")
    rdw, rdb = torch.ops.rawconv.conv_backward_weights(x, gy, list(w.shape), s, p, p, [1, 1], 1, bias, "auto", "",
                                                       "strict")
    torch.testing.assert_close(dw, rdw, rtol=1e-4, atol=1e-4)
    assert db.shape == rdb.shape == ((5,) if bias else (0,))
    torch.testing.assert_close(db, rdb, rtol=1e-4, atol=1e-4)


def test_script_runs_on_the_cpu():
    out = subprocess.run([sys.executable, str(_PATH), "--rounds", "2", "--calls", "5", "--clock", "cpu"],
                         capture_output=True, text=True, timeout=300, cwd=_PATH.parents[1])
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    for d in ("forward", "backward_data", "backward_weights"):
        rows = [ln.split() for ln in lines if ln.split()[:1] == [d]]
        assert [" ".join(r[1:-4]) for r in rows] == ["torch aten", "floor", "rawconv onednn"], out.stdout
        assert all(float(v) > 0 for r in rows for v in r[-4:-2])
