"""How many threads does each side of compare's headline really run, and what does a busy
machine do to each? (issue 34: under two spinning processes the best of N became
``x64:gemm:jit@any`` at ~4x torch on nearly every ResNet-50 layer, ~1.1-1.4x idle)

For a few ResNet-50 layers, times torch's call (``F.conv2d``), rawconv's oneDNN first choice and
``x64:gemm:jit@any`` (weights per call) call by call, and records per call: wall time, process
CPU time, the on-CPU and run-queue time of each of our threads (``/proc/self/task/*/schedstat``)
and so how many threads did work (on CPU for more than 10% of the call's wall time). Once as the
machine is and once beside ``--load`` spinning processes (default: one per usable CPU). Also
prints which OpenMP runtimes the process mapped and OpenMP's thread count as oneDNN sees it.

    python benchmarks/diag_load_threads.py [--layers 0,2,5,10,15,22] [--calls 20] [--load N]
        [--threads N,...]    (rawconv's threads= for the two oneDNN rows; default: torch's count)
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from rawconv import onednn  # noqa: E402
from rawconv.core import presets  # noqa: E402


def task_times() -> dict:
    """{tid: (on-CPU ns, run-queue ns, context switches)} of this process's threads."""
    out = {}
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/schedstat") as f:
                a, b = f.read().split()[:2]
            with open(f"/proc/self/task/{t}/status") as f:
                sw = sum(int(ln.split()[1]) for ln in f if "ctxt_switches" in ln)
            out[t] = (int(a), int(b), sw)
        except (OSError, ValueError):
            pass
    return out


def one_call(fn):
    t0 = task_times()
    c0 = time.process_time()
    w0 = time.perf_counter()
    fn()
    w1 = time.perf_counter()
    c1 = time.process_time()
    t1 = task_times()
    wall = w1 - w0
    z = (0, 0, 0)
    run = {k: (t1[k][0] - t0.get(k, z)[0]) / 1e9 for k in t1}
    wait = sum((t1[k][1] - t0.get(k, z)[1]) / 1e9 for k in t1)
    sw = sum(t1[k][2] - t0.get(k, z)[2] for k in t1)
    busy = sum(v > 0.1 * wall for v in run.values())
    return wall, c1 - c0, sum(run.values()), wait, busy, sw


def summarize(calls):
    med = [statistics.median(v) for v in zip(*calls)]
    mn = min(c[0] for c in calls)
    return (f"wall med {1e3 * med[0]:7.2f} ms min {1e3 * mn:6.2f}; cpu {1e3 * med[1]:7.2f} ms; "
            f"runq {1e3 * med[3]:6.2f} ms; threads working {med[4]:.0f}; ctx switches {med[5]:.0f}")


def rows_for(problem, threads):
    x, w, b = problem.make_inputs(seed=0)
    pad = problem.pad_before
    out = {}
    for t in threads:
        def tc(t=t):
            old = torch.get_num_threads()
            torch.set_num_threads(t)
            try:
                return F.conv2d(x, w, b, problem.stride, pad, problem.dilation, problem.groups)
            finally:
                torch.set_num_threads(old)
        out[f"torch (set_num_threads({t}))"] = tc
        plan = onednn.Convolution(x, w, b, problem.stride, list(zip(problem.pad_before, problem.pad_after)),
                                  problem.dilation, problem.groups, threads=t)
        impls = plan.implementations
        first = impls[0]
        gemm = next((i for i in impls if i.choice.startswith("x64:gemm:jit")), None)
        for label, impl in (("first " + first.choice, first), ("gemm", gemm)):
            if impl is None:
                continue
            p = onednn.Convolution(x, w, b, problem.stride, list(zip(problem.pad_before, problem.pad_after)),
                                   problem.dilation, problem.groups, threads=t, impl=impl.index)
            out[f"{label} (threads={t})"] = (lambda p=p: p.execute(x, w, b))
    return out


def measure(layers, calls, threads):
    ps = presets.get("resnet50", 1)
    for i in layers:
        p = ps[i]
        fns = rows_for(p, threads)
        for fn in fns.values():
            fn(), fn()
        got = {k: [] for k in fns}
        for _ in range(calls):   # interleaved: each row one call in turn
            for k, fn in fns.items():
                got[k].append(one_call(fn))
        print(f"  {p.name} {p.describe()}")
        for k, v in got.items():
            print(f"    {k:<44} {summarize(v)}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", default="0,2,5,10,15,22")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--load", type=int, default=None)
    ap.add_argument("--threads", default="")
    args = ap.parse_args(argv)
    n = args.load if args.load is not None else len(os.sched_getaffinity(0))
    threads = [int(t) for t in args.threads.split(",") if t] or [torch.get_num_threads()]
    layers = [int(v) for v in args.layers.split(",")]
    x = torch.randn(1, 8, 8, 8)
    F.conv2d(x, torch.randn(8, 8, 3, 3))
    onednn.Convolution(x, torch.randn(8, 8, 3, 3))
    with open("/proc/self/maps") as f:
        omp = sorted({ln.split()[-1] for ln in f if "omp" in ln.split()[-1]})
    print(f"torch.get_num_threads() {torch.get_num_threads()}; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')} "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')} GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT')}; "
          f"OpenMP runtimes mapped: {omp}")
    for label, k in (("as is", 0), ("loaded", n)):
        procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(k)]
        try:
            if procs:
                time.sleep(1.0)
            print(f"{label} ({k} spinners), load average {os.getloadavg()[0]:.2f}", flush=True)
            measure(layers, args.calls, threads)
        finally:
            for p in procs:
                p.kill()
                p.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
