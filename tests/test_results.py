"""The one result type: Result rows in a ResultTable (repr, exports, best)."""
import json
import math

import pytest
import torch

from rawconv import ConvProblem
from rawconv.check import check, conv_reference, abs_reference
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


# ---------------------------------------------------------------- what a notebook shows
def _compare_like():
    """Rows of two problems as compare makes them (problem names; torch reference rows; every status)."""
    rows = []
    for name, scale in (("layerA", 1.0), ("layerB", 30.0)):
        rows += [
            Result("torch", "default", name, status="ok", median_ms=0.5 * scale, min_ms=0.45 * scale, runs=10,
                   reference=True),
            Result("torch", "mkldnn disabled", name, status="ok", median_ms=2.0 * scale, min_ms=1.9 * scale, runs=10,
                   reference=True),
            Result("onednn", "[0] jit:avx2", name, status="ok", median_ms=0.3 * scale, min_ms=0.25 * scale, runs=10,
                   extra={"choice": "jit:avx2@any", "max_rel": 1e-7}),
            Result("onednn", "[1] x64:gemm:jit", name, status="wrong", median_ms=0.1 * scale, min_ms=0.1 * scale,
                   runs=10, extra={"choice": "x64:gemm:jit@any", "max_rel": 3e-2}),
            Result("onednn", "[2] ref:any", name, status="skipped", message="not run: estimated 3 s <per> call",
                   extra={"choice": "ref:any@any"}),
        ]
    return ResultTable(rows, title="rawconv compare: 2 problem(s)")


def test_html_table_marks_best_wrong_grey_and_torch_and_escapes():
    t = _table()
    t.title = "tiny <b>& co</b>"
    html = t._repr_html_()
    assert "tiny &lt;b&gt;&amp; co&lt;/b&gt;" in html and "<b>& co" not in html
    rows = html.split("<tr")
    best = next(r for r in rows if "jit:avx2@any" in r)
    wrong = next(r for r in rows if "x64:gemm:jit@any" in r)
    skipped = next(r for r in rows if "ref:any@any" in r)
    torch_row = next(r for r in rows if "default" in r and "torch" in r)
    assert "rgba(46,160,67" in best and "&#9733;" in best                    # green ground, a star
    assert "rgba(229,72,77" in wrong and "rgba(46,160,67" not in wrong      # red ground
    assert "opacity:0.55" in skipped and "estimated 3 s per call" in skipped  # grey, the reason shown
    assert "torch&#x27;s own choice" in torch_row and "font-style:italic" in torch_row
    assert "fastest correct" in html and "outside tolerance" in html        # the legend
    # the one row's own HTML, and a listing (no times) shows no time columns
    assert "<table" in t[1]._repr_html_()
    from rawconv import onednn

    listing = onednn.implementations(torch.randn(1, 4, 6, 6), torch.randn(4, 4, 3, 3))
    lh = listing._repr_html_()
    assert "median ms" not in lh and ">status<" not in lh and listing[0].choice in lh
    assert "Implementation(" not in lh and "Implementation(" not in repr(listing[0])
    assert repr(listing[0]).startswith("<Implementation [0] ") and listing[0].name in repr(listing[0])


def test_multi_problem_text_and_html_group_by_problem():
    t = _compare_like()
    text = repr(t)
    assert text.splitlines()[1].split()[0] == "problem"
    assert sum(line.startswith("layerB") for line in text.splitlines()) == 5
    html = t._repr_html_()
    assert html.count('colspan=') == 2 and html.count("&#9733; [0] jit:avx2") == 2   # a header, a winner per problem
    assert isinstance(t[1:3], ResultTable) and t[1:3].title == t.title


