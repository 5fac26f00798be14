"""tools/run_torch_conv_tests.py (PyTorch's conv tests with rawconv's modules in torch.nn's place)
on a small unittest file of its own: per-test status, and the tags it exists for (a rawconv
InternalError, an error class torch code does not catch, a refusal beside torch's result). Run in a
child process: the harness replaces torch.nn's classes for the whole process."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SAMPLE = '''
import unittest

import torch
import torch.nn as nn


class T(unittest.TestCase):
    def test_forward(self):
        m = nn.Conv2d(3, 4, 3)
        self.assertEqual(m(torch.randn(1, 3, 8, 8)).shape, (1, 4, 6, 6))
        self.assertIn("rawconv", type(m).__module__)

    def test_output_size_value_error(self):
        m = nn.ConvTranspose2d(3, 4, 3, 3, 0, 2)
        with self.assertRaises(ValueError):
            m(torch.randn(2, 3, 6, 6), output_size=(15, 15))

    def test_kernel_too_large_runtime_error(self):
        with self.assertRaisesRegex(RuntimeError, "Kernel size can't be greater"):
            nn.Conv1d(3, 33, 10)(torch.randn(1, 3, 4))

    def test_channels_last_weight(self):
        m = nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)
        self.assertTrue(m(torch.randn(2, 3, 8, 8)).is_contiguous(memory_format=torch.channels_last))

    def test_float64_refused(self):
        # a pinned choice never falls back to torch's kernel: rawconv refuses what torch runs
        nn.Conv2d(3, 4, 3, choice="x64:gemm:jit").double()(torch.randn(1, 3, 8, 8, dtype=torch.float64))

    def test_float64_on_torchs_kernel(self):
        m = nn.Conv2d(3, 4, 3).double()
        x = torch.randn(1, 3, 8, 8, dtype=torch.float64)
        self.assertTrue(torch.equal(m(x), torch.nn.functional.conv2d(x, m.weight, m.bias)))

    def test_internal_error_seen_even_when_caught(self):
        from rawconv.errors import InternalError
        try:
            raise InternalError("made by the test")
        except RuntimeError:
            pass

    def test_error_type_mismatch(self):
        import rawconv.ops
        with self.assertRaises(TypeError):
            rawconv.ops.conv(torch.randn(1, 3, 2, 2), torch.randn(4, 3, 3, 3))
'''


@pytest.mark.usefixtures("dnnl")
def test_harness_reports_status_and_tags(tmp_path):
    f = tmp_path / "test_sample.py"
    f.write_text(SAMPLE)
    out = tmp_path / "rows.json"
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "run_torch_conv_tests.py"), "--file", str(f),
                        "--json", str(out)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {k.rsplit(".", 1)[-1]: v for k, v in json.loads(out.read_text())["tests"].items()}
    st = {k: v["status"] for k, v in rows.items()}
    assert st == {"test_forward": "pass", "test_output_size_value_error": "pass",
                  "test_kernel_too_large_runtime_error": "pass", "test_channels_last_weight": "pass",
                  "test_float64_refused": "error", "test_internal_error_seen_even_when_caught": "pass",
                  "test_error_type_mismatch": "error", "test_float64_on_torchs_kernel": "pass"}, r.stdout
    assert rows["test_float64_refused"]["tags"] == ["refused"]
    assert "float64" in rows["test_float64_refused"]["known"]
    assert rows["test_internal_error_seen_even_when_caught"]["tags"] == ["internal"]
    assert rows["test_error_type_mismatch"]["tags"] == ["error-type"]
    assert rows["test_forward"]["rawconv_calls"] == 1 and rows["test_forward"]["tags"] == []
    assert rows["test_float64_on_torchs_kernel"]["tags"] == [] and \
        rows["test_float64_on_torchs_kernel"]["rawconv_calls"] == 1
    assert "summary" in r.stdout and "6 pass, 2 error" in r.stdout
    assert "module calls run on torch's own kernel: 1 (1: float64 on the CPU" in r.stdout
    assert r.stdout.count("\n") < 60


def test_harness_without_a_file_says_how_to_get_one(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "run_torch_conv_tests.py"), "--file",
                        str(tmp_path / "missing.py")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--download" in r.stderr
