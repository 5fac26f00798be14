"""Comparisons a user can trust at a glance (issue 25's repros), one test each, as the issue
states them: like-for-like headline, noise flags in every output, every direction, errors that
are the user's, the library version named, output that reads in a notebook export and a pipe."""
from __future__ import annotations

import pytest
import torch

from rawconv import ConvProblem, compare, onednn
from rawconv.errors import ArgumentTypeError, InternalError

pytestmark = pytest.mark.usefixtures("dnnl")


# ---------------------------------------------------------------------------- errors
def test_a_wrong_keyword_is_the_users_type_error_not_an_internal_error():
    """``onednn.Convolution(x, w, direction=...)`` and ``compare.compare(..., direction=...)`` raised
    InternalError ("please report"): a keyword the function does not take is the caller's TypeError."""
    x, w = torch.randn(1, 4, 6, 6), torch.randn(4, 4, 3, 3)
    with pytest.raises(ArgumentTypeError, match="unexpected keyword argument 'direktion'") as ei:
        onednn.Convolution(x, w, direktion="backward_data")
    assert isinstance(ei.value, TypeError) and not isinstance(ei.value, InternalError)
    p = ConvProblem.from_torch(x, w)
    with pytest.raises(ArgumentTypeError, match="unexpected keyword argument 'directon'"):
        compare.compare([p], directon="backward_data", progress=False)
    with pytest.raises(ArgumentTypeError, match="too many positional"):
        compare.compare_problem(p, 3)
    # a TypeError raised inside a function whose arguments fit stays an internal error
    from rawconv.core import guard as _guard

    @_guard.public
    def f(a):
        raise TypeError("a bug")

    with pytest.raises(InternalError, match="a bug"):
        f(1)


# ---------------------------------------------------------------------------- like-for-like headline
def _row(name, ms, *, backend="onednn", weights=None, index=None, library="oneDNN 3.2.0", machine=None,
         mn=None, problem="p"):
    extra = {"library": library}
    if weights is not None:
        extra["weights"] = weights
    if index is not None:
        extra["index"] = index
    if machine is not None:
        extra["machine"] = machine
    return compare.Row(problem, backend, name, median_ms=ms, min_ms=mn if mn is not None else ms * 0.98, runs=5,
                       ok=True, status="ok", extra=extra)


def _torch(ms, **kw):
    return _row("default", ms, backend="torch", library="torch 2.14.1's oneDNN 3.12.0", weights="per call", **kw)


def test_the_headline_compares_like_with_like_and_marks_best_of_n():
    """The summary set the best of all rawconv rows, prepacked ones included (weights reordered
    once), against torch's one call, which reads its weights on every call: 2.00x here. The
    like-for-like figure uses rows that read their weights on every call too (1.33x), beside
    oneDNN's first choice (no selection: 1.11x), and says it is a best of N."""
    rows = [_torch(2.0),
            _row("[0] brgconv:avx2", 1.8, weights="per call", index=0),
            _row("[0] brgconv:avx2 (prepacked)", 1.0, weights="prepacked", index=0),
            _row("[1] x64:gemm:jit", 1.5, weights="as given", index=1)]
    s = compare.summary(rows)
    assert s["geomean_torch_over_best"] == pytest.approx(2.0 / 1.5)
    assert s["geomean_torch_over_first_choice"] == pytest.approx(2.0 / 1.8)
    assert s["geomean_torch_over_best_prepacked"] == pytest.approx(2.0)
    assert s["best_of"] == [2, 2] and s["per_problem"][0]["best"] == "[1] x64:gemm:jit"
    text = "\n".join(compare.headline(s))
    assert "like for like (weights read on every call by both" in text
    assert "oneDNN's first choice 1.11x" in text and "best of 2 per problem 1.33x" in text
    assert "best-of-N favours rawconv" in text and "prepacked (reordered once" in text and "2.00x" in text
    # --no-prepack: no prepacked rows, no prepacked line
    s = compare.summary([r for r in rows if r.extra.get("weights") != "prepacked"])
    assert s["geomean_torch_over_best_prepacked"] is None and "prepacked" not in "\n".join(compare.headline(s))


