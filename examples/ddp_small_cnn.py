"""Train a small CNN on rawconv with DistributedDataParallel (2 processes), with ONE tuning decision
shared by every rank, and check the losses against a single-process run of the same global batch.

The task (as ``train_small_cnn.py``): denoise 32x32 crops of the photo matplotlib ships
(``grace_hopper.jpg``); SGD on the MSE. The network has no BatchNorm (under DDP each rank would
normalise by its own half-batch's statistics, so the losses would differ by more than rounding;
``torch.nn.SyncBatchNorm`` is the DDP answer to that).

Each of ``--nprocs`` processes (``torch.multiprocessing.spawn``):

1. joins the process group (``gloo`` on CPU; on CUDA ``nccl`` with one GPU per rank, else ``gloo``
   with every rank on ``cuda:0``: NCCL refuses two ranks on one GPU);
2. converts the same model with ``rawconv.distributed.convert(model, x)``: rank 0 searches each
   distinct convolution problem once (``--strategy split``: the ranks share the problems) and every
   rank pins the same candidate per layer; ``rawconv.distributed.check_consistent`` prints the
   layer x rank table and raises if any layer differs;
3. wraps the model in ``torch.nn.parallel.DistributedDataParallel`` and trains ``--steps`` steps on
   its shard of each global batch; the loss of a step is the mean of the ranks' losses.

Then this process trains the same model (same initial weights, same choices pinned by name, the
whole global batch at once) and compares the losses step by step.

**Tolerance.** The two runs compute the same sums in another order, nothing else: DDP averages
the ranks' gradients (each the mean over its shard) with an all-reduce, where one process takes one
mean over the whole batch; oneDNN's backward-weights reduces over 8 samples per rank instead of 16
(and over its threads); the step's loss is the mean of the ranks' means. Each costs float32
rounding, a few units in the last place (2^-24 = 6e-8 relative) per sum, and the weights drift
apart by that much per step. ``--rtol`` (default 1e-5: about 170 ulps, generous for a few
steps) bounds |loss_ddp - loss_single| / |loss_single| at every step; the first step's loss,
computed before any update, differs only by the mean's rounding. The script exits with status 1
when a step is outside it.

    python examples/ddp_small_cnn.py [--nprocs 2] [--steps 4] [--device cpu|cuda] [--strategy one|split]
                                     [--backend gloo|nccl] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
import warnings

import torch
import torch.nn as nn

if __package__ in (None, ""):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import rawconv.distributed  # noqa: E402
import rawconv.nn as rnn  # noqa: E402


def load_image() -> torch.Tensor:
    """grace_hopper.jpg as a (3, H, W) float32 tensor in [0, 1]."""
    import matplotlib.cbook as cbook
    import matplotlib.image as mimage

    with cbook.get_sample_data("grace_hopper.jpg") as f:
        img = mimage.imread(f, format="jpg")
    return torch.from_numpy(img.copy()).permute(2, 0, 1).float() / 255.0


def batches(steps: int, batch: int, crop: int, seed: int = 0):
    """``steps`` global (noisy, clean) batches of random crops (the same in every process)."""
    img = load_image()
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
    """5 convolutions (one transposed), 5 distinct problems; the same weights in every process."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1), nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(2 * width, 2 * width, 3, padding=1), nn.ReLU(),
        nn.ConvTranspose2d(2 * width, width, 3, stride=2, padding=1, output_padding=1), nn.ReLU(),
        nn.Conv2d(width, 3, 3, padding=1))


def _devices(device: str, world: int):
    """(device of each rank, backend default): one GPU per rank when there are enough."""
    if device == "cpu":
        return [torch.device("cpu")] * world, "gloo"
    n = torch.cuda.device_count()
    if n >= world:
        return [torch.device("cuda", r) for r in range(world)], "nccl"
    return [torch.device("cuda", 0)] * world, "gloo"


