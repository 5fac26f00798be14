"""The model zoo's CUDA code paths at a tiny size (benchmarks/zoo.py; the timed runs are in
docs/guides/zoo.md): every CUDA variant (CUDA graphs, torch.compile, the converted model under both)
and the training step under autocast float16 build, run and are right; the depthwise table runs."""
from __future__ import annotations

import pytest
import torch

from test_zoo_cpu import _zoo   # benchmarks/zoo.py, loaded once


@pytest.mark.gpu
@pytest.mark.slow   # four torch.compile calls (about a minute)
def test_zoo_every_cuda_variant_runs_right_at_a_tiny_size(tmp_path, capsys):
    zoo = _zoo()
    bench = torch.backends.cudnn.benchmark
    try:
        res = zoo.main(["--device", "cuda", "--batch", "2", "--size", "32", "--models", "m5,convt_decoder",
                        "--gpu-repeats", "3", "--autotune-budget", "0.1", "--json", str(tmp_path / "z.json")])
    finally:
        torch.backends.cudnn.benchmark = bench
    rows = {(r["model"], r["variant"]): r for r in res["rows"]}
    want = set(zoo.VARIANTS_CUDA) | set(zoo.TRAIN_ROWS)
    assert set(rows) == {(m, v) for m in ("m5", "convt_decoder") for v in want}
    for key, r in rows.items():
        assert r["status"] == "ok", (key, r)
        assert r["ms"] > 0 and r["wall_ms"] > 0 and r["err"] is not None, (key, r)
    out = capsys.readouterr().out
    assert "WRONG: 0" in out and "ERROR: 0" in out and "target (GPU): rawconv_compile" in out


@pytest.mark.gpu
def test_zoo_depthwise_table_runs_on_cuda(capsys):
    zoo = _zoo()
    res = zoo.main(["--depthwise", "--device", "cuda", "--batch", "2", "--models", "convnext_tiny",
                    "--gpu-repeats", "3", "--autotune-budget", "0.1"])
    rows = res["depthwise"]
    assert len(rows) == 4
    for r in rows:
        assert not any(k.endswith("error") for k in r), r
        for side in zoo.DW_SIDES:
            assert r[side + "_us"] > 0 and r[side + "_err"] < 1e-2, (side, r)
        assert r["torch_ran"]
    assert "geomean torch/rawconv" in capsys.readouterr().out