def test_compare_times_both_weight_handlings_and_names_each_library():
    p = ConvProblem.from_benchdnn("mb1ic8ih10oc8oh10kh3ph1")
    rows = compare.compare_problem(p, iterations=1, warmup=0, budget_s=0.02, include_ref=False)
    libs = compare.libraries()
    assert libs["onednn"] == f"oneDNN {onednn.library_version()}"
    torch_rows = [r for r in rows if r.backend == "torch"]
    assert all(r.library.startswith(f"torch {torch.__version__.split('+')[0]}") for r in torch_rows)
    ones = [r for r in rows if r.backend == "onednn"]
    assert ones and all(r.library == libs["onednn"] for r in ones)
    assert {r.extra["weights"] for r in ones} <= {"per call", "prepacked", "as given"}
    for r in ones:   # a prepacked row for every implementation whose weights need a reorder
        if "w" in r.extra["reorders"] and r.extra["weights"] == "per call":
            twin = [q for q in ones if q.name == r.name + " (prepacked)"]
            assert len(twin) == 1 and twin[0].extra["weights"] == "prepacked" and "weights(once)" in twin[0].detail
    assert all(r.status == "ok" for r in rows), [(r.name, r.status, r.error) for r in rows]
    only = compare.compare_problem(p, iterations=1, warmup=0, budget_s=0.02, include_ref=False, prepack=False)
    assert not any(r.extra.get("weights") == "prepacked" for r in only)
    t = compare.compare([p], iterations=1, warmup=0, budget_s=0.02, include_ref=False, progress=False)
    assert libs["onednn"] in t.title and libs["torch"] in t.title
    assert "library" in t.to_csv().splitlines()[0].split(",") and libs["onednn"] in t._repr_html_()


# ---------------------------------------------------------------------------- noise flags everywhere
BUSY = {"seconds": 0.5, "cpus": 2, "threads": 2, "other_cpus": 1.0, "waited": 1.0, "loadavg": 3.0,
        "oversubscribed": True}


def _busy_rows():
    # a busy run: steady medians (median/min 1.0) many times the quiet time, every row oversubscribed
    return [_torch(24.0, machine=BUSY, mn=24.0), _row("[0] jit:avx2", 24.0, weights="per call", index=0,
                                                      machine=BUSY, mn=24.0)]


def test_a_busy_run_is_flagged_in_csv_json_html_plots_and_pandas():
    """On a busy run the CSV's unstable column read False (median/min near 1), the PNG and HTML carried
    no mark: every output now carries the row's and the run's reliability."""
    import csv
    import io
    import json

    from rawconv.results import ResultTable

    t = ResultTable(_busy_rows(), title="busy")
    rel = t.reliability()
    assert rel["trustworthy"] is False and "oversubscribed" in rel["warnings"][0]
    rows = list(csv.DictReader(io.StringIO(t.to_csv())))
    assert all(r["unstable"] == "True" and r["oversubscribed"] == "True" for r in rows)
    assert all(r["run_timings_trustworthy"] == "False" and "oversubscribed" in r["run_timing_warnings"] for r in rows)
    data = json.loads(t.to_json())
    assert data["timing"]["trustworthy"] is False and all(r["unstable"] for r in data["rows"])
    html = t._repr_html_()
    assert "UNRELIABLE timings" in html and "machine oversubscribed while timed" in html
    assert "UNRELIABLE timings" in str(t)
    for kind in ("bars", "heatmap"):
        fig = t.plot(kind=kind)
        titles = [fig._suptitle.get_text() if fig._suptitle else ""] + [a.get_title(loc="left") for a in fig.axes]
        assert any("UNRELIABLE timings" in x for x in titles), (kind, titles)
        texts = [tx.get_text() for a in fig.axes for tx in a.texts]
        assert any("!" in x for x in texts), (kind, texts)
    assert t.to_pandas().attrs["timing"]["trustworthy"] is False
    calm = dict(BUSY, other_cpus=0.0, waited=0.0, loadavg=0.2, oversubscribed=False)
    quiet = ResultTable([_torch(0.3, machine=calm), _row("[0] jit:avx2", 0.2, weights="per call", index=0,
                                                          machine=calm)])
    assert quiet.reliability()["trustworthy"] is True and "UNRELIABLE" not in quiet._repr_html_()
    assert {r["run_timings_trustworthy"] for r in csv.DictReader(io.StringIO(quiet.to_csv()))} == {"True"}


