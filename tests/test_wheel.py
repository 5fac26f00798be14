"""The built wheel carries cdefs/ and runs a convolution outside the source tree."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_ships_cdefs_and_runs_outside_the_source_tree(tmp_path):
    wheels = tmp_path / "wheels"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = wheels.glob("rawconv-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    assert "rawconv/cdefs/dnnl.h" in names
    assert any(n.startswith("rawconv/cdefs/cudnn") for n in names) or not list((ROOT / "cdefs").glob("cudnn*.h"))
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(whl)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    code = (
        "import rawconv, torch, torch.nn.functional as F\n"
        "from rawconv.core import loader as _loader\n"
        "assert rawconv.__file__.startswith(%r), rawconv.__file__\n"
        "x = torch.randn(2, 8, 10, 10); w = torch.randn(4, 8, 3, 3)\n"
        "y = rawconv.onednn.forward(x, w, padding=1)\n"
        "torch.testing.assert_close(y, F.conv2d(x, w, padding=1), rtol=1e-4, atol=1e-4)\n"
        "print('ok', rawconv.onednn.info()['found_via'])\n" % str(target))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(target)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("ok")
