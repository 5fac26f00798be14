"""Per-call host cost on a tiny CPU convolution: rawconv's cached paths against ``F.conv2d``.

The problem is x (1, 8, 8, 8) * w (8, 8, 3, 3), padding 1 (74 kFLOP): the
convolution itself takes a microsecond or two, so the time per call is mostly the host's (Python,
the dispatcher, argument checks, the library call). Rows, all in one process, same thread count:

* ``F.conv2d``: torch's own (its oneDNN / native kernel);
* ``onednn.forward``: rawconv's function form on a cached plan (the fast path);
* ``Convolution.execute``: a plan built once, ``execute(x)`` (weights prepacked);
* ``Convolution.execute(out=)``: the same, writing into a preallocated output;
* ``torch.ops.rawconv.conv_forward``: the custom operator (dispatcher + CPU kernel);
* ``rawconv.ops.conv``: the friendly wrapper over that operator;
* ``do-nothing kernel, same schema``: a Python kernel that returns x at once, registered with
  ``conv_forward``'s schema: the dispatcher's own cost, the operator's floor without compiled code;
* a converted Conv2d + BatchNorm2d + ReLU (``rawconv.nn.convert(..., fuse=True)``, x's channels in
  and out): ``torch.ops.rawconv.conv_bias_act`` on the frozen module's buffers (as torch.compile's
  generated code calls it), the same through torch's generated Autograd kernel (the redispatch
  the direct path skips), torch's module and the converted one in eager and, unless
  ``--no-compile``, both under ``torch.compile`` with inductor freezing (as benchmarks/zoo.py
  compiles for the CPU);

each as microseconds per call (best of ``--repeats`` loops of ``--calls`` back-to-back calls,
after a warm-up; the rows take turns loop by loop) and the ratio to ``F.conv2d``. ``--grad`` adds rows with tensors that require
grad (grad mode on: autograd records a node per call).

Where the time goes (issue 15, measured on a 2-core EPYC, AVX-512, torch 2.14, 1 thread; cProfile on
20k calls and ``time.perf_counter_ns`` loops of each piece):

* the library's own work is three ``dnnl_primitive_execute`` calls, ~4.2 us in all: x's reorder
  into brgconv's blocked layout (~0.7), the convolution (~2.8), y's reorder back (~0.7). torch's
  ``F.conv2d`` on this problem is ``_ConvBackend.Slow2d`` (im2col + gemm on NCHW, no reorders).
  The function forms and the operators also reorder the weights on every call (~0.7 more: they
  never keep reordered weights, since a tensor can change behind their back); a plan with
  ``prepack=True`` reorders its snapshot once.
* around it: the output's allocation (``torch.empty_strided``, ~1.0-1.2), the per-call checks of
  each tensor (type, shape, strides, dtype, device, negative bit: ~0.5 per tensor; a tensor's
  metadata can change in place, so they are never skipped, except for a plan's own weight
  snapshot), data pointers and the handle updates (~0.5), the argument key (~0.3-0.5).
* the operator ``torch.ops.rawconv.conv_forward`` adds torch's dispatcher: calling a Python kernel
  through a schema with four ``int[]`` and five ``str`` arguments costs ~5-6 us before the kernel
  runs (a do-nothing Python kernel with the same schema: 5.8 us; with one Tensor argument: 1.3 us),
  then the Autograd kernel (~0.5). That is torch's argument conversion (IValues to Python objects);
  ``rawconv.ops.conv`` skips it when no mode, tracer or transform is active.

Threads (``--threads 2`` here; the 8-thread Xeon is where the gap was largest): every oneDNN
primitive call opens an OpenMP parallel region on the calling thread's thread count, and a
team's start and barrier cost more than a 512-element reorder (here 2.0 us instead of 0.7 per
reorder with 2 threads). oneDNN and torch share one OpenMP runtime (torch's ``libgomp.so.1``;
libdnnl binds to it because torch is imported first), so this is not two runtimes fighting. torch
avoids the cost for tiny work by running ``at::parallel_for`` inline below its grain size (32768
elements); rawconv does the same in two places. A reorder of fewer than 32768 elements runs with
OpenMP's thread count set to 1 on the calling thread, restored right after (``omp_set_num_threads``
through libdnnl's own handle). And a plan's ``threads="auto"`` (the default) runs a problem of
fewer than 2**17 FLOPs, such as this one (74 kFLOP), on one thread: its primitive descriptors and
primitives are created with the count set to 1 (oneDNN fixes an implementation's thread partition
there, and its primitive cache keys on it) and every call runs under it. ``threads=None`` keeps the
caller's count, an int fixes another. Measured on the 2-core EPYC, 2 threads: ``Convolution.execute``
16.7 -> 8.4 us, ``onednn.forward`` 25.6 -> 10.8, ``rawconv.ops.conv`` 27.1 -> 11.0, the operator
38.2 -> 19.1 (``F.conv2d`` 12-17 us in the same runs).

    python benchmarks/bench_overhead_cpu.py [--threads 1] [--calls 5000] [--repeats 7] [--layout nchw|nhwc]
                                            [--grad] [--clock wall|cpu]
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from rawconv import onednn


def us_per_call(rows, calls: int, repeats: int, warmup: int = 200, clock=time.perf_counter) -> list[float]:
    """Microseconds per call of each ``(name, fn)`` row: the best of ``repeats`` loops of ``calls``
    back-to-back calls. The rows take turns loop by loop, so a burst of load from elsewhere on a
    shared machine hits every row alike, not one."""
    for _, fn in rows:
        for _ in range(warmup):
            fn()
    best = [float("inf")] * len(rows)
    for _ in range(repeats):
        for i, (_, fn) in enumerate(rows):
            t0 = clock()
            for _ in range(calls):
                fn()
            best[i] = min(best[i], (clock() - t0) / calls * 1e6)
    return best


class _ConvBNReLU(torch.nn.Module):
    def __init__(self, c: int, k: int):
        super().__init__()
        self.conv = torch.nn.Conv2d(c, k, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(k)
        self.act = torch.nn.ReLU()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


def _compiled(m, x):
    """``torch.compile(m)`` with inductor freezing, compiled by a first call under no_grad (as
    benchmarks/zoo.py's ``_compile`` does for the CPU)."""
    import torch._inductor.config as icfg

    cm = torch.compile(m, options={"freezing": True})
    with icfg.patch(freezing=True), torch.no_grad():
        cm(x)
    return cm


def _fused_rows(x, fmt, compile_: bool) -> list:
    """Rows for a converted Conv2d + BatchNorm2d + ReLU (``rawconv.nn.convert(..., fuse=True)``): the
    operator ``torch.ops.rawconv.conv_bias_act`` on the frozen module's buffers (as the code
    torch.compile generates calls it), the same through torch's generated Autograd kernel (the
    redispatch below Autograd that the direct path skips: ``rawconv.fused._direct`` switched off
    for that row alone), the converted module in eager, and torch's and the converted module
    under ``torch.compile`` with inductor freezing; all under no_grad."""
    import rawconv.nn as rnn
    from rawconv.pytorch import fused as fu

    c = x.shape[1]
    torch.manual_seed(0)
    net = _ConvBNReLU(c, c).eval().to(memory_format=fmt)
    with torch.no_grad():
        net.bn.running_mean.uniform_(-1, 1)
        net.bn.running_var.uniform_(0.5, 2)
        net.bn.weight.uniform_(0.5, 1.5)
        net.bn.bias.uniform_(-0.5, 0.5)
    conv = rnn.convert(_ConvBNReLU(c, c).eval(), fuse=True).to(memory_format=fmt)
    conv.load_state_dict(net.state_dict())
    rnn.refresh(conv)
    with torch.no_grad():
        want = net(x)
        torch.testing.assert_close(conv(x), want, rtol=1e-4, atol=1e-4)
    fm = next(m for m in conv.modules() if fu.FROZEN_WEIGHT in m._buffers)
    wf, bf = fm._buffers[fu.FROZEN_WEIGHT], fm._buffers[fu.FROZEN_BIAS]
    op = torch.ops.rawconv.conv_bias_act.default
    args = (x, wf, bf, None, [1, 1], [1, 1], [1, 1], 1, "relu", "auto", None, "strict")
    direct = getattr(fu, "_direct", None)   # (a rawconv before the direct path has none: no such row)

    def generic():
        fu._direct = lambda keyset, a, *more: False
        try:
            return op(*args)
        finally:
            fu._direct = direct

    def no_grad(f):
        def call():
            with torch.no_grad():
                return f()
        return call
    with torch.no_grad():
        torch.testing.assert_close(op(*args), want, rtol=1e-4, atol=1e-4)
        if direct is not None:
            torch.testing.assert_close(generic(), want, rtol=1e-4, atol=1e-4)
    rows = [("conv_bias_act op (frozen buffers)", no_grad(lambda: op(*args)))]
    if direct is not None:
        rows.append(("  same, torch's generated path", no_grad(generic)))
    rows += [("torch Conv+BN+ReLU module", no_grad(lambda: net(x))),
            ("converted Conv+BN+ReLU module", no_grad(lambda: conv(x)))]
    if compile_:
        tc, rc = _compiled(net, x), _compiled(conv, x)
        with torch.no_grad():
            torch.testing.assert_close(rc(x), want, rtol=1e-4, atol=1e-4)
        rows += [("torch module, compile+freezing", no_grad(lambda: tc(x))),
                 ("converted module, compile+freezing", no_grad(lambda: rc(x)))]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1, help="torch (and oneDNN OpenMP) threads (default 1)")
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--layout", choices=("nchw", "nhwc"), default="nchw")
    ap.add_argument("--grad", action="store_true", help="also time calls on tensors that require grad")
    ap.add_argument("--no-compile", action="store_true",
                    help="leave out the torch.compile rows (inductor with freezing: compiling takes a while)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall: time.perf_counter (default); cpu: time.process_time, the process's CPU time, which "
                         "leaves out the time the process waits for a core on a busy machine (with --threads 1: "
                         "the calling thread's work)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    fmt = torch.channels_last if args.layout == "nhwc" else torch.contiguous_format
    x = torch.randn(1, 8, 8, 8).contiguous(memory_format=fmt)
    w = torch.randn(8, 8, 3, 3).contiguous(memory_format=fmt)
    y_ref = F.conv2d(x, w, padding=1)
    out = torch.empty_like(y_ref)
    plan = onednn.Convolution(x, w, padding=1, prepack=True)
    torch.testing.assert_close(plan.execute(x), y_ref, rtol=1e-4, atol=1e-4)

    rows = [("F.conv2d", lambda: F.conv2d(x, w, None, 1, 1)),
            ("onednn.forward", lambda: onednn.forward(x, w, None, 1, 1)),
            ("Convolution.execute", lambda: plan.execute(x)),
            ("Convolution.execute(out=)", lambda: plan.execute(x, out=out))]
    try:
        from rawconv import ops
    except ImportError as exc:   # an older rawconv without the custom operators
        print(f"(rawconv.ops not available: {exc})")
        ops = None
    if ops is not None:
        op = torch.ops.rawconv.conv_forward.default
        rows.append(("torch.ops.rawconv.conv_forward",
                     lambda: op(x, w, None, [1, 1], [1, 1], [1, 1], [1, 1], 1, "onednn", "", "strict", "", "")))
        rows.append(("rawconv.ops.conv", lambda: ops.conv(x, w, None, 1, 1)))
        torch.testing.assert_close(ops.conv(x, w, None, 1, 1), y_ref, rtol=1e-4, atol=1e-4)
        # the dispatcher's floor: a Python kernel that does nothing, behind conv_forward's schema
        # (torch converts every argument to a Python object before the kernel runs)
        lib = torch.library.Library("rawconv_bench_floor", "DEF")
        lib.define("noop(" + op._schema.__str__().split("(", 1)[1].split(") ->")[0] + ") -> Tensor")
        lib.impl("noop", lambda x_, *_a: x_, "CPU")
        noop = torch.ops.rawconv_bench_floor.noop.default
        rows.append(("do-nothing kernel, same schema",
                     lambda: noop(x, w, None, [1, 1], [1, 1], [1, 1], [1, 1], 1, "onednn", "", "strict", "", "")))
    # the modules: torch.nn.Conv2d beside rawconv.nn.Conv2d with the same weights (module call included)
    import rawconv.nn as rnn

    tm = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False).to(memory_format=fmt)
    rm = rnn.Conv2d(8, 8, 3, padding=1, bias=False).to(memory_format=fmt)
    with torch.no_grad():
        tm.weight.copy_(w)
        rm.weight.copy_(w)
        torch.testing.assert_close(rm(x), y_ref, rtol=1e-4, atol=1e-4)

    def inference(m):   # the module rows: inference (their parameters require grad)
        def call():
            with torch.no_grad():
                return m(x)
        return call
    rows.append(("torch.nn.Conv2d module", inference(tm)))
    rows.append(("rawconv.nn.Conv2d module", inference(rm)))
    rows += _fused_rows(x, fmt, compile_=not args.no_compile)
    if args.grad:
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        rows.append(("F.conv2d (requires grad)", lambda: F.conv2d(xg, wg, None, 1, 1)))
        if ops is not None:
            rows.append(("rawconv.ops.conv (requires grad)", lambda: ops.conv(xg, wg, None, 1, 1)))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), x{tuple(x.shape)} w{tuple(w.shape)} "
          f"padding 1, {args.layout}, oneDNN {onednn.info()['version']} ({plan.selected.name}, plan threads {onednn._threads_text(plan.threads)}); "
          f"best of {args.repeats} loops of {args.calls} calls, {args.clock} clock")
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    times = us_per_call(rows, args.calls, args.repeats, clock=clock)
    print(f"{'path':<36} {'us/call':>9} {'x F.conv2d':>11}")
    for (name, _), us in zip(rows, times):
        print(f"{name:<36} {us:9.2f} {us / times[0]:11.2f}")
    names = [n for n, _ in rows]
    if "rawconv.nn.Conv2d module" in names:
        tmod, rmod = times[names.index("torch.nn.Conv2d module")], times[names.index("rawconv.nn.Conv2d module")]
        print(f"rawconv.nn.Conv2d / torch.nn.Conv2d (no grad): {rmod / tmod:.2f}x")
    if "converted module, compile+freezing" in names:
        ce, cc = times[names.index("converted Conv+BN+ReLU module")], times[names.index("converted module, "
                                                                                        "compile+freezing")]
        print(f"converted Conv+BN+ReLU, compiled / eager: {cc / ce:.2f}x")

if __name__ == "__main__":
    main()