def test_a_record_from_a_busy_run_says_so_and_replay_withholds_drift(tmp_path):
    """--record stored the noisy median (24 ms where 0.3 ms is normal) and a later quiet replay reported
    -81.7% "drift": the record now says its time is not to be trusted, and replay warns instead."""
    from rawconv import tuning

    p = ConvProblem.from_benchdnn("mb1ic8ih10oc8oh10kh3ph1").with_(name="p")
    rows = _busy_rows()
    plan = onednn.Convolution.from_problem(p)
    rows[1].extra.update(choice=plan.implementations[0].choice, layouts=plan.implementations[0].layouts,
                         formats=dict(plan.implementations[0].formats), reorders=list(plan.implementations[0].reorders),
                         device="cpu")
    recs = compare.records(rows, [p])
    assert len(recs) == 1 and recs[0].timing["trustworthy"] is False
    assert "machine oversubscribed while timed" in recs[0].timing["row_flags"]
    path = tmp_path / "r.json"
    tuning.TuningRecord.save_all(recs, path)
    loaded = tuning.TuningRecord.load(path)[0]
    assert loaded.timing["trustworthy"] is False and "not to be trusted" in str(loaded)
    again = compare.replay([loaded], iterations=1, warmup=0, budget_s=0.02, progress=False)
    assert again[0].status == "ok" and "drift" not in again[0].extra
    assert "quiet machine" in again[0].extra["drift_withheld"]
    s = compare.replay_summary(again)
    assert s["geomean_drift"] is None and len(s["drift_withheld"]) == 1
    assert "withheld" in again._repr_html_()
    # a trusted record still reports its drift
    trusted = compare.replay([loaded.with_(timing=dict(loaded.timing, trustworthy=True, row_flags=[]))],
                             iterations=1, warmup=0, budget_s=0.02, progress=False)
    assert isinstance(trusted[0].extra["drift"], float)
    # a problem this small runs on one thread (its plan's count): timed as compare times one-thread calls
    # (by its thread's CPU time; "mixed" where another thread of ours worked during some calls)
    assert loaded.key.options["threads"] == 1 and trusted[0].extra["rounds"]["measure"] in ("thread CPU", "mixed")
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "rawconv", "replay", str(path), "--iterations", "1", "--warmup", "0",
                        "--quiet"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "withheld" in r.stdout and "no drift for p" in r.stdout and "%" not in r.stdout.split("drift")[-1][:20]


# ---------------------------------------------------------------------------- every direction
@pytest.mark.parametrize("direction", ["backward_data", "backward_weights"])
def test_compare_runs_the_backward_directions(direction):
    """`rawconv compare --direction backward_data` was refused: compare covers every direction,
    torch's rows through aten.convolution_backward, rawconv's through oneDNN's backward primitives."""
    p = ConvProblem.from_benchdnn("mb2ic8ih10oc12oh10kh3ph1")
    rows = compare.compare_problem(p, iterations=1, warmup=0, budget_s=0.02, include_ref=False,
                                   direction=direction)
    assert {r.direction for r in rows} == {direction}
    assert [r.name for r in rows if r.backend == "torch"] == ["default", "mkldnn disabled"]
    assert sum(r.backend == "onednn" for r in rows) >= 2
    assert all(r.status == "ok" for r in rows), [(r.name, r.status, r.error) for r in rows]
    if direction == "backward_weights":   # the weights are not an input: no prepacked rows
        assert all(r.extra.get("weights") is None for r in rows if r.backend == "onednn")
    else:
        assert any(r.extra.get("weights") == "prepacked" for r in rows)
    # asymmetric padding: torch pads, then the gradient of the padded input is cropped
    q = ConvProblem.from_torch(torch.empty(1, 4, 9, 9, device="meta"), torch.empty(6, 4, 3, 3, device="meta"),
                               None, 2, [(0, 1), (1, 0)]).with_(device="cpu")
    rows = compare.compare_problem(q, iterations=1, warmup=0, budget_s=0.02, include_ref=False, direction=direction)
    assert all(r.status == "ok" for r in rows), [(r.name, r.status, r.error) for r in rows]
    s = compare.summary(rows)
    assert s["directions"] == [direction] and f"({direction})" in compare.headline(s)[0]


