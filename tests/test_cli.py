"""The command line, run as a user runs it (a subprocess), on small problems."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def rawconv(*args, cwd=None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "rawconv", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=600)


def test_compare_benchdnn_problem_writes_json(tmp_path):
    out = tmp_path / "r.json"
    r = rawconv("compare", "mb2ic8ih12oc8oh12kh3ph1", "--iterations", "2", "--json", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "summary: 1 problem(s)" in r.stdout
    data = json.loads(out.read_text())
    rows = data["rows"]
    backends = {row["backend"] for row in rows}
    assert backends == {"torch", "onednn"}
    impls = [row["implementation"] for row in rows if row["backend"] == "onednn"]
    assert any("ref:any" in i for i in impls) and len(impls) >= 3
    assert all(row["ok"] for row in rows), [row for row in rows if not row["ok"]]
    assert all(row["median_ms"] > 0 for row in rows)
    torch_default = next(row for row in rows if row["implementation"] == "default")
    assert torch_default["detail"]   # which backend torch picked
    assert data["summary"]["within_tolerance"] == len(rows)
    assert data["meta"]["info"]["onednn"]["version"].startswith("3.")
    assert data["problems"][0]["benchdnn"].startswith("mb2ic8ih12iw12oc8") and data["meta"]["threads"] >= 1
    assert all(row["extra"]["problem"] == data["problems"][0]["describe"] for row in rows)


def test_compare_flags_and_preset_layer_with_photo(tmp_path):
    out = tmp_path / "p.json"
    r = rawconv("compare", "--input", "1x4x9x9", "--weight", "6x4x3x3", "--padding", "0:1,1:0", "--stride", "2",
                "--iterations", "1", "--no-ref", "--json", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(out.read_text())["summary"]["problems"] == 1
    r = rawconv("compare", "resnet50", "--layers", "conv1", "--iterations", "1", "--budget", "0.05", "--no-ref",
                "--layout", "nhwc", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "input is matplotlib's sample photo" in r.stdout and "conv1" in r.stdout


def test_info_json():
    r = rawconv("info", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["onednn"]["path"].endswith("libdnnl.so.3") and data["onednn"]["found_via"]
    assert "version" in data["torch"] and "cudnn" in data


def test_list_implementations():
    r = rawconv("list", "mb1ic16ih10oc16oh10kh3ph1", "--direction", "backward_data")
    assert r.returncode == 0, r.stderr
    assert "ref:any" in r.stdout and "backward_data" in r.stdout


@pytest.mark.parametrize("args, words", [
    (["compare", "mb2ic8ih12oc8oh12kh3ph1zz"], "cannot parse"),
    (["compare", "--input", "2x4x8x8", "--weight", "4x3x3x3"], "input channels"),
    (["compare", "--input", "2x4x8x8"], "--input and --weight"),
    (["compare", "resnet50", "--layers", "nosuchlayer"], "matches none"),
])
def test_bad_cli_input_is_a_message_not_a_traceback(args, words):
    r = rawconv(*args)
    assert r.returncode == 2
    assert words in r.stderr and "Traceback" not in r.stderr
