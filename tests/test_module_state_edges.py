"""Modules' state under edits and copies, and input/output edge cases (adversarial findings on the
code that changed on 2026-12-03: the modules' argument pack, frozen snapshots, records, compare/cli;
each test failed before its fix; autocast's are in test_autocast_edges.py)."""
from __future__ import annotations

import copy
import io
import threading
import warnings

import pytest
import torch
import torch.nn.functional as F

import rawconv.fused as fused
import rawconv.nn as rnn
import rawconv.ops as ops
from rawconv import onednn
from rawconv.errors import ArgumentError, InternalError


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


# ---------------------------------------------------------------------------- the modules' argument pack
def _ref_conv(m, x):
    return F.conv2d(x.double(), m.weight.double(), None if m.bias is None else m.bias.double(), m.stride,
                    m.padding, m.dilation, m.groups)


def test_module_follows_a_list_argument_changed_in_place():
    """A module's stride/padding/dilation set to a list (torch's modules take one) and then changed
    in place: the argument pack was keyed on the list object itself, so the old configuration
    kept running (a silently wrong shape and values)."""
    m = rnn.Conv2d(3, 4, 3, padding=1)
    x = torch.randn(2, 3, 9, 9)
    with torch.no_grad():
        for attr, first, second in (("padding", [1, 1], (0, 1)), ("stride", [1, 1], (2, 1)),
                                    ("dilation", [1, 1], (2, 1))):
            setattr(m, attr, list(first))
            y = m(x)
            assert y.shape == _ref_conv(m, x).shape
            getattr(m, attr)[:] = second   # in place
            y, ref = m(x), _ref_conv(m, x)
            assert y.shape == ref.shape, attr
            assert _rel(y, ref) < 1e-5, attr
            setattr(m, attr, first)


def test_fused_module_follows_a_list_argument_changed_in_place():
    m = rnn.ConvBiasAct2d(3, 4, 3, padding=1, activation="none")
    x = torch.randn(2, 3, 9, 9)
    m.padding = [1, 1]
    with torch.no_grad():
        m(x)
        m.padding[0] = 0
        y, ref = m(x), _ref_conv(m, x)
    assert y.shape == ref.shape and _rel(y, ref) < 1e-5


def test_module_deepcopies_and_pickles_after_a_call():
    """After a call the module held its argument pack (with a oneDNN plan, C objects) in its
    __dict__: copy.deepcopy(module), torch.save(module) and rawconv.nn.convert(model) (which deep
    copies) raised TypeError: cannot pickle '_cffi_backend.__CDataGCP' object."""
    m = rnn.Conv2d(3, 4, 3, padding=1)
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        m(x)
        c = copy.deepcopy(m)
        buf = io.BytesIO()
        torch.save(m, buf)
        buf.seek(0)
        p = torch.load(buf, weights_only=False)
        model = rnn.convert(torch.nn.Sequential(m, torch.nn.ReLU()))
        for mm in (c, p, m):
            assert _rel(mm(x), _ref_conv(m, x)) < 1e-5
        assert _rel(model(x), _ref_conv(m, x).relu()) < 1e-5
        # the copy is its own module: changing it leaves the original as it was
        c.weight.mul_(2)
        assert _rel(m(x), _ref_conv(m, x)) < 1e-5
        assert _rel(c(x), _ref_conv(c, x)) < 1e-5


def _threads_agree(m, xs, refs, calls, close):
    """Thread i calls ``m(xs[i])`` ``calls`` times at once with the others (no_grad); every result
    must be ``close`` to ``refs[i]`` and no call may raise."""
    bad, errors = [0] * len(xs), []

    def work(i):
        try:
            with torch.no_grad():
                for _ in range(calls):
                    if not close(m(xs[i]), refs[i]):
                        bad[i] += 1
        except Exception as exc:   # noqa: BLE001
            errors.append(exc)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors and bad == [0] * len(xs)


def test_module_shared_by_threads_gives_each_its_own_result():
    """One module called from two Python threads at once (an inference server): the argument pack
    kept one oneDNN plan for every thread, and a plan's memory handles are set per call, so a call
    could read the other thread's input or write into its output (silently wrong results; rawconv's
    other paths keep plans per thread)."""
    torch.manual_seed(0)
    m = rnn.Conv2d(8, 8, 3, padding=1)
    xs = [torch.randn(1, 8, 16, 16) for _ in range(2)]
    with torch.no_grad():
        refs = [F.conv2d(x, m.weight, m.bias, padding=1) for x in xs]
        m(xs[0])
    _threads_agree(m, xs, refs, 400, lambda y, ref: torch.allclose(y, ref, atol=1e-4))