def test_compare_command_takes_direction():
    from rawconv.cli import build_parser

    a = build_parser().parse_args(["compare", "mb1ic4ih6oc4oh6kh3ph1", "--direction", "backward_filter"])
    assert a.direction == "backward_weights"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["compare", "--direction", "sideways"])


@pytest.mark.parametrize("direction", ["backward_data", "backward_weights"])
def test_torch_choice_reports_the_backward_directions(direction):
    """torch_choice reported torch's forward only."""
    import rawconv
    from rawconv.torch_choice import _TRACE_ROLES

    x, w = torch.randn(1, 512, 14, 14), torch.randn(512, 512, 3, 3)
    c = rawconv.torch_choice(x, w, padding=1, direction=direction)
    f = rawconv.torch_choice(x, w, padding=1)
    assert c.direction == direction and f.direction == "forward" and str(c).startswith(direction)
    assert c.backend == f.backend   # torch selects the backward's backend as the forward's
    if c.backend == "Mkldnn":
        assert c.convolution is not None and c.convolution.prop_kind == direction, c.onednn
        assert f.convolution.prop_kind.startswith("forward")
        plan = onednn.Convolution.from_problem(ConvProblem.from_torch(x, w, None, 1, 1), direction=direction)
        names = {i.choice for i in plan.implementations}
        assert set(c.matches) <= names and c.match in ("same name and layouts", "same name", "none")
        assert _TRACE_ROLES[direction][0] in plan.implementations[0].formats
    with pytest.raises(rawconv.ArgumentError, match="transposed"):
        rawconv.torch_choice(x, torch.randn(512, 4, 3, 3), transposed=True, direction=direction)


