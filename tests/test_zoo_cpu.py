"""The model zoo's CPU subset (issue 33): small models of every family the zoo covers (depthwise,
grouped, squeeze-excite, 1-D, 3-D, dilated, transposed), random weights, small inputs, checked for
correctness only (never speed): ``convert(model)`` and ``convert(model, fuse=True)`` (autotuned for
two of them) against the same model in float64, within 5x torch's own error against it (the noise
floor) or 1e-4; one training step's gradients against a float64 step, beside torch's. timm and
torchvision models skip, with the reason, where the package is missing. The timed zoo is
``benchmarks/zoo.py`` (docs/guides/zoo.md); its smoke test at a tiny size is here too."""
from __future__ import annotations

import copy
import importlib.util
import json
import os
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import rawconv.nn as rnn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FACTOR, FLOOR = 5.0, 1e-4


def _zoo():
    if "zoo" not in sys.modules:
        spec = importlib.util.spec_from_file_location("zoo", os.path.join(ROOT, "benchmarks", "zoo.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules["zoo"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["zoo"]


# ------------------------------------------------------------------ the small models
class Tiny1d(nn.Module):
    """1-D: a strided Conv1d, a depthwise dilated Conv1d with PReLU (ConvTasNet's block), a
    pointwise Conv1d and a ConvTranspose1d back up (its decoder)."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv1d(1, 16, 9, stride=2, padding=4), nn.BatchNorm1d(16), nn.ReLU())
        self.dw = nn.Conv1d(16, 16, 3, padding=2, dilation=2, groups=16)
        self.act = nn.PReLU()
        self.pw = nn.Conv1d(16, 32, 1)
        self.dec = nn.ConvTranspose1d(32, 4, 4, stride=2, padding=1)

    def forward(self, x):
        h = self.enc(x)
        h = h + self.act(self.dw(h))
        return self.dec(F.silu(self.pw(h)))


class Tiny3d(nn.Module):
    """3-D: a (1, 2, 2)-strided Conv3d stem, a grouped 3x3x3 Conv3d, a ConvTranspose3d up and a
    1x1x1 head."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv3d(3, 8, 3, stride=(1, 2, 2), padding=1, bias=False), nn.BatchNorm3d(8),
                                  nn.ReLU())
        self.grouped = nn.Sequential(nn.Conv3d(8, 16, 3, padding=1, groups=4, bias=False), nn.BatchNorm3d(16),
                                     nn.ReLU())
        self.up = nn.ConvTranspose3d(16, 8, (1, 2, 2), stride=(1, 2, 2))
        self.head = nn.Conv3d(8, 2, 1)

    def forward(self, x):
        return self.head(F.relu(self.up(self.grouped(self.stem(x)))))


def _timm(name, **kw):
    timm = pytest.importorskip("timm", reason="timm is not installed (pip install 'rawconv[zoo]')")
    return timm.create_model(name, pretrained=False, **kw)


def _tv():
    return pytest.importorskip("torchvision", reason="torchvision is not installed (pip install 'rawconv[zoo]')")


def _dilated():
    """A dilated segmentation block: a stem, a dilation-2 conv and torchvision's ASPP (rates 2, 4,
    6 and its image-pooling branch, interpolated back)."""
    _tv()
    from torchvision.models.segmentation.deeplabv3 import ASPP

    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Conv2d(16, 16, 3, padding=2, dilation=2, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                         ASPP(16, [2, 4, 6], out_channels=16), nn.Conv2d(16, 3, 1))


def _video():
    """torchvision's VideoResNet (r3d_18's blocks) with one block per stage."""
    _tv()
    from torchvision.models.video.resnet import BasicBlock, BasicStem, Conv3DSimple, VideoResNet

    return VideoResNet(BasicBlock, [Conv3DSimple] * 4, [1, 1, 1, 1], BasicStem, num_classes=10)


#: name -> (builder, input shape, what it covers)
MODELS = {
    "resnet18": (lambda: _tv().models.resnet18(weights=None, num_classes=10), (2, 3, 32, 32), "residual 3x3/1x1"),
    "mobilenetv3_small_050": (lambda: _timm("mobilenetv3_small_050"), (1, 3, 64, 64),
                              "depthwise 3x3/5x5, hardswish, squeeze-excite"),
    "efficientnet_b0": (lambda: _timm("efficientnet_b0"), (2, 3, 32, 32), "depthwise, SiLU, squeeze-excite"),
    "regnetx_002": (lambda: _timm("regnetx_002"), (2, 3, 64, 64), "grouped 3x3 (group width 8)"),
    "convnext_atto": (lambda: _timm("convnext_atto"), (1, 3, 64, 64), "depthwise 7x7 with bias, LayerNorm, GELU"),
    "tiny1d": (Tiny1d, (2, 1, 256), "1-D: depthwise dilated, ConvTranspose1d"),
    "m5": (lambda: _zoo().M5(width=8), (2, 1, 2000), "1-D: raw waveform k80 s4"),
    "video_resnet": (_video, (1, 3, 4, 32, 32), "3-D: torchvision's r3d blocks"),
    "tiny3d": (Tiny3d, (2, 3, 4, 16, 16), "3-D: grouped Conv3d, ConvTranspose3d"),
    "unet": (lambda: _zoo().UNet(base=8, depth=3), (2, 3, 32, 32), "ConvTranspose2d decoder, skips"),
    "convt_decoder": (lambda: _zoo().ConvTDecoder(cin=16, width=32), (2, 16, 2, 2), "ConvTranspose2d k4 s2 + BN"),
    "dilated_aspp": (_dilated, (2, 3, 32, 32), "dilation 2/4/6, ASPP pooling branch"),
}
AUTOTUNED = ("tiny1d", "unet")
#: efficientnet_b0's training step is left out: its float64 step alone takes ~15 CPU seconds here (torch's CPU
#: float64 grouped convolution runs group by group), and mobilenetv3_small_050 trains the same kinds of layers
TRAINED = [m for m in MODELS if m != "efficientnet_b0"]


def _build(name: str, train: bool = False):
    """(model with randomized BN statistics and layer scales, in eval or train mode, channels_last for
    4-D/5-D input; the input)."""
    builder, shape, _ = MODELS[name]
    torch.manual_seed(0)
    model = builder()
    _zoo().randomize(model)
    fmt = _zoo().memory_format(len(shape))
    model = model.train(train).to(memory_format=fmt)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1)).contiguous(memory_format=fmt)
    return model, x