def test_bar_plot_per_problem_with_reference_line_wrong_hatched_and_not_run_listed():
    import matplotlib

    t = _compare_like()
    one = t.where(problem="layerA")
    fig = one.plot()
    assert isinstance(fig, matplotlib.figure.Figure) and len(fig.axes) == 1
    ax = fig.axes[0]
    labels = [lab.get_text() for lab in ax.get_yticklabels()]
    assert "[1] x64:gemm:jit" in labels and "[2] ref:any" in labels and "torch: mkldnn disabled" in labels
    assert not any(lab.startswith("torch: default") for lab in labels)      # torch default is the line
    lines = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
    assert [ln.get_xdata()[0] for ln in lines] == [pytest.approx(0.5)]
    bars = {lab: p for lab, p in zip([lab for lab in labels if not lab.startswith("[2]")], ax.patches)}
    assert bars["[1] x64:gemm:jit"].get_hatch() == "///"
    assert bars["[0] jit:avx2"].get_width() == pytest.approx(0.3)
    texts = [tx.get_text() for tx in ax.texts]
    assert any(tx.startswith("not run: skipped") for tx in texts) and any("WRONG" in tx for tx in texts)
    assert ax.get_xscale() == "log"           # 0.1 .. 2.0 ms spans more than a decade
    assert one.where(backend="onednn").where(status="ok").plot().axes[0].get_xscale() == "linear"
    assert len(t.plot().axes) == 2            # one panel per problem
    with pytest.raises(Exception, match="one panel"):
        t.plot(ax=ax)
    with pytest.raises(ValueError, match="kind"):
        t.plot(kind="pie")
    with pytest.raises(ValueError, match="nothing to plot"):
        ResultTable([]).plot()


def test_heatmap_is_time_relative_to_torch_default():
    import numpy as np

    t = _compare_like()
    fig = t.plot(kind="heatmap")
    ax = fig.axes[0]
    assert [lab.get_text() for lab in ax.get_yticklabels()] == ["layerA", "layerB"]
    cols = [lab.get_text() for lab in ax.get_xticklabels()]
    assert cols == ["torch: mkldnn disabled", "jit:avx2@any", "x64:gemm:jit@any", "ref:any@any"]
    data = ax.images[0].get_array()
    # log2 of median / torch default median, per layer: jit:avx2 0.3/0.5 on both
    assert np.allclose(2.0 ** data[:, 1], 0.6) and np.allclose(2.0 ** data[:, 0], 4.0)
    texts = [tx.get_text() for tx in ax.texts]
    assert texts.count("wrong") == 2 and texts.count("n/r") == 2
    assert texts.count("0.60") == 2 and texts.count("4.00") == 2


def test_heatmap_cells_never_read_as_zero():
    """A candidate 300x faster than torch's default (ratio 0.0031) reads 0.0031, not 0.00."""
    t = ResultTable([Result("torch", "default", "layer1.0.conv1", status="ok", median_ms=32.0, min_ms=8.0, runs=10,
                            reference=True),
                     Result("onednn", "x64:gemm:jit", "layer1.0.conv1", status="ok", median_ms=0.1, min_ms=0.1,
                            runs=10, extra={"choice": "x64:gemm:jit@any"}),
                     Result("onednn", "slow", "layer1.0.conv1", status="ok", median_ms=32.0 * 250, min_ms=1.0,
                            runs=10, extra={"choice": "slow@any"}),
                     Result("onednn", "tiny", "layer1.0.conv1", status="ok", median_ms=32.0 * 2.2e-5, min_ms=1e-4,
                            runs=10, extra={"choice": "tiny@any"})])
    texts = [tx.get_text() for tx in t.plot(kind="heatmap").axes[0].texts]
    # torch default's median/min is 4 here: every ratio to it is marked as not to be trusted ("!")
    assert sorted(texts) == sorted(["0.0031!", "250!", "2.2e-05!"]), texts


def test_reprs_are_readable_not_dataclass_dumps():
    from rawconv import onednn
    from rawconv.cudnn import RunInfo
    from rawconv.cudnn_graph import EngineConfig

    caps = repr(onednn.capabilities())
    assert caps.startswith("oneDNN ") and "CapabilityRow(" not in caps
    assert "CapabilityRow(" not in repr(onednn.capabilities().rows[0])
    info = repr(RunInfo("forward", "IMPLICIT_GEMM", 0, "fma", "fma", 0, True))
    assert info.startswith("<RunInfo forward IMPLICIT_GEMM@fma") and "algo_id=" not in info
    ec = repr(EngineConfig(28, ((2, 3),)))
    assert ec.startswith("<EngineConfig eng28{k2=3}") and "numerical_notes=" not in ec
    r = repr(_table()[1])
    assert r.startswith("<Result onednn jit:avx2@any ok") and "ErrorStats(" not in r