# ---------------------------------------------------------------------------- presentation
def test_piped_output_is_neither_wrapped_nor_padded():
    """`rawconv info | head` was padded with trailing spaces and hard-wrapped at 220 columns."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    r = subprocess.run([sys.executable, "-m", "rawconv", "info"], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert not [ln for ln in lines if ln != ln.rstrip()], "trailing spaces"
    path = next(ln for ln in lines if ln.startswith("onednn.path"))
    assert path.split()[-1].endswith("libdnnl.so.3")   # whole, on its line
    assert max(map(len, lines)) > 0


def test_replay_at_80_columns_never_splits_a_name_mid_word():
    import io

    from rich.console import Console

    from rawconv import cli

    names = ["layer3.0.downsample.0", "layer4.1.conv1", "layer2.0.conv2"]
    cols = [cli.Column("layer", names, wrap=True), cli.Column("backend", ["onednn"] * 3, drop=4),
            cli.Column("choice", ["brgconv_1x1:avx512_core@any", "x64:gemm:jit@any", "jit:avx2@user"], wrap=True),
            cli.Column("status", ["ok"] * 3, wrap=True)] + \
        [cli.Column(f"n{i}\nms", ["12345.67"] * 3, justify="right") for i in range(4)]
    for width in (72, 80):
        buf = io.StringIO()
        cli.render_table(Console(width=width, file=buf, color_system=None), cols)
        text = buf.getvalue()
        assert max(map(len, text.splitlines())) <= width, text
        body = text.split("\u2500")[-1]   # the rows, below the header's rule
        every = names + ["brgconv_1x1:avx512_core@any", "x64:gemm:jit@any", "jit:avx2@user"]
        for tok in (t for ln in body.splitlines() for t in ln.split() if any(t in n for n in every)):
            # every piece of a wrapped name ends at a separator or at its name's end
            assert tok[-1] in "/._,:@" or any(n.endswith(tok) for n in every), (tok, text)
        assert "layer3.0." in body.split() or "layer3.0.downsample.0" in body.split(), text


def test_no_text_progress_bar_in_a_notebook_without_ipywidgets(monkeypatch):
    """tqdm's text bar on stderr became pink blocks, one per redraw, in the notebook's HTML export."""
    import importlib.util

    from rawconv.core import progress as _progress

    real = importlib.util.find_spec
    monkeypatch.setattr(_progress, "in_notebook", lambda: True)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ipywidgets" else real(name, *a))
    assert _progress.enabled(None) is False
    assert _progress.enabled(True) is True   # asked for: the text bar, at most one redraw a second
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "ipywidgets"
                        else real(name, *a))
    assert _progress.enabled(None) is True


# ---------------------------------------------------------------------------- on a GPU (the lead runs these)
@pytest.mark.gpu
@pytest.mark.parametrize("direction", ["forward", "backward_data", "backward_weights"])
def test_compare_on_cuda_covers_every_direction(direction):
    p = ConvProblem.from_benchdnn("mb4ic16ih12oc24oh12kh3ph1").with_(device="cuda")
    rows = compare.compare_problem(p, iterations=2, warmup=1, include_ref=False, direction=direction, engines=3)
    assert {r.direction for r in rows} == {direction}
    torch_rows = {r.name: r for r in rows if r.backend == "torch"}
    assert set(torch_rows) == {"default", "cudnn.benchmark=True", "cudnn disabled"}
    assert all(r.status == "ok" for r in torch_rows.values()), [(r.name, r.error) for r in torch_rows.values()]
    assert "cuDNN" in torch_rows["default"].library
    legacy = [r for r in rows if r.backend == "cudnn" and r.ran]
    graph = [r for r in rows if r.backend == "cudnn-graph" and r.ran]
    assert legacy and graph, [(r.backend, r.name, r.status, r.error) for r in rows]
    assert all(r.status == "ok" for r in legacy + graph), [(r.name, r.max_rel) for r in legacy + graph if not r.ok]
    assert all(r.library.startswith("cuDNN 9.") for r in legacy + graph)
    s = compare.summary(rows)
    assert s["geomean_torch_over_best"] is not None and s["directions"] == [direction]


@pytest.mark.gpu
@pytest.mark.parametrize("direction", ["backward_data", "backward_weights"])
def test_torch_choice_on_cuda_reports_the_backward_directions(direction):
    import rawconv

    x = torch.randn(4, 32, 28, 28, device="cuda").to(memory_format=torch.channels_last)
    w = torch.randn(32, 32, 3, 3, device="cuda").to(memory_format=torch.channels_last)
    c = rawconv.torch_choice(x, w, padding=1, direction=direction, limit=8)
    assert c.direction == direction and c.backend == "Cudnn" and c.kernels, c
    assert c.candidates and any(not k.error for k in c.candidates), c.candidates
    assert c.match, c   # looked for: same kernels, main kernel, or "none"


def test_row_labels_follow_the_loaded_onednn(monkeypatch):
    """With RAWCONV_DNNL_LIBRARY pointing at another oneDNN 3.x build the same comparison runs on it:
    every label comes from the loaded library's dnnl_version(), none is written in."""
    monkeypatch.setattr(onednn, "library_version", lambda: "3.13.0")
    libs = compare.libraries()
    assert libs["onednn"] == "oneDNN 3.13.0"
    p = ConvProblem.from_benchdnn("mb1ic4ih6oc4oh6kh3ph1")
    rows = compare.compare_problem(p, iterations=1, warmup=0, budget_s=0.02, include_ref=False, libs=libs,
                                   backends=("onednn",))
    assert rows and all(r.library == "oneDNN 3.13.0" for r in rows)
    assert "rawconv's oneDNN 3.13.0" in compare.versions_line(libs, [p])