def _rel(y, ref) -> float:
    return ((y.double() - ref).abs().max() / ref.abs().max()).item()


_REF: dict = {}


def _ref64(name, model, x):
    """The float64 output of ``model`` (built by ``_build(name)``), computed once per model: torch's
    float64 convolutions on the CPU (no oneDNN) are the slowest part of these tests."""
    if name not in _REF:
        m64 = copy.deepcopy(model).double().to(memory_format=torch.contiguous_format)
        with torch.no_grad():
            _REF[name] = _zoo().first_tensor(m64(x.double().contiguous()))
    return _REF[name]


def _check(name, what, err, torch_err, floor=FLOOR):
    limit = max(FACTOR * torch_err, floor)
    assert err <= limit, (f"{name} {what}: error {err:.2e} against float64 above {limit:.2e} "
                          f"(torch's own {torch_err:.2e})")


@pytest.mark.parametrize("name", list(MODELS))
def test_converted_inference_within_torchs_noise(name):
    model, x = _build(name)
    ref = _ref64(name, model, x)
    with torch.no_grad():
        torch_err = _rel(_zoo().first_tensor(model(x)), ref)
        for fuse in (False, True):
            rm = rnn.convert(model, fuse=fuse)
            assert rm.rawconv_report.swapped, f"{name}: no convolution went to rawconv"
            _check(name, f"convert(fuse={fuse})", _rel(_zoo().first_tensor(rm(x)), ref), torch_err)


@pytest.mark.parametrize("name", AUTOTUNED)
def test_autotuned_fused_within_torchs_noise(name):
    model, x = _build(name)
    ref = _ref64(name, model, x)
    with torch.no_grad():
        torch_err = _rel(_zoo().first_tensor(model(x)), ref)
        rm = rnn.convert(model, fuse=True, autotune=x, autotune_budget_s=0.05)
        assert rm.rawconv_report.tuned and all(t["choice"] is not None for t in rm.rawconv_report.tuned)
        _check(name, "convert(fuse=True, autotune=x)", _rel(_zoo().first_tensor(rm(x)), ref), torch_err)