@pytest.fixture
def notes(monkeypatch):
    """What the progress bars were told, bar by bar: [(desc, [notes...])]."""
    from rawconv.core import progress as _progress

    seen = []
    init, note = _progress._Bar.__init__, _progress._Bar.note

    def spy_init(self, show, total=None, desc="", *a, **kw):
        init(self, show, total, desc, *a, **kw)
        seen.append((desc, show, []))
        self._spy = seen[-1][2]

    def spy_note(self, text):
        self._spy.append(text)
        note(self, text)

    monkeypatch.setattr(_progress._Bar, "__init__", spy_init)
    monkeypatch.setattr(_progress._Bar, "note", spy_note)
    return seen


def test_progress_argument_and_autotune_bar_names_the_candidate(capsys, notes):
    from rawconv import onednn
    from rawconv.core import progress as _progress
    from rawconv.errors import ArgumentTypeError

    assert _progress.enabled(True) and not _progress.enabled(False)
    with pytest.raises(ArgumentTypeError):
        _progress.enabled("yes")
    conv = onednn.Convolution(torch.randn(1, 4, 6, 6), torch.randn(4, 4, 3, 3))
    table = conv.autotune(iterations=1, warmup=0, progress=True)
    assert "oneDNN autotune" in capsys.readouterr().err          # tqdm drew on stderr
    desc, shown, named = notes[-1]
    assert desc == "oneDNN autotune" and shown and set(named) == {r.choice for r in table}
    conv.autotune(iterations=1, warmup=0, progress=False)
    assert "oneDNN autotune" not in capsys.readouterr().err and notes[-1][1] is False
    with pytest.raises(ArgumentTypeError):
        conv.autotune(progress="yes")


def test_compare_progress_names_layer_and_candidate(capsys, notes):
    from rawconv import compare, onednn

    p = ConvProblem(n=1, c=4, k=4, in_spatial=(6, 6), kernel=(3, 3), name="tinylayer")
    rows = compare.compare([p], iterations=1, warmup=0, budget_s=0.01, include_ref=False, progress=True)
    assert "compare" in capsys.readouterr().err
    desc, shown, named = notes[0]
    assert desc == "compare" and shown and named[0] == "tinylayer"
    first = onednn.Convolution.from_problem(p).implementations[0].choice   # each row by its one name
    assert "tinylayer: torch default" in named and f"tinylayer: onednn {first}" in named
    assert isinstance(rows, ResultTable) and all(r.choice for r in rows)
    offered = {i.choice for i in onednn.Convolution.from_problem(p).implementations}
    assert {r.choice for r in rows if r.backend == "onednn"} <= offered


def test_cli_compare_writes_plot_csv_json(tmp_path):
    import csv as _csv

    from rawconv import cli

    out = {k: tmp_path / f"out.{k}" for k in ("png", "csv", "json")}
    code = cli.main(["compare", "mb1ic4ih8oc4oh8kh3ph1", "--device", "cpu", "--iterations", "2", "--warmup", "0",
                     "--budget", "0.02", "--no-ref", "--quiet", "--plot", str(out["png"]), "--csv", str(out["csv"]),
                     "--json", str(out["json"])])
    assert code == 0
    assert out["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads(out["json"].read_text())
    rows = list(_csv.DictReader(out["csv"].open()))
    assert len(rows) == len(data["rows"]) > 2
    assert [r["name"] for r in rows] == [r["name"] for r in data["rows"]]
    assert data["meta"]["outputs"] == {"json": str(out["json"]), "plot": str(out["png"]), "csv": str(out["csv"])}
    assert all(r["choice"] for r in data["rows"]) and "summary" in data and "problems" in data
