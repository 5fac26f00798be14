"""The one result type: Result rows in a ResultTable (repr, exports, best)."""
import json
import math

import pytest
import torch

from rawconv import ConvProblem
from rawconv.check import ErrorStats, check, conv_reference, abs_reference
from rawconv.results import Result, ResultTable, status_group


def _p():
    return ConvProblem(n=1, c=4, k=4, in_spatial=(6, 6), kernel=(3, 3), name="tiny")


def _table():
    p = _p()
    x, w, _ = p.make_inputs()
    ref, ra = conv_reference(p, x, w), abs_reference(p, x, w)
    good = check(p, ref.to(torch.float32), ref, ra)
    bad = check(p, ref.to(torch.float32) * 1.01, ref, ra)
    return ResultTable([
        Result("torch", "default", p, status="ok", median_ms=0.5, min_ms=0.4, runs=10, accuracy=good, reference=True),
        Result("onednn", "jit:avx2@any", p, status="ok", median_ms=0.3, min_ms=0.25, runs=10, accuracy=good,
               workspace_bytes=128),
        Result("onednn", "x64:gemm:jit@any", p, status="wrong", median_ms=0.1, min_ms=0.1, runs=10, accuracy=bad),
        Result("onednn", "ref:any@any", p, status="skipped", message="estimated 3 s per call"),
    ], title=str(p))


def test_statuses_and_derived_fields():
    t = _table()
    assert [r.group for r in t] == ["ok", "ok", "wrong", "skipped"]
    assert status_group("crashed: SIGSEGV") == "failed" and status_group("timed out after 5 s") == "failed"
    r = t[1]
    assert r.ok and r.spread == pytest.approx(0.3 / 0.25)
    assert r.gflops == pytest.approx(_p().flops / 0.3e6)
    assert t[2].max_rel > 0.005 and not t[2].ok
    assert math.isnan(t[3].gflops) and math.isnan(t[3].spread)


def test_best_is_fastest_correct_rawconv_row():
    t = _table()
    # the wrong row is faster and torch's reference row is not a rawconv candidate
    assert t.best().name == "jit:avx2@any"
    assert ResultTable([t[0]]).best() is None


def test_repr_is_a_readable_table_with_whole_numbers():
    text = repr(_table())
    lines = text.splitlines()
    assert lines[0] == "tiny: 2d float32 nchw x(1,4,6,6) w(4,4,3,3)"
    assert "0.3000" in text and "0.2500" in text and "jit:avx2@any" in text
    assert "(* torch's own choice, for reference)" in lines[-1]


def test_exports_agree(tmp_path):
    t = _table()
    data = json.loads(t.to_json(str(tmp_path / "t.json")))
    assert json.loads((tmp_path / "t.json").read_text()) == data
    assert [d["status"] for d in data["rows"]] == ["ok", "ok", "wrong", "skipped"]
    assert data["rows"][1]["workspace_bytes"] == 128 and data["rows"][3]["median_ms"] is None
    text = t.to_csv(str(tmp_path / "t.csv"))
    assert text.splitlines()[0].startswith("problem,backend,name,direction,status")
    assert len(text.splitlines()) == 5
    df = t.to_pandas()
    assert list(df["name"]) == [r.name for r in t] and math.isnan(df["median_ms"][3])