@pytest.mark.parametrize("name", TRAINED)
def test_training_step_within_torchs_noise(name):
    """One step (MSE against a fixed target, backward, SGD): rawconv's gradients against a float64
    step within 5x torch's own error or 1e-4; then the output of a second forward, after each
    side's SGD step (the converted layers must compute with the updated weights), against the
    float64 model's after its own step."""
    zoo = _zoo()
    model, x = _build(name, train=True)
    with torch.no_grad():
        shape = zoo.first_tensor(copy.deepcopy(model).eval()(x)).shape
    tgt = torch.randn(shape, generator=torch.Generator().manual_seed(2))
    sides = {"float64": copy.deepcopy(model).double().to(memory_format=torch.contiguous_format),
             "torch": copy.deepcopy(model), "rawconv": rnn.convert(model)}
    grads, outs = {}, {}
    for side, m in sides.items():
        xin = x.double().contiguous() if side == "float64" else x
        opt = torch.optim.SGD(m.parameters(), lr=1e-2)
        F.mse_loss(zoo.first_tensor(m(xin)), tgt.to(xin.dtype)).backward()
        grads[side] = {k: p.grad for k, p in m.named_parameters() if p.grad is not None}
        opt.step()
        with torch.no_grad():
            outs[side] = zoo.first_tensor(m(xin))
    ref = grads.pop("float64")
    for side, got in grads.items():
        assert set(got) == set(ref), f"{name} {side}: gradients of {sorted(set(ref) ^ set(got))[:3]} missing or extra"
    errs, terrs = zoo.grad_errs(ref, grads["rawconv"]), zoo.grad_errs(ref, grads["torch"])
    for k in ref:   # parameter by parameter, against torch's own error on it
        _check(name, f"the gradient of {k}", errs[k], terrs[k])
    _check(name, "the output after the SGD step", _rel(outs["rawconv"], outs["float64"]),
           _rel(outs["torch"], outs["float64"]))


def test_zoo_status_rules():
    zoo = _zoo()
    assert zoo.status_of(1e-5, 1e-6, 1e-4) == "ok"          # under the floor
    assert zoo.status_of(4e-4, 1e-4, 1e-4) == "ok"          # under 5x torch's own
    assert zoo.status_of(6e-4, 1e-4, 1e-4) == "WRONG"
    assert zoo.status_of(float("nan"), 1e-4, 1e-4) == "WRONG"
    assert zoo.status_of(float("inf"), None, 1e-4) == "WRONG"
    ref = {"a": torch.ones(3), "b": torch.zeros(2)}
    errs = zoo.grad_errs(ref, {"a": torch.ones(3) * 1.01, "b": torch.full((2,), 1e-4)})
    assert errs["a"] == pytest.approx(0.01, rel=1e-4)
    assert errs["b"] == pytest.approx(1e-4 * 2 ** 0.5 / (1e-3 * 3 ** 0.5), rel=1e-4)   # against 1e-3 of a's norm
    assert zoo.grad_errs(ref, {"a": torch.ones(3)})["b"] == float("inf")
    # parameter by parameter: a's 0.01 is within 5x torch's 0.003 on a, b's 0.1 is not within 5x 0.001
    assert zoo.grad_status({"a": 0.01, "b": 0.001}, {"a": 0.003, "b": 0.001}, 1e-4) == ("ok", "a")
    assert zoo.grad_status({"a": 0.01, "b": 0.1}, {"a": 0.003, "b": 0.05}, 1e-4) == ("ok", "a")
    assert zoo.grad_status({"a": 0.01, "b": 0.1}, {"a": 0.003, "b": 0.001}, 1e-4) == ("WRONG", "b")
    assert zoo.error_line(RuntimeError("first\nsecond")) == "RuntimeError: first"