# ---------------------------------------------------------------------------- frozen snapshots
def test_frozen_snapshot_follows_a_fused_optimizer_step():
    """Fused optimizers (Adam(fused=True)) move no version counter; the frozen modules relied on
    torch.optim's global step hook, which was never registered (torch.optim.optimizer is not an
    attribute of torch.optim in this torch: the AttributeError was swallowed): a step between two
    no-grad calls left the old snapshot running."""
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU()).eval()
    m = rnn.convert(base, fuse=True)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        m(x)
    opt = torch.optim.Adam(m.parameters(), lr=0.1, fused=True)
    for p in m.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    w, b = (p.detach().double() for p in m.parameters())
    with torch.no_grad():
        y = m(x)
    assert _rel(y, F.conv2d(x.double(), w, b, padding=1).relu()) < 1e-5


# ---------------------------------------------------------------------------- user mistakes, not InternalError
def test_inference_tensor_with_autograd_is_the_callers_error():
    """An inference-mode tensor used outside inference mode with parameters that require grad:
    torch raises RuntimeError('Inference tensors cannot be saved for backward'); rawconv's entry
    points said InternalError ('please report')."""
    with torch.inference_mode():
        xi = torch.randn(2, 4, 6, 6)
    w = torch.randn(8, 4, 3, 3, requires_grad=True)
    calls = {"ops.conv": lambda: ops.conv(xi, w),
             "module": lambda: rnn.Conv2d(4, 8, 3)(xi),
             "ops.conv_transpose": lambda: ops.conv_transpose(xi, torch.randn(4, 8, 3, 3, requires_grad=True)),
             "fused": lambda: fused.conv_bias_act(xi, w)}
    for k, f in calls.items():
        with pytest.raises(ArgumentError, match="[Ii]nference tensor") as info:
            f()
        assert not isinstance(info.value, InternalError), k
        assert isinstance(info.value, RuntimeError), k   # what torch code catches


def test_untraceable_fallback_follows_its_convolutions_geometry():
    """convert(fuse=True) of a model torch.fx cannot trace: each nn.Sequential's Conv -> ReLU run is
    computed by a fused module made from the conv, whose stride/padding/dilation were copies: a
    change of the child conv's (the module the model still shows, m.seq[0].stride = 2) was not
    followed (the old shape and values, silently)."""
    class Untraceable(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.seq = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU())

        def forward(self, x):
            if x.sum() > 1e9:   # data-dependent control flow: torch.fx cannot trace it
                return x
            return self.seq(x)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        m = rnn.convert(Untraceable().eval(), fuse=True)
    assert type(m.seq).__name__ == "_FusedSequential"
    c = m.seq[0]
    x = torch.randn(2, 3, 9, 9)
    for attr, value in (("stride", (2, 2)), ("padding", (0, 0)), ("dilation", (2, 2)), ("padding_mode", "reflect")):
        old = getattr(c, attr)
        setattr(c, attr, value)
        with torch.no_grad():
            y = m(x)
        xd = x.double()
        pad = c.padding
        if c.padding_mode != "zeros":
            xd, pad = F.pad(xd, c._reversed_padding_repeated_twice, mode=c.padding_mode), 0
        ref = F.conv2d(xd, c.weight.double(), c.bias.double(), c.stride, pad, c.dilation).relu()
        assert y.shape == ref.shape, attr
        assert _rel(y, ref) < 1e-5, attr
        setattr(c, attr, old)
    with torch.no_grad():   # as converted again: fused
        assert _rel(m(x), F.conv2d(x.double(), c.weight.double(), c.bias.double(), padding=1).relu()) < 1e-5


def test_frozen_snapshot_follows_the_batchnorms_eps():
    """A folded BatchNorm's eps set after convert(fuse=True) (the BatchNorm stays in the model):
    the snapshot was taken again only when a tensor changed, so the old fold kept running."""
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU()).eval()
    with torch.no_grad():
        base[1].running_var.uniform_(0.01, 0.1)
    m = rnn.convert(base, fuse=True)
    x = torch.randn(2, 3, 8, 8)
    bn = m.get_submodule("1")
    with torch.no_grad():
        m(x)
        bn.eps = 0.5
        y = m(x)
    d = lambda t: t.detach().double()  # noqa: E731
    ref = F.batch_norm(F.conv2d(x.double(), d(base[0].weight), d(base[0].bias), padding=1), d(bn.running_mean),
                       d(bn.running_var), d(bn.weight), d(bn.bias), False, 0.0, 0.5).relu()
    assert _rel(y, ref) < 1e-5


