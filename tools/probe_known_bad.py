"""Probe a oneDNN 1x1 backward-weights implementation for scratchpad overruns (oneDNN issue #6035).

Each case runs in its own process under a timeout. There, rawconv builds the implementation,
replaces its scratchpad by one followed by a 1 MiB guard band filled with 0xA5, runs it three
times and reports how far past the end of the scratchpad it wrote and the max relative error of
dW against float64: an overrun is seen whether or not the process dies of it. One line per case:

    isa=AVX2   t=1 ic= 4 oc= 8 mb=32 ih= 32 s=2 nhwc jit_1x1:avx2@user -> OVERFLOW  past_end=3776 B err=4.9e-07

Verdicts: ``ok``; ``OVERFLOW`` (bytes written past the scratchpad; dW right); ``WRONG`` (dW
outside 1e-4 relative); ``CRASH rc=...``; ``HANG`` (killed by the timeout); ``n/a`` (the
implementation is not offered for that case). Used to find the condition in rawconv/known_bad.py:

    python tools/probe_known_bad.py --isa AVX2 --threads 1,2 --ic 1,2,3,4,5,6,7,8,12,16 --stride 1,2,3
    python tools/probe_known_bad.py --impl jit_1x1:avx512_core@user --oc 16 --ih 32,48,128 --ic 4,8,15,16,24
"""
from __future__ import annotations

import argparse
import itertools
import os
import re
import subprocess
import sys

GUARD = 1 << 20


def one(args) -> None:
    """(child) One case; prints ``selected ...`` then one ``run i: ...`` line per run."""
    import torch

    from rawconv import onednn
    from rawconv.onednn import _ffi as _dnnl
    from rawconv.cudnn_graph import reference
    from rawconv.problem import ConvProblem

    sh, sw = (int(v) for v in (args.stride.split("x") * 2)[:2])
    p = ConvProblem(n=args.mb, c=args.ic, k=args.oc, in_spatial=(args.ih, args.ih), kernel=(1, 1), stride=(sh, sw),
                    dtype=args.dtype, layout=args.layout)
    plan = onednn.Convolution.from_problem(p, direction="backward_weights", allow_known_bad=True)
    sel = plan.select(args.impl)
    print("selected", sel.name, sel.layouts, "src", sel.formats.get("x"), flush=True)
    b = plan._build(sel.index)
    n = b.scratchpad.numel()
    buf = torch.full((n + GUARD,), 0xA5, dtype=torch.uint8)
    _dnnl.call("dnnl_memory_set_data_handle", b._keep[0], _dnnl.ffi.cast("void *", buf.data_ptr()))
    b.scratchpad = buf
    t = plan._example_tensors()
    ref, _ = reference(p, "backward_weights", {"x": t["x"], "dy": t["grad_y"]})
    for i in range(3):
        dw = plan.execute(**t)
        err = ((dw.double() - ref).abs().max() / ref.abs().max()).item()
        changed = (buf[n:] != 0xA5).nonzero()
        far = int(changed.max()) + 1 if changed.numel() else 0
        print(f"run {i}: scratchpad {n} B, furthest {far} B past the end, rel err {err:.3g}", flush=True)


def case(args, isa, threads, ic, oc, ih, stride, layout) -> str:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    env.pop("ONEDNN_MAX_CPU_ISA", None)
    if isa:
        env["ONEDNN_MAX_CPU_ISA"] = isa
    cmd = [sys.executable, __file__, "--one", "--impl", args.impl, "--ic", str(ic), "--oc", str(oc),
           "--mb", str(args.mb), "--ih", str(ih), "--stride", stride, "--layout", layout, "--dtype", args.dtype]
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        out, rc = r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
        rc = "TIMEOUT"
    runs = re.findall(r"furthest (\d+) B past the end, rel err (\S+)", out)
    past = max((int(a) for a, _ in runs), default=None)
    err = max((float(e) for _, e in runs), default=None)
    if "NotSupportedError" in out:
        verdict = "n/a"
    elif rc == "TIMEOUT":
        verdict = "HANG"
    elif rc != 0:
        verdict = f"CRASH rc={rc}"
    else:
        verdict = " + ".join(v for v, c in (("OVERFLOW", past), ("WRONG", err is not None and err > 1e-4)) if c) or "ok"
    last = out.strip().splitlines()[-1][:80] if out.strip() and verdict not in ("ok", "n/a") and not runs else ""
    return (f"isa={isa or 'native':6} t={threads} ic={ic:2} oc={oc:2} mb={args.mb} ih={ih:3} s={stride} {layout} "
            f"{args.impl} -> {verdict:<10} past_end={past} B err={'-' if err is None else f'{err:.2g}'} {last}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--impl", default="jit_1x1:avx2@user", help="implementation (name@layouts)")
    ap.add_argument("--isa", default="", help="ONEDNN_MAX_CPU_ISA for the cases (default: none, the CPU's)")
    ap.add_argument("--threads", default="1", help="comma-separated thread counts")
    ap.add_argument("--ic", default="4", help="comma-separated input channels")
    ap.add_argument("--oc", default="8", help="comma-separated output channels")
    ap.add_argument("--mb", type=int, default=32)
    ap.add_argument("--ih", default="32", help="comma-separated input sizes (square)")
    ap.add_argument("--stride", default="2", help="comma-separated strides; 1x2 for (1, 2)")
    ap.add_argument("--layout", default="nhwc", help="comma-separated: nhwc, nchw")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds per case")
    args = ap.parse_args()
    if args.one:
        args.ic, args.oc, args.ih = int(args.ic), int(args.oc), int(args.ih)
        one(args)
        return
    lists = [[int(v) for v in s.split(",")] for s in (args.threads, args.ic, args.oc, args.ih)]
    for t, ic, oc, ih, s, lay in itertools.product(*lists, args.stride.split(","), args.layout.split(",")):
        print(case(args, args.isa, t, ic, oc, ih, s, lay), flush=True)


if __name__ == "__main__":
    main()