def test_zoo_script_runs_at_a_tiny_size(tmp_path, capsys):
    """benchmarks/zoo.py end to end on the CPU (no torch.compile: too slow for the suite): rows,
    statuses, the training step, the summary, the JSON and the Markdown table."""
    zoo = _zoo()
    out = tmp_path / "zoo.json"
    threads = torch.get_num_threads()
    try:
        res = zoo.main(["--device", "cpu", "--batch", "2", "--threads", "1", "--size", "32", "--models", "m5,unet",
                        "--variants", "eager,rawconv", "--rounds", "2", "--train-steps", "1", "--train-rounds", "1",
                        "--no-autotune", "--json", str(out), "--markdown"])
    finally:
        torch.set_num_threads(threads)
    rows = {(r["model"], r["variant"]): r for r in res["rows"]}
    assert set(rows) == {(m, v) for m in ("m5", "unet") for v in ("eager", "rawconv", "train_torch", "train_rawconv")}
    for r in rows.values():
        assert r["status"] == "ok", r
        assert r["ms"] > 0 and r["err"] < 1e-3 and r["torch_err"] < 1e-3
    eager, raw = rows[("unet", "eager")], rows[("unet", "rawconv")]
    assert raw["vs_eager"] == pytest.approx(eager["ms"] / raw["ms"])
    assert json.loads(out.read_text())["rows"] == json.loads(json.dumps(res["rows"], default=str))
    text = capsys.readouterr().out
    assert "WRONG: 0" in text and "ERROR: 0" in text and "| model | eager | rawconv |" in text
    assert "rawconv                    vs eager: geomean" in text


def test_zoo_reports_a_failing_variant_as_error(monkeypatch, capsys):
    """A variant that raises (here convert itself, as an InternalError would) is an ERROR row with the
    exception's first line, and the run goes on to the next model."""
    zoo = _zoo()
    from rawconv.errors import InternalError

    def boom(*a, **k):
        raise InternalError("rawconv.nn.convert: unexpected AttributeError\nmore")
    monkeypatch.setattr(zoo.rnn, "convert", boom)
    threads = torch.get_num_threads()
    try:
        res = zoo.main(["--device", "cpu", "--batch", "1", "--threads", "1", "--size", "32", "--models",
                        "m5,convt_decoder", "--variants", "eager,rawconv", "--rounds", "1", "--no-train"])
    finally:
        torch.set_num_threads(threads)
    st = {(r["model"], r["variant"]): (r["status"], r["note"]) for r in res["rows"]}
    for m in ("m5", "convt_decoder"):
        assert st[(m, "eager")][0] == "ok"
        assert st[(m, "rawconv")] == ("ERROR", "convert: InternalError: rawconv.nn.convert: unexpected AttributeError")
    assert "ERROR: 2" in capsys.readouterr().out


def test_zoo_isolate_runs_each_model_in_its_own_process_and_survives_a_crash(monkeypatch, capsys):
    """--isolate: a model's rows come back from its child process; a child killed by a signal (as the
    Xeon's CPU zoo was by a segmentation fault, 2026-12-08) is one ERROR row naming the signal and its
    last progress line, and the next model still runs."""
    import signal
    import subprocess

    zoo = _zoo()
    real = subprocess.Popen

    def popen(cmd, **kw):   # m5's child crashes as a segfault would; the others run for real
        if "m5" in cmd[cmd.index("--models") + 1]:
            cmd = [sys.executable, "-c", "import os, signal; print('[00:00:00 +  0.1s] m5 eager: ready', "
                   "flush=True); os.kill(os.getpid(), signal.SIGSEGV)"]
        return real(cmd, **kw)
    monkeypatch.setattr(subprocess, "Popen", popen)
    argv = ["--device", "cpu", "--batch", "1", "--threads", "1", "--size", "32", "--models", "m5,convt_decoder",
            "--variants", "eager,rawconv", "--rounds", "1", "--no-train", "--no-autotune", "--isolate"]
    threads = torch.get_num_threads()
    try:
        res = zoo.main(argv)
    finally:
        torch.set_num_threads(threads)
    st = {(r["model"], r["variant"]): (r["status"], r["note"]) for r in res["rows"]}
    assert st[("m5", "run")][0] == "ERROR"
    assert signal.SIGSEGV.name in st[("m5", "run")][1] and "m5 eager: ready" in st[("m5", "run")][1]
    assert st[("convt_decoder", "eager")][0] == "ok" and st[("convt_decoder", "rawconv")][0] == "ok"
    assert "ERROR: 1 (m5/run)" in capsys.readouterr().out
