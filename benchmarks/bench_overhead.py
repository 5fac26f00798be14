"""Host cost per call of rawconv's three operators against a floor, on a tiny convolution (issue 38).

    python benchmarks/bench_overhead.py [--device cpu|cuda] [--calls N] [--rounds 11] [--layout nchw|nhwc]
                                        [--precision strict|tf32] [--threads 1]

The problem is x (1, 8, 8, 8) * w (8, 8, 3, 3), padding 1: the library's work is a few microseconds,
so the time of N back-to-back calls / N is the host's (Python, the dispatcher, the checks, the
library call). Per direction (forward, backward data, backward weights), in one process:

* ``torch aten``: torch's own operator called directly (``aten.convolution``,
  ``aten.convolution_backward``): torch's kernel with no Python around it;
* ``floor``: a Python custom operator registered here (``torch.library``, namespace
  ``rawconv_floor``, **not** part of rawconv) with exactly the schema of rawconv's operator, whose
  CPU / CUDA kernel does nothing but call torch's kernel above. What any Python operator with this
  schema costs (the dispatcher's conversion of four ``int[]`` and several ``str`` arguments to
  Python objects, one Python frame) plus torch's kernel: the floor rawconv's operator is held to
  (target: rawconv <= floor + 5 us);
* ``rawconv <backend>``: ``torch.ops.rawconv.conv_forward`` / ``conv_backward_data`` /
  ``conv_backward_weights`` as torch.compile's generated code and eager autograd call them (through
  the dispatcher, nothing requiring grad): oneDNN on the CPU, cuDNN's legacy (``cudnn``) and graph
  (``cudnn_graph``) APIs on CUDA.

Rows take turns round by round (a burst of load elsewhere hits every row alike); each round times
``--calls`` back-to-back calls of each row, after a warm-up. Printed: min and median over the
rounds, and each row minus its direction's floor. On CUDA each round's calls are queued behind a
GPU sleep (``torch.cuda._sleep``), so the loop measures the host alone (``--calls`` stays under
the launch queue's depth: 200 by default there); every result is checked against torch's first.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

_SCHEMA_ARGS = "int[] stride, int[] pad_before, int[] pad_after, int[] dilation, int groups"
_floor_lib = None
_stubs: dict = {}


def _stub(shape, like: torch.Tensor) -> torch.Tensor:
    """A stand-in tensor of ``shape`` (one element, expanded; made once per shape, dtype and device)
    for the argument torch's backward kernel reads only the shape and memory format of (as
    ``torch.nn.grad.conv2d_input`` passes one; kept here so the floor has no extra allocation)."""
    key = (tuple(shape), like.dtype, like.device)
    t = _stubs.get(key)
    if t is None:
        t = _stubs[key] = like.new_empty(1).expand(*shape)
    return t


def register_floor():
    """Register ``rawconv_floor::conv_forward`` / ``conv_backward_data`` / ``conv_backward_weights``
    (rawconv's schemas) with Python CPU and CUDA kernels that call torch's own convolution kernels
    and nothing else (symmetric padding: ``pad_before``). Returns the three OpOverloads."""
    global _floor_lib
    if _floor_lib is None:
        lib = _floor_lib = torch.library.Library("rawconv_floor", "DEF")
        lib.define(f"conv_forward(Tensor x, Tensor w, Tensor? bias, {_SCHEMA_ARGS}, str backend, str choice, "
                   "str precision, str bwd_data_choice, str bwd_weights_choice) -> Tensor")
        lib.define(f"conv_backward_data(Tensor grad_y, Tensor w, SymInt[] x_shape, {_SCHEMA_ARGS}, str backend, "
                   "str choice, str precision) -> Tensor")
        lib.define(f"conv_backward_weights(Tensor x, Tensor grad_y, SymInt[] w_shape, {_SCHEMA_ARGS}, bool bias, "
                   "str backend, str choice, str precision) -> (Tensor, Tensor)")
        conv, conv_bwd = torch.ops.aten.convolution.default, torch.ops.aten.convolution_backward.default

        def fwd(x, w, bias, stride, pad_before, pad_after, dilation, groups, *_strings):
            return conv(x, w, bias, stride, pad_before, dilation, False, [0] * len(stride), groups)

        def bwd_data(grad_y, w, x_shape, stride, pad_before, pad_after, dilation, groups, *_strings):
            return conv_bwd(grad_y, _stub(x_shape, grad_y), w, None, stride, pad_before, dilation, False,
                            [0] * len(stride), groups, [True, False, False])[0]

        def bwd_weights(x, grad_y, w_shape, stride, pad_before, pad_after, dilation, groups, bias, *_strings):
            _, dw, db = conv_bwd(grad_y, x, _stub(w_shape, x), [w_shape[0]] if bias else None, stride, pad_before,
                                 dilation, False, [0] * len(stride), groups, [False, True, bias])
            return dw, (db if bias else x.new_empty(0))

        for key in ("CPU", "CUDA"):
            lib.impl("conv_forward", fwd, key)
            lib.impl("conv_backward_data", bwd_data, key)
            lib.impl("conv_backward_weights", bwd_weights, key)
    ops = torch.ops.rawconv_floor
    return ops.conv_forward.default, ops.conv_backward_data.default, ops.conv_backward_weights.default


def time_rows(rows, calls: int, rounds: int, cuda: bool, warmup: int = 50, clock=time.perf_counter
              ) -> list[list[float]]:
    """Microseconds per call of each ``(name, fn)`` row, one value per round (rows interleaved)."""
    for _, fn in rows:
        for _ in range(warmup):
            fn()
    if cuda:
        torch.cuda.synchronize()
    out = [[] for _ in rows]
    for _ in range(rounds):
        for i, (_, fn) in enumerate(rows):
            if cuda:
                torch.cuda._sleep(int(5e7))   # the GPU busy for the whole loop: host time alone
            t0 = clock()
            for _ in range(calls):
                fn()
            out[i].append((clock() - t0) / calls * 1e6)
            if cuda:
                torch.cuda.synchronize()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--calls", type=int, default=None, help="calls per round (default: cpu 2000, cuda 200)")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--layout", choices=("nchw", "nhwc"), default="nhwc")
    ap.add_argument("--precision", choices=("strict", "tf32"), default="strict",
                    help="rawconv's precision argument; torch's rows follow it (allow_tf32 on CUDA)")
    ap.add_argument("--threads", type=int, default=1, help="torch (and oneDNN OpenMP) threads")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall: time.perf_counter; cpu: time.process_time (the process's CPU time: leaves out "
                         "waiting for a core on a shared machine; CPU only, with --threads 1)")
    ap.add_argument("--directions", default="forward,backward_data,backward_weights")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    calls = args.calls or (200 if cuda else 2000)
    torch.set_num_threads(args.threads)
    if cuda:
        torch.backends.cudnn.allow_tf32 = args.precision == "tf32"
    import rawconv.ops  # noqa: F401  (registers torch.ops.rawconv)

    dev = args.device
    fmt = torch.channels_last if args.layout == "nhwc" else torch.contiguous_format
    x = torch.randn(1, 8, 8, 8, device=dev).contiguous(memory_format=fmt)
    w = torch.randn(8, 8, 3, 3, device=dev).contiguous(memory_format=fmt)
    gy = torch.randn(1, 8, 8, 8, device=dev).contiguous(memory_format=fmt)
    one = [1, 1]
    xs, ws = list(x.shape), list(w.shape)
    f_fwd, f_data, f_wts = register_floor()
    r = torch.ops.rawconv
    r_fwd, r_data, r_wts = r.conv_forward.default, r.conv_backward_data.default, r.conv_backward_weights.default
    aten_conv, aten_bwd = torch.ops.aten.convolution.default, torch.ops.aten.convolution_backward.default
    backends = ("cudnn", "cudnn_graph") if cuda else ("onednn",)
    prec = args.precision
    rows, refs = [], {}
    dirs = args.directions.split(",")
    if "forward" in dirs:
        refs["forward"] = aten_conv(x, w, None, one, one, one, False, [0, 0], 1)
        rows += [("forward", "torch aten", lambda: aten_conv(x, w, None, one, one, one, False, [0, 0], 1)),
                 ("forward", "floor", lambda: f_fwd(x, w, None, one, one, one, one, 1, "auto", "", prec, "", ""))]
        rows += [("forward", f"rawconv {b}",
                  lambda b=b: r_fwd(x, w, None, one, one, one, one, 1, b, "", prec, "", "")) for b in backends]
    if "backward_data" in dirs:
        refs["backward_data"] = aten_bwd(gy, x, w, None, one, one, one, False, [0, 0], 1, [True, False, False])[0]
        rows += [("backward_data", "torch aten",
                  lambda: aten_bwd(gy, x, w, None, one, one, one, False, [0, 0], 1, [True, False, False])),
                 ("backward_data", "floor", lambda: f_data(gy, w, xs, one, one, one, one, 1, "auto", "", prec))]
        rows += [("backward_data", f"rawconv {b}",
                  lambda b=b: r_data(gy, w, xs, one, one, one, one, 1, b, "", prec)) for b in backends]
    if "backward_weights" in dirs:
        refs["backward_weights"] = aten_bwd(gy, x, w, None, one, one, one, False, [0, 0], 1,
                                            [False, True, False])[1]
        rows += [("backward_weights", "torch aten",
                  lambda: aten_bwd(gy, x, w, None, one, one, one, False, [0, 0], 1, [False, True, False])),
                 ("backward_weights", "floor",
                  lambda: f_wts(x, gy, ws, one, one, one, one, 1, False, "auto", "", prec))]
        rows += [("backward_weights", f"rawconv {b}",
                  lambda b=b: r_wts(x, gy, ws, one, one, one, one, 1, False, b, "", prec)) for b in backends]
    tol = dict(rtol=1e-2, atol=1e-2) if prec == "tf32" else dict(rtol=1e-4, atol=1e-4)
    from rawconv.errors import NotSupportedError

    kept = []
    for d, name, fn in rows:   # every row's result against torch's, before any timing
        if name != "torch aten":
            try:
                res = fn()
            except NotSupportedError as exc:   # e.g. no graph-API engine for an NCHW problem
                print(f"({d} {name} left out: {str(exc)[:160]})")
                continue
            res = res[0] if isinstance(res, tuple) else res
            torch.testing.assert_close(res, refs[d], **tol, msg=lambda m, d=d, name=name: f"{d} {name}: {m}")
        kept.append((d, name, fn))
    rows = kept
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    times = time_rows([(n, fn) for _, n, fn in rows], calls, args.rounds, cuda, clock=clock)
    where = torch.cuda.get_device_name() if cuda else f"{torch.get_num_threads()} thread(s)"
    print(f"host us per call, x(1,8,8,8) w(8,8,3,3) pad 1, {args.layout}, {prec}, {dev} ({where}), torch "
          f"{torch.__version__}; {args.rounds} interleaved rounds of {calls} back-to-back calls"
          + (" queued behind a GPU sleep" if cuda else "") + f", {args.clock} clock")
    print(f"  {'direction':<17} {'row':<20} {'min':>8} {'median':>8} {'min-floor':>10} {'med-floor':>10}")
    floors = {d: (min(t), statistics.median(t)) for (d, n, _), t in zip(rows, times) if n == "floor"}
    for (d, name, _), t in zip(rows, times):
        lo, med = min(t), statistics.median(t)
        flo, fmed = floors[d]
        print(f"  {d:<17} {name:<20} {lo:8.2f} {med:8.2f} {lo - flo:+10.2f} {med - fmed:+10.2f}")


if __name__ == "__main__":
    main()