# ---------------------------------------------------------------------------- tuning records
def _record_dict(**changes) -> dict:
    """A tuning record as ``rawconv compare --record`` writes it (schema 1), with ``changes``."""
    d = {"schema": 1, "backend": "onednn", "direction": "forward",
         "problem": {"n": 1, "c": 4, "k": 4, "in_spatial": [6, 6], "kernel": [3, 3], "stride": [1, 1],
                     "dilation": [1, 1], "pad_before": [0, 0], "pad_after": [0, 0], "groups": 1, "dtype": "float32",
                     "layout": "nchw", "device": "cpu", "has_bias": False, "unbatched": False},
         "activation": None, "options": {"fpmath": "strict", "algorithm": "direct", "weights_layout": "nchw",
                                         "threads": 1},
         "library": "oneDNN", "library_version": "3.2.0", "device": "AMD EPYC", "device_arch": "avx2",
         "choice": "x64:gemm:jit@any", "layout": "nchw", "detail": {"impl": "x64:gemm:jit"}, "median_ms": 0.035,
         "min_ms": 0.028, "error": {"max_abs": 2.4e-07, "max_rel": 1.1e-07, "ratio": None},
         "created": "2026-12-03T14:06:53+00:00", "rawconv_version": "0.1.0", "label": "cli"}
    d.update(changes)
    return d


@pytest.mark.parametrize("timing", [{"trustworthy": False, "run_warnings": [1, 2]},
                                    {"trustworthy": False, "row_flags": [1]},
                                    {"trustworthy": False, "row_flags": "busy"},
                                    {"trustworthy": False, "run_warnings": "busy: 1"}])
def test_record_timing_of_the_wrong_shape_is_refused_when_read(timing, tmp_path):
    """A record file's ``timing`` whose row_flags / run_warnings are not lists of str: replay
    raised InternalError ('please report': 'int' object has no attribute 'split', a join of ints)
    or printed a string's characters as flags; now ArgumentError naming the field when read."""
    import json

    from rawconv import tuning

    assert tuning.TuningRecord.from_dict(_record_dict(timing={"trustworthy": False, "row_flags": ["busy"]}))
    with pytest.raises(ArgumentError, match="timing"):
        tuning.TuningRecord.from_dict(_record_dict(timing=timing))
    path = tmp_path / "rec.json"
    path.write_text(json.dumps([_record_dict(timing=timing)]))
    with pytest.raises(ArgumentError, match="timing"):
        tuning.TuningRecord.load(str(path))


@pytest.mark.parametrize("changes", [{"error": "x"}, {"error": 3}, {"median_ms": -1.0}, {"min_ms": float("nan")},
                                     {"median_ms": float("inf")}])
def test_record_error_and_times_of_the_wrong_kind_are_refused_when_read(changes):
    """A record file's ``error`` that is not a mapping raised InternalError ('str' object has no
    attribute 'max_abs'); a negative or non-finite recorded time was read as it was and replay
    printed a drift of -102% and counted the record in a geometric mean it could not enter."""
    from rawconv import tuning

    assert tuning.TuningRecord.from_dict(_record_dict(median_ms=0.0, min_ms=0.0, error=None))
    with pytest.raises(ArgumentError, match="error|_ms"):
        tuning.TuningRecord.from_dict(_record_dict(**changes))


def test_tensor_arguments_changed_in_place_are_not_stale():
    """stride / padding given as 0-d tensors (torch's functional convolutions take them) and changed
    in place between calls: the fast-path caches keyed them by identity (a tensor hashes by id),
    so the second call ran the first call's arguments."""
    g = torch.Generator().manual_seed(4)
    x, w = torch.randn(1, 2, 8, 8, generator=g), torch.randn(3, 2, 3, 3, generator=g)
    s, p = torch.tensor(1), torch.tensor(0)
    for fn in (lambda: ops.conv(x, w, stride=s, padding=p), lambda: onednn.forward(x, w, stride=s, padding=p)):
        s.fill_(1)
        p.fill_(0)
        fn()
        s.fill_(2)
        p.fill_(1)
        y, ref = fn(), F.conv2d(x.double(), w.double(), stride=2, padding=1)
        assert y.shape == ref.shape and _rel(y, ref) < 1e-5


