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

Per-step times are measured as ``rawconv compare`` measures its rows (``rawconv.bench``): the
variants train in lockstep, step ``i`` of each in turn (the order rotating), each step's wall time
recorded beside the process CPU time and the time our threads waited for a CPU. A variant's step
time is the median over the steps after the first (of the clean steps, during which our threads
did not wait for a CPU, when most were), and its ratio to torch is taken within each step, then
the median, with the interquartile range; a busy machine gets the same warnings as ``compare``.

    python examples/train_small_cnn.py [--steps 8] [--batch 16] [--crop 32] [--device cpu|cuda]
"""
from __future__ import annotations

import argparse
import copy
import os
import sys

import torch
import torch.nn as nn

if __package__ in (None, ""):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import rawconv.nn as rnn  # noqa: E402
from rawconv import bench, onednn  # noqa: E402
from rawconv.ops import TrainingChoice  # noqa: E402


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
    """Pin every rawconv layer of ``model`` (the whole training step: forward and both backward
    directions, one ``rawconv.ops.TrainingChoice`` per layer) to the oneDNN implementation
    ``policy`` picks for each of its problems; returns one line per layer saying which."""
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
    lines, choices = [], {}
    for name, m in model.named_modules():
        if m not in shapes:
            continue
        xs, ys = shapes[m]
        w = m.weight.detach()
        kw = dict(stride=m.stride, padding=m.padding, dilation=m.dilation, groups=m.groups)
        # the library's directions: a transposed layer is its matching convolution's backward data
        # (input of y's shape, output of x's), its input gradient that convolution's forward
        cx = torch.empty(ys if isinstance(m, nn.ConvTranspose2d) else xs)
        step = TrainingChoice(**{d: _pick(onednn.implementations(cx, w, **kw, direction=d), policy)
                                 for d in ("forward", "backward_data", "backward_weights")})
        choices[name] = step
        if isinstance(m, nn.ConvTranspose2d):
            lines.append((name, type(m).__name__, step.backward_data, step.forward, step.backward_weights))
        else:
            lines.append((name, type(m).__name__, step.forward, step.backward_data, step.backward_weights))
    rnn.pin_choices(model, choices)
    # columns as wide as their longest name (an ISA's implementation names differ in length)
    wn, wt, wf, wx = (max((len(r[i]) for r in lines), default=0) for i in range(4))
    return [f"    {n:<{wn}} {t:<{wt}} forward {f:<{wf}} grad-x {x:<{wx}} grad-w {g}" for n, t, f, x, g in lines]


def train(models: dict, data, device: str, lr: float = 0.05) -> dict:
    """Plain SGD on ``data`` for every model of ``models`` ({name: module}) in lockstep: step
    ``i`` of each in turn, the order rotating from step to step, each step timed with
    ``rawconv.bench.measure_call`` (wall, process CPU and run-queue time). Returns
    ``{name: (losses, rawconv.bench.Timed of the steps after the first)}``."""
    opts, losses, timed = {}, {}, {}
    for n, model in models.items():
        model.train()
        opts[n] = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        losses[n], timed[n] = [], bench.Timed(n)
    names = list(models)
    for i, (noisy, clean) in enumerate(data):
        noisy, clean = noisy.to(device), clean.to(device)
        for k in range(len(names)):
            n = names[(k + i) % len(names)]
            model, opt = models[n], opts[n]

            def step():
                opt.zero_grad(set_to_none=True)
                loss = nn.functional.mse_loss(model(noisy), clean)
                loss.backward()
                opt.step()
                if device == "cuda":
                    torch.cuda.synchronize()
                return loss

            loss, call = bench.measure_call(step)
            losses[n].append(loss.item())
            if i > 0 or len(data) == 1:   # the first step builds every plan: not timed
                timed[n].rounds.append([call])
    return {n: (losses[n], timed[n]) for n in names}


def run(steps: int = 8, batch: int = 16, crop: int = 32, device: str = "cpu", width: int = 16,
        rtol: float = 1e-4, log=print) -> dict:
    """Train every variant; returns {variant: {"losses": [...], "step_ms", "ratio", "flags"}} and
    ``"_warnings"`` (the timing warnings), and logs a table. Raises AssertionError when a
    variant's losses leave ``rtol`` of torch's."""
    img = load_image()
    data = batches(img, steps, batch, crop)
    base = small_cnn(width)
    models = {}
    if device == "cuda":
        torch.backends.cudnn.benchmark = True
        models["torch (cudnn.benchmark)"] = copy.deepcopy(base).cuda()
        m = rnn.convert(copy.deepcopy(base).cuda(), autotune=data[0][0].cuda())
        log(str(m.rawconv_report))
        models["rawconv (autotuned)"] = m
    else:
        models["torch"] = copy.deepcopy(base)
        for policy in ("first", "gemm"):
            m = rnn.convert(copy.deepcopy(base))
            lines = pin(m, data[0][0], policy)
            log(f"rawconv pinned, policy {policy!r} (forward and both backward passes):")
            for line in lines:
                log(line)
            models[f"rawconv ({policy})"] = m
    trained = train(models, data, device)
    names = list(models)
    ref_t = trained[names[0]][1]
    results = {}
    for n in names:
        losses, t = trained[n]
        q = bench.ratio(ref_t, t) if n != names[0] else None
        results[n] = {"losses": losses, "step_ms": t.stats().median_ms, "cpu_ms": t.wall_cpu_ms()[1],
                      "ratio": q.as_dict() if q is not None else None, "flags": t.flags()}
    ref = results[names[0]]["losses"]
    log(f"{'step':>4}  " + "  ".join(f"{n:>24}" for n in names))
    for i in range(steps):
        log(f"{i:>4}  " + "  ".join(f"{results[n]['losses'][i]:>24.7f}" for n in names))
    parts = []
    for n in names:
        r = results[n]
        q = r["ratio"]
        parts.append(f"{n}: {r['step_ms']:.2f} (CPU {r['cpu_ms']:.2f})"
                     + (f", {names[0]} / it {q['value']:.2f}x [{q['lo']:.2f}-{q['hi']:.2f}]" if q else ""))
    log("step ms (median over the steps after the first, variants in lockstep; x: within each step, median "
        "[interquartile range]): " + "; ".join(parts))
    for n in names:
        for f in results[n]["flags"]:
            log(f"  timing {n}: {f}")
    results["_warnings"] = bench.flag_warnings([results[n]["flags"] for n in names])
    for w in results["_warnings"]:
        log(f"warning: {w}")
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
