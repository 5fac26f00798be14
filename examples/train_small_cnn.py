"""Train a small CNN for a few steps on real image crops, with torch's convolutions and with rawconv's
pinned ones, and check that the losses agree.

The task: denoise 32x32 crops of a photograph matplotlib ships (``grace_hopper.jpg``): the network
(Conv -> BatchNorm -> ReLU, strided Conv -> ReLU, ConvTranspose -> ReLU, ConvTranspose) sees a noisy
crop and is trained (SGD, MSE) to output the clean one. The same initial weights and the same
batches go through

* CPU: torch; rawconv with every convolution pinned to one oneDNN implementation (policy "first":
  oneDNN's first choice for each layer and direction, pinned by name); rawconv pinned to another
  (policy "gemm": ``x64:gemm:jit``, offered for every float32 problem, or the last non-reference
  implementation listed);
* CUDA (``--device cuda``): torch with ``torch.backends.cudnn.benchmark = True``; rawconv autotuned
  (``rawconv.nn.convert(model, autotune=x)``: each distinct forward problem searched once).

Every step's loss must agree with torch's within ``--rtol`` (default 1e-4 relative: float32, a few
steps; implementations differ in summation order, so the weights drift apart by rounding only).
Per-step times are printed (median over the steps after the first).

    python examples/train_small_cnn.py [--steps 8] [--batch 16] [--crop 32] [--device cpu|cuda]
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

import torch
import torch.nn as nn

if __package__ in (None, ""):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import rawconv.nn as rnn  # noqa: E402
from rawconv import onednn  # noqa: E402


def load_image() -> torch.Tensor:
    """grace_hopper.jpg as a (3, H, W) float32 tensor in [0, 1]."""
    import matplotlib.cbook as cbook
    import matplotlib.image as mimage

    with cbook.get_sample_data("grace_hopper.jpg") as f:
        img = mimage.imread(f, format="jpg")
    return torch.from_numpy(img.copy()).permute(2, 0, 1).float() / 255.0


def batches(img: torch.Tensor, steps: int, batch: int, crop: int, seed: int = 0):
    """``steps`` (noisy, clean) batches of random ``crop`` x ``crop`` crops (same for every run)."""
    g = torch.Generator().manual_seed(seed)
    _, h, w = img.shape
    out = []
    for _ in range(steps):
        ys = torch.randint(0, h - crop, (batch,), generator=g)
        xs = torch.randint(0, w - crop, (batch,), generator=g)
        clean = torch.stack([img[:, y:y + crop, x:x + crop] for y, x in zip(ys.tolist(), xs.tolist())])
        noisy = clean + 0.1 * torch.randn(clean.shape, generator=g)
        out.append((noisy, clean))
    return out


def small_cnn(width: int = 16) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.ReLU(),
        nn.ConvTranspose2d(2 * width, width, 3, stride=2, padding=1, output_padding=1), nn.ReLU(),
        nn.Conv2d(width, 3, 3, padding=1))


def _pick(impls, policy: str) -> str:
    names = [f"{i.name}@{i.layouts}" for i in impls if not i.name.startswith("ref")]
    if not names:
        return f"{impls[0].name}@{impls[0].layouts}"
    if policy == "first":
        return names[0]
    gemm = [n for n in names if n.startswith("x64:gemm")]
    return gemm[0] if gemm else names[-1]


def pin(model: nn.Module, x: torch.Tensor, policy: str) -> list[str]:
    """Pin every rawconv layer of ``model`` (forward and both backward directions) to the oneDNN
    implementation ``policy`` picks for its problem; returns one line per layer saying which."""
    shapes = {}

    def hook(m, args, y):
        shapes.setdefault(m, (args[0].shape, y.shape))

    hooks = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d))]
    was_training = model.training
    model.eval()   # no BatchNorm statistics update: only the shapes are wanted
    with torch.no_grad():
        model(x)
    model.train(was_training)
    for h in hooks:
        h.remove()
    lines = []
    for name, m in model.named_modules():
        if m not in shapes:
            continue
        xs, ys = shapes[m]
        w = m.weight.detach()
        kw = dict(stride=m.stride, padding=m.padding, dilation=m.dilation, groups=m.groups)
        if isinstance(m, nn.ConvTranspose2d):   # the matching convolution: input of y's shape, output of x's
            cx = torch.empty(ys)
            fwd = _pick(onednn.implementations(cx, w, **kw, direction="backward_data"), policy)
            gx = _pick(onednn.implementations(cx, w, **kw, direction="forward"), policy)
            gw = _pick(onednn.implementations(cx, w, **kw, direction="backward_weights"), policy)
        else:
            cx = torch.empty(xs)
            fwd = _pick(onednn.implementations(cx, w, **kw), policy)
            gx = _pick(onednn.implementations(cx, w, **kw, direction="backward_data"), policy)
            gw = _pick(onednn.implementations(cx, w, **kw, direction="backward_weights"), policy)
        m.choice, m.backward_choice = fwd, (gx, gw)
        lines.append((name, type(m).__name__, fwd, gx, gw))
    # columns as wide as their longest name (an ISA's implementation names differ in length)
    wn, wt, wf, wx = (max((len(r[i]) for r in lines), default=0) for i in range(4))
    return [f"    {n:<{wn}} {t:<{wt}} forward {f:<{wf}} grad-x {x:<{wx}} grad-w {g}" for n, t, f, x, g in lines]


def train(model: nn.Module, data, device: str, lr: float = 0.05) -> tuple[list[float], list[float]]:
    """(losses, per-step seconds) of plain SGD on ``data``."""
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses, times = [], []
    for noisy, clean in data:
        noisy, clean = noisy.to(device), clean.to(device)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(noisy), clean)
        loss.backward()
        opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    return losses, times


def run(steps: int = 8, batch: int = 16, crop: int = 32, device: str = "cpu", width: int = 16,
        rtol: float = 1e-4, log=print) -> dict:
    """Train every variant; returns {variant: {"losses": [...], "step_ms": median}} and logs a table.
    Raises AssertionError when a variant's losses leave ``rtol`` of torch's."""
    img = load_image()
    data = batches(img, steps, batch, crop)
    base = small_cnn(width)
    results = {}

    def record(name, model):
        losses, times = train(model, data, device)
        step_ms = statistics.median(times[1:] or times) * 1e3
        results[name] = {"losses": losses, "step_ms": step_ms}

    if device == "cuda":
        torch.backends.cudnn.benchmark = True
        record("torch (cudnn.benchmark)", copy.deepcopy(base).cuda())
        m = rnn.convert(copy.deepcopy(base).cuda(), autotune=data[0][0].cuda())
        log(str(m.rawconv_report))
        record("rawconv (autotuned)", m)
    else:
        record("torch", copy.deepcopy(base))
        for policy in ("first", "gemm"):
            m = rnn.convert(copy.deepcopy(base))
            lines = pin(m, data[0][0], policy)
            log(f"rawconv pinned, policy {policy!r}:")
            for line in lines:
                log(line)
            record(f"rawconv ({policy})", m)
    names = list(results)
    ref = results[names[0]]["losses"]
    log(f"{'step':>4}  " + "  ".join(f"{n:>24}" for n in names))
    for i in range(steps):
        log(f"{i:>4}  " + "  ".join(f"{results[n]['losses'][i]:>24.7f}" for n in names))
    log("step ms " + "  ".join(f"{n}: {results[n]['step_ms']:.2f}" for n in names))
    worst = 0.0
    for n in names[1:]:
        for a, b in zip(results[n]["losses"], ref):
            worst = max(worst, abs(a - b) / abs(b))
    log(f"largest relative loss difference vs {names[0]}: {worst:.2e} (tolerance {rtol:g})")
    assert worst <= rtol, f"losses differ by {worst:.2e} > {rtol:g}"
    results["_worst_rel"] = worst
    return results


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--steps", type=int, default=8, help="SGD steps of each variant")
    ap.add_argument("--batch", type=int, default=16, help="crops per batch")
    ap.add_argument("--crop", type=int, default=32, help="crop size (pixels, square)")
    ap.add_argument("--width", type=int, default=16, help="channels of the network's first layer")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cpu: oneDNN; cuda: cuDNN")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads; None: torch's own count")
    ap.add_argument("--rtol", type=float, default=1e-4,
                    help="largest relative difference of a step's loss from torch's")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    return run(args.steps, args.batch, args.crop, args.device, args.width, args.rtol)


if __name__ == "__main__":
    main()