def worker(rank: int, world: int, opts: dict, data: list, init: str, outdir: str, hook=None) -> None:
    """One rank: process group, shared autotune, consistency check, DDP training on its shard of
    each global batch of ``data``; writes ``rank<N>.json`` into ``outdir``. ``hook(rank, world)``, when given, runs first in the
    process group (the tests run their own collectives there)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    if opts["quiet"]:
        warnings.simplefilter("ignore")
    torch.set_num_threads(opts["threads"])
    devs, default_backend = _devices(opts["device"], world)
    dev = devs[rank]
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    backend = opts["backend"] or default_backend
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world)
    try:
        if hook is not None:
            hook(rank, world)
        per = opts["batch"] // world
        shard = slice(rank * per, (rank + 1) * per)
        model = small_cnn().to(dev)
        example = data[0][0][shard].to(dev)
        t = time.perf_counter()
        model = rawconv.distributed.convert(model, example, strategy=opts["strategy"],
                                            measure_independent=opts["measure_independent"],
                                            autotune_budget_s=opts["budget"])
        convert_s = time.perf_counter() - t
        table = rawconv.distributed.check_consistent(model, raise_on_mismatch=True)
        ddp = DDP(model, device_ids=[dev.index] if backend == "nccl" else None)
        opt = torch.optim.SGD(ddp.parameters(), lr=opts["lr"])
        losses = []
        for noisy, clean in data:
            x, y = noisy[shard].to(dev), clean[shard].to(dev)
            opt.zero_grad()
            loss = nn.functional.mse_loss(ddp(x), y)
            loss.backward()
            opt.step()
            mean = loss.detach().clone()
            dist.all_reduce(mean)          # the step's loss over the global batch: mean of the ranks' means
            losses.append(mean.item() / world)
        after = rawconv.distributed.check_consistent(ddp)   # through the DDP wrapper, after training
        rep = model.rawconv_distributed
        out = {"rank": rank, "device": str(dev), "backend": backend, "losses": losses, "convert_s": convert_s,
               "choices": rnn.pinned_choices(model), "table": table.rows(), "table_text": str(table),
               "consistent": table.consistent and after.consistent and after.rows() == table.rows(),
               "report_text": str(rep),
               "report": {"strategy": rep.strategy, "problems": rep.problems, "shared_s": rep.shared_s,
                          "tune_s": rep.tune_s, "full_autotune_s": rep.full_autotune_s,
                          "independent_s": rep.independent_s, "independent_choices": rep.independent_choices,
                          "records": [r.to_dict() for r in rep.records]},
               "params": [p.detach().double().cpu().flatten().tolist() for p in model.parameters()]}
        with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
            json.dump(out, f)
    finally:
        dist.destroy_process_group()


def single_process(opts: dict, data: list, choices: dict) -> dict:
    """The same training in this process on the whole global batch, with the DDP run's choices
    pinned by layer name (a choice the library does not offer at this batch size falls back to
    the default, said in ``notes``)."""
    devs, _ = _devices(opts["device"], 1)
    dev = devs[0]
    torch.set_num_threads(opts["threads"])
    pinned = {n: c["choice"] for n, c in choices.items()}
    notes = []
    model = rnn.convert(small_cnn().to(dev), choice=pinned)
    opt = torch.optim.SGD(model.parameters(), lr=opts["lr"])
    losses = []
    for noisy, clean in data:
        x, y = noisy.to(dev), clean.to(dev)
        opt.zero_grad()
        try:
            loss = nn.functional.mse_loss(model(x), y)
        except rawconv.NotSupportedError as exc:   # a pinned choice not offered at the global batch size
            notes.append(str(exc))
            rnn.pin_choices(model, {n: None for n in pinned})
            loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "notes": notes, "choices": rnn.pinned_choices(model),
            "params": [p.detach().double().cpu().flatten().tolist() for p in model.parameters()]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(opts: dict, hook=None) -> dict:
    """Spawn the ranks, run the single-process reference, compare; returns the results.
    ``hook``: see :func:`worker`."""
    import torch.multiprocessing as mp

    world = opts["nprocs"]
    if opts["batch"] % world:
        raise SystemExit(f"--batch {opts['batch']} must be a multiple of --nprocs {world}")
    os.environ.setdefault("OMP_NUM_THREADS", str(opts["threads"]))
    data = batches(opts["steps"], opts["batch"], opts["crop"])   # made once, sent to the ranks
    with tempfile.TemporaryDirectory() as outdir:
        init = f"tcp://127.0.0.1:{_free_port()}"
        t = time.perf_counter()
        mp.spawn(worker, args=(world, opts, data, init, outdir, hook), nprocs=world, join=True)
        ddp_s = time.perf_counter() - t
        ranks = []
        for r in range(world):
            with open(os.path.join(outdir, f"rank{r}.json")) as f:
                ranks.append(json.load(f))
    single = single_process(opts, data, ranks[0]["choices"])
    rows = []
    for i, (a, b) in enumerate(zip(ranks[0]["losses"], single["losses"])):
        rel = abs(a - b) / max(abs(b), 1e-30)
        rows.append({"step": i, "ddp": a, "single": b, "abs_diff": abs(a - b), "rel_diff": rel})
    pdiff = max((abs(x - y) / max(abs(y), 1e-30) for pa, pb in zip(ranks[0]["params"], single["params"])
                 for x, y in zip(pa, pb) if abs(y) > 1e-3), default=0.0)
    same_choices = all(r["choices"] == ranks[0]["choices"] for r in ranks)
    ok = all(row["rel_diff"] <= opts["rtol"] for row in rows) and same_choices and all(r["consistent"] for r in ranks)
    return {"options": opts, "ranks": [{k: v for k, v in r.items() if k != "params"} for r in ranks],
            "single": {k: v for k, v in single.items() if k != "params"}, "steps": rows, "rtol": opts["rtol"],
            "max_rel_diff": max(r["rel_diff"] for r in rows), "max_param_rel_diff": pdiff,
            "same_choices": same_choices, "ddp_wall_s": ddp_s, "ok": ok}


def options(nprocs=2, steps=4, batch=16, crop=32, lr=0.05, device="cpu", backend=None, strategy="one", budget=None,
            threads=1, rtol=1e-5, measure_independent=False, quiet=True) -> dict:
    """The run's options (the command line's defaults)."""
    return dict(nprocs=nprocs, steps=steps, batch=batch, crop=crop, lr=lr, device=device, backend=backend,
                strategy=strategy, budget=budget, threads=threads, rtol=rtol, measure_independent=measure_independent,
                quiet=quiet)


def report(res: dict) -> None:
    """Print what :func:`run` returned."""
    a = res["options"]
    r0 = res["ranks"][0]
    print(f"{a['nprocs']} ranks, backend {r0['backend']}, devices {[r['device'] for r in res['ranks']]}")
    print(r0["report_text"])
    print(r0["table_text"])
    print(f"\n{'step':>4}  {'DDP loss (mean of ranks)':>24}  {'single process':>16}  {'|diff|':>9}  {'rel':>9}")
    for row in res["steps"]:
        print(f"{row['step']:>4}  {row['ddp']:>24.9g}  {row['single']:>16.9g}  {row['abs_diff']:>9.2e}  "
              f"{row['rel_diff']:>9.2e}")
    for n in res["single"]["notes"]:
        print(f"note (single process): {n}")
    print(f"max relative loss difference {res['max_rel_diff']:.2e} (tolerance {a['rtol']:g}); parameters after "
          f"{a['steps']} steps differ by {res['max_param_rel_diff']:.2e} relative at most; "
          f"same choices on every rank: {res['same_choices']}")
    print("OK" if res["ok"] else "FAILED: outside the tolerance or the ranks' choices differ")



def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nprocs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16, help="global batch (split evenly over the ranks)")
    ap.add_argument("--crop", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                    help="process group backend (default: gloo on CPU; nccl with one GPU per rank, else gloo)")
    ap.add_argument("--strategy", choices=rawconv.distributed.STRATEGIES, default="one")
    ap.add_argument("--budget", type=float, default=None, help="autotune budget per problem, seconds")
    ap.add_argument("--threads", type=int, default=1, help="torch/oneDNN threads per process")
    ap.add_argument("--rtol", type=float, default=1e-5)
    ap.add_argument("--measure-independent", action="store_true",
                    help="also run one independent autotune per rank and report its time and choices")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--verbose", action="store_true", help="show warnings (timing warnings of the search)")
    a = ap.parse_args(argv)
    opts = options(**{k: v for k, v in vars(a).items() if k not in ("json", "verbose")}, quiet=not a.verbose)
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    res = run(opts)
    report(res)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