@pytest.mark.parametrize("desc", ["mb1ic4ih6oc4oh6kh3ph1sh0", "mb1ic4oh6oc4kh3sh0", "mb1ic4iw6oc4ow6kw3sw0"])
def test_benchdnn_descriptor_with_stride_zero_and_output_sizes(desc):
    """A benchdnn descriptor (rawconv compare's problem argument) with a zero stride and output
    sizes: ZeroDivisionError inside the parser, reported as InternalError ('please report')."""
    from rawconv.problem import ConvProblem

    with pytest.raises(ArgumentError, match="stride"):
        ConvProblem.from_benchdnn(desc)


def test_cli_plot_to_an_unknown_format_is_refused_before_the_run(tmp_path):
    """rawconv compare --plot out.xyz ran the whole comparison, then failed in savefig with
    'unexpected ValueError ... please report it' (and left an empty out.xyz); now a bad command
    line: exit 2 and one clear line before anything runs."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = tmp_path / "plot.xyz"
    r = subprocess.run([sys.executable, "-m", "rawconv", "compare", "--plot", str(out), "--input", "1x4x6x6",
                        "--weight", "4x4x3x3", "--iterations", "1", "--warmup", "0", "--no-ref", "--device", "cpu"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "please report" not in r.stderr and ".xyz is not an image format" in r.stderr
    assert "problem(s)" not in r.stdout   # nothing ran
    assert not out.exists()


def test_compare_zero_input_channels_forward_runs():
    """rawconv compare mb1ic0ih6oc4kh3ph1 (zero input channels: a problem rawconv runs now, y the
    bias): torch's own result has shape (N, 0, *out), and the shape check's ArgumentError stopped
    the whole comparison ('rawconv: error: result shape ... differs'); now torch's rows are
    'wrong' with that reason and rawconv's rows are checked."""
    from rawconv import compare as cmp
    from rawconv.problem import ConvProblem

    p = ConvProblem.from_benchdnn("mb1ic0ih6oc4kh3ph1")
    rows = cmp.compare_problem(p, iterations=1, warmup=0, include_ref=False)
    torch_rows = [r for r in rows if r.backend == "torch"]
    ours = [r for r in rows if r.backend != "torch"]
    assert ours and all(r.status == "ok" for r in ours)
    for r in torch_rows:   # torch 2.14 gives (1, 0, 6, 6); a later torch may give the bias's shape
        assert r.status == "ok" or (r.status == "wrong" and "shape" in r.error)


@pytest.mark.parametrize("method", ["to_json", "to_csv"])
def test_result_table_export_to_a_bad_path_is_a_file_access_error(method, tmp_path):
    """ResultTable.to_json / to_csv (compare's and autotune's tables) let the raw OSError out
    (IsADirectoryError, FileNotFoundError): every other public writer raises FileAccessError
    (a rawconv error, still an OSError)."""
    from rawconv.errors import FileAccessError
    from rawconv.results import ResultTable

    for path in (tmp_path, tmp_path / "missing" / "out.json"):
        with pytest.raises(FileAccessError) as info:
            getattr(ResultTable(), method)(str(path))
        assert isinstance(info.value, OSError) and info.value.filename == str(path)
    assert getattr(ResultTable(), method)(str(tmp_path / "ok.out")) is not None


@pytest.mark.gpu
def test_cuda_module_copies_after_a_call_and_is_shared_by_threads():
    """CUDA side of the argument pack findings: the pack holds the cuDNN plan of the last call
    (deepcopy / pickle must leave it out) and is kept per thread (a plan's hot pack is not
    thread-safe)."""
    torch.manual_seed(0)
    m = rnn.Conv2d(8, 8, 3, padding=1).cuda()
    xs = [torch.randn(2, 8, 16, 16, device="cuda") for _ in range(2)]
    with torch.no_grad():
        refs = [F.conv2d(x.double(), m.weight.double(), m.bias.double(), padding=1) for x in xs]
        m(xs[0])
        c = copy.deepcopy(m)
        buf = io.BytesIO()
        torch.save(m, buf)
        assert _rel(c(xs[0]), refs[0]) < 1e-4
    _threads_agree(m, xs, refs, 200, lambda y, ref: _rel(y, ref) <= 1e-4)
