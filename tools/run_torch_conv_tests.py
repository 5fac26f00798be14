"""Run PyTorch's own convolution tests (``test/nn/test_convolution.py``) with rawconv's modules in
torch.nn's place, and report per test what rawconv changed.

    python tools/run_torch_conv_tests.py --file /path/to/test_convolution.py
    python tools/run_torch_conv_tests.py --download           # fetch the pinned file into ~/.cache/rawconv
    python tools/run_torch_conv_tests.py --file F -k output_size -k empty --verbose
    python tools/run_torch_conv_tests.py --file F --functional --json out.json

What it does:

* ``torch.nn.Conv1d/2d/3d`` and ``ConvTranspose1d/2d/3d`` become rawconv's classes
  (:mod:`rawconv.nn`, subclassed here only to watch each call) before the test file is imported, so
  every ``nn.Conv2d(...)`` the tests build is rawconv's. With ``--functional`` the test file's ``F``
  (its alias of ``torch.nn.functional``, not the module itself: rawconv's own float64 references
  call torch's functions) also routes ``conv1d/2d/3d`` and ``conv_transpose1d/2d/3d`` through
  :func:`rawconv.ops.conv` / :func:`rawconv.ops.conv_transpose`.
* Only the CPU tests run (``PYTORCH_TESTING_DEVICE_ONLY_FOR=cpu``; CUDA-only tests skip without a GPU).
* Each module call is shadowed by torch's own forward on the same parameters and input (the torch
  class's ``forward``, under ``no_grad``): a value outside tolerance is a **wrong number**, another
  memory format than torch's is a **layout** difference, rawconv refusing what torch runs is
  **refused**, both raising but rawconv's error not an instance of torch's class is an **error type**
  difference. ``--no-shadow`` turns this off.
* Every :class:`rawconv.errors.InternalError` created during a test is recorded (**internal**), even
  when the test catches it (it is a RuntimeError); an ``assertRaises`` that a rawconv error of another
  class escaped is an **error type** mismatch; one whose message regex a rawconv error missed, a
  **message** mismatch.
* A module call that no rawconv library can run (float64 or complex on the CPU, float16 where this
  CPU's oneDNN has none...) runs on torch's own kernel (:mod:`rawconv.pytorch.fallback`), as a
  user's model would: the summary says how many calls did, per reason.

Per test: pass / fail / error / skip / xfail / xpass, the tags above, and the first line of the
reason; then summary counts. Exit status 0 unless ``--strict`` and a test failed or an
InternalError was seen.

The test file is PyTorch's (BSD licence), not rawconv's: it is not kept in this repository. Give a
path, or ``--download`` (needs network access) which fetches the version pinned below (checked
against torch 2.14.1, by SHA-256). It imports ``torch.testing._internal`` helpers that ship with
torch, and ``expecttest`` (``pip install expecttest``).
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import importlib.util
import json
import os
import sys
import time
import traceback
import unittest
from pathlib import Path

PINNED_COMMIT = "00131b6bd4bedfa71eb27b407292be0ba45e5ee8"   # pytorch/pytorch, test/nn/test_convolution.py
PINNED_SHA256 = "ceb6b29c05cd27233b4fb27f129155a670d0e2c1918a71a20783341fca3bf13b"
PINNED_URL = f"https://raw.githubusercontent.com/pytorch/pytorch/{PINNED_COMMIT}/test/nn/test_convolution.py"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rawconv" / "test_convolution.py"

MODULES = ("Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d")
FUNCTIONS = ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")

# Why a test is expected to fail with rawconv in torch's place (what the report prints beside it).
# Keyed by a substring of the test id; the first match wins.
KNOWN = {
    "test_grad_conv": "float32 rounding: the test compares rawconv's gradient with torch.nn.grad's, two float32 "
                      "results, at assertEqual's default tolerance (rtol 1.3e-6, atol 1e-5); against float64 "
                      "rawconv's was the closer of the two where this failed (4.8e-6 vs torch's 8.2e-6 relative)",
    "complex": "complex dtypes: the modules run them on torch's kernel (rawconv.pytorch.fallback); rawconv.ops "
               "(--functional) takes float32, float16, bfloat16 (and float64 on cuDNN) only",
    "float64": "float64 on CPU: oneDNN 3.2 has no f64 convolution; the modules run it on torch's kernel, "
               "rawconv.ops (--functional) refuses it (ArgumentError)",
    "double": "float64 on CPU: oneDNN 3.2 has no f64 convolution; the modules run it on torch's kernel, "
              "rawconv.ops (--functional) refuses it (ArgumentError)",
    "bfloat16": "bfloat16: oneDNN 3.2 offers no bf16 convolution on this CPU (rawconv.onednn.capabilities(); "
                "none at all on AVX2): the modules run it on torch's kernel, rawconv.ops raises NotSupportedError",
    "float16": "float16: oneDNN 3.2 offers no f16 convolution on this CPU (rawconv.onednn.capabilities(); "
               "none at all on AVX2): the modules run it on torch's kernel, rawconv.ops raises NotSupportedError",
}

# ---------------------------------------------------------------------------- records per test
_current: list = [None]             # the running test's id
_events: dict = collections.defaultdict(list)   # test id -> [(tag, detail)]
_calls: collections.Counter = collections.Counter()   # test id -> rawconv module/function calls


def _note(tag: str, detail: str) -> None:
    key = _current[0] or "<import>"
    if len(_events[key]) < 50:
        _events[key].append((tag, detail.splitlines()[0][:300] if detail else ""))


def _fmt(t):
    """A tensor's memory format as torch decides it: 'cl', 'contig', 'both' (either fits), 'other'."""
    import torch

    if t.dim() not in (4, 5):
        return "both" if t.is_contiguous() else "other"
    cl = torch.channels_last if t.dim() == 4 else torch.channels_last_3d
    a, b = t.is_contiguous(), t.is_contiguous(memory_format=cl)
    return "both" if a and b else "contig" if a else "cl" if b else "other"


_TOL = {"torch.float32": 1e-4, "torch.float16": 1e-2, "torch.bfloat16": 6e-2, "torch.float64": 1e-10}


def _compare(what: str, y, ref) -> None:
    import torch

    if not isinstance(y, torch.Tensor) or not isinstance(ref, torch.Tensor):
        return
    if tuple(y.shape) != tuple(ref.shape):
        _note("wrong-number", f"{what}: shape {tuple(y.shape)}, torch {tuple(ref.shape)}")
        return
    if y.dtype != ref.dtype:
        _note("wrong-number", f"{what}: dtype {y.dtype}, torch {ref.dtype}")
        return
    if y.numel():
        yd, rd = y.detach().double(), ref.detach().double()
        # equal values differ by nothing: infinities too, and NaNs in the same places (torch.empty inputs
        # hold anything)
        same = (yd == rd) | (yd.isnan() & rd.isnan())
        err = torch.where(same, 0.0, (yd - rd).abs()).nan_to_num(nan=float("inf")).max().item()
        scale = max(1.0, rd.abs().nan_to_num(nan=0.0).max().item())
        if (yd.isnan() != rd.isnan()).any() or err > _TOL.get(str(y.dtype), 1e-4) * scale:
            _note("wrong-number", f"{what}: max abs err {err:.3g} (scale {scale:.3g}) vs torch")
    fy, fr = _fmt(y), _fmt(ref)
    if "both" not in (fy, fr) and fy != fr:
        _note("layout", f"{what}: rawconv {fy}, torch {fr}")


def _desc(m, x) -> str:
    shape = tuple(x.shape) if hasattr(x, "shape") else type(x).__name__
    return f"{type(m).__name__} x{shape} {getattr(x, 'dtype', '')} fmt={_fmt(x) if hasattr(x, 'dim') else ''}"


def _shadow_module(cls, torch_cls, shadow: bool):
    """rawconv's module class, watched: each call counted and compared with torch's own forward."""
    import torch

    from rawconv.errors import RawconvError

    class Watched(cls):
        def forward(self, x, *args, **kwargs):
            _calls[_current[0]] += 1
            try:
                y = super().forward(x, *args, **kwargs)
            except Exception as exc:
                if shadow and isinstance(exc, RawconvError) and isinstance(x, torch.Tensor):
                    try:
                        with torch.no_grad():
                            torch_cls.forward(self, x.detach(), *args, **kwargs)
                    except Exception as texc:   # noqa: BLE001
                        if not isinstance(exc, type(texc)):
                            _note("error-type", f"{_desc(self, x)}: rawconv {type(exc).__name__} is not torch's "
                                                f"{type(texc).__name__} ({texc})")
                    else:
                        _note("refused", f"{_desc(self, x)}: rawconv raised {type(exc).__name__}: {exc}")
                raise
            if shadow and isinstance(x, torch.Tensor):
                try:
                    with torch.no_grad():
                        ref = torch_cls.forward(self, x.detach(), *args, **kwargs)
                except Exception as texc:   # noqa: BLE001
                    _note("accepted", f"{_desc(self, x)}: torch raised {type(texc).__name__}: {texc}")
                else:
                    _compare(_desc(self, x), y, ref)
            return y

    Watched.__name__ = Watched.__qualname__ = cls.__name__
    Watched.__module__ = cls.__module__
    return Watched


class _FunctionalProxy:
    """The test file's ``F``: torch.nn.functional, with the conv functions on rawconv."""

    def __init__(self, real, shadow: bool):
        import rawconv.ops as ops
        import torch

        self._real = real
        self._shadow = shadow

        def conv(orig):
            def f(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
                _calls[_current[0]] += 1
                y = ops.conv(input, weight, bias, stride, padding, dilation, groups)
                if shadow:
                    with torch.no_grad():
                        _compare(f"F.{orig.__name__} x{tuple(input.shape)}", y,
                                 orig(input.detach(), weight.detach(), None if bias is None else bias.detach(),
                                      stride, padding, dilation, groups))
                return y
            return f

        def tconv(orig):
            def f(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
                _calls[_current[0]] += 1
                y = ops.conv_transpose(input, weight, bias, stride, padding, output_padding, groups, dilation)
                if shadow:
                    with torch.no_grad():
                        _compare(f"F.{orig.__name__} x{tuple(input.shape)}", y,
                                 orig(input.detach(), weight.detach(), None if bias is None else bias.detach(),
                                      stride, padding, output_padding, groups, dilation))
                return y
            return f

        for name in FUNCTIONS:
            orig = getattr(real, name)
            setattr(self, name, tconv(orig) if "transpose" in name else conv(orig))

    def __getattr__(self, name):
        return getattr(self._real, name)


def _patch_assert_raises() -> None:
    """Record rawconv errors that escape an assertRaises of another class, or miss its regex."""
    from rawconv.errors import RawconvError

    ctx = unittest.case._AssertRaisesContext
    orig = ctx.__exit__

    def __exit__(self, exc_type, exc_value, tb):
        if exc_type is not None and isinstance(exc_value, RawconvError) and not issubclass(exc_type, self.expected):
            names = getattr(self.expected, "__name__", None) or "/".join(e.__name__ for e in self.expected)
            _note("error-type", f"assertRaises({names}) got rawconv's {exc_type.__name__}: {exc_value}")
        try:
            return orig(self, exc_type, exc_value, tb)
        except AssertionError:
            if isinstance(exc_value, RawconvError):
                _note("message", f"{exc_type.__name__}: {str(exc_value)[:200]!r} does not match "
                                 f"{getattr(self.expected_regex, 'pattern', self.expected_regex)!r}")
            raise

    ctx.__exit__ = __exit__


def _patch_internal_error() -> None:
    from rawconv import errors

    orig = errors.InternalError.__init__

    def __init__(self, *args, **kwargs):
        _note("internal", str(args[0]) if args else "")
        orig(self, *args, **kwargs)

    errors.InternalError.__init__ = __init__


# ---------------------------------------------------------------------------- running
class _Result(unittest.TestResult):
    def __init__(self, verbose: bool):
        super().__init__()
        self.rows: dict = {}
        self.verbose = verbose
        self._t0 = 0.0

    def startTest(self, test):
        _current[0] = test.id()
        self._t0 = time.perf_counter()
        super().startTest(test)

    def _row(self, test, status, reason=""):
        tid = test.id()
        self.rows[tid] = {"status": status, "reason": reason.strip().splitlines()[0][:300] if reason else "",
                          "seconds": round(time.perf_counter() - self._t0, 3)}
        if self.verbose:
            print(f"{status:6s} {tid}", flush=True)

    def addSuccess(self, test):
        super().addSuccess(test)
        self._row(test, "pass")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._row(test, "fail", "".join(traceback.format_exception_only(err[0], err[1])))

    def addError(self, test, err):
        super().addError(test, err)
        self._row(test, "error", "".join(traceback.format_exception_only(err[0], err[1])))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._row(test, "skip", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._row(test, "xfail")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._row(test, "xpass")

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            kind = "fail" if issubclass(err[0], test.failureException) else "error"
            self._row(test, kind, "".join(traceback.format_exception_only(err[0], err[1])))


def _iter_tests(suite):
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from _iter_tests(t)
        else:
            yield t


def _tags(tid: str, row: dict) -> list:
    tags = sorted({tag for tag, _ in _events.get(tid, ())})
    reason = row.get("reason", "")
    if row["status"] in ("fail", "error"):
        if "InternalError" in reason and "internal" not in tags:
            tags.append("internal")
        if any(w in reason for w in ("not close", "Mismatched elements", "Scalars are not equal")) \
                and "wrong-number" not in tags:
            tags.append("wrong-number(test)")
    return tags


def _known(tid: str, row: dict) -> str:
    text = tid + " " + row.get("reason", "")
    for key, why in KNOWN.items():
        if key in text:
            return why
    return ""


def _fetch(dest: Path) -> Path:
    import urllib.request

    dest.parent.mkdir(parents=True, exist_ok=True)
    with urllib.request.urlopen(PINNED_URL, timeout=60) as r:   # noqa: S310  (a fixed https URL)
        data = r.read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != PINNED_SHA256:
        raise SystemExit(f"downloaded file has SHA-256 {digest}, expected {PINNED_SHA256}")
    dest.write_bytes(data)
    return dest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--file", type=Path, default=None,
                    help=f"PyTorch's test_convolution.py (default: $RAWCONV_TORCH_CONV_TESTS or {CACHE})")
    ap.add_argument("--download", action="store_true", help=f"fetch the pinned file (commit {PINNED_COMMIT[:12]}) first")
    ap.add_argument("-k", action="append", default=[], help="run only tests whose id contains this (repeatable)")
    ap.add_argument("--functional", action="store_true",
                    help="also route the test file's F.conv*/F.conv_transpose* through rawconv.ops")
    ap.add_argument("--no-shadow", action="store_true", help="do not compare each call with torch's own forward")
    ap.add_argument("--torch", action="store_true", help="run the file with torch's own classes (the baseline)")
    ap.add_argument("--json", type=Path, default=None, help="write per-test rows here")
    ap.add_argument("--verbose", action="store_true", help="print every test as it ends")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a test failed or an InternalError was seen")
    args = ap.parse_args(argv)

    path = args.file or Path(os.environ.get("RAWCONV_TORCH_CONV_TESTS", CACHE))
    if args.download and not path.exists():
        path = _fetch(path)
    if not path.exists():
        print(f"no test file at {path}: pass --file PATH (PyTorch's test/nn/test_convolution.py) or --download",
              file=sys.stderr)
        return 2
    digest = hashlib.sha256(path.read_bytes()).hexdigest()

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # this checkout's rawconv
    os.environ.setdefault("PYTORCH_TESTING_DEVICE_ONLY_FOR", "cpu")
    os.environ.setdefault("PYTORCH_PRINT_REPRO_ON_FAILURE", "0")
    sys.argv = [sys.argv[0]]   # torch's common_utils parses sys.argv when imported
    import torch

    import rawconv
    import rawconv.nn as rnn

    shadow = not args.no_shadow
    if not args.torch:
        for name in MODULES:
            setattr(torch.nn, name, _shadow_module(getattr(rnn, name), getattr(torch.nn, name), shadow))
        _patch_assert_raises()
        _patch_internal_error()

    spec = importlib.util.spec_from_file_location("torch_test_convolution", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    try:
        spec.loader.exec_module(mod)
    except ModuleNotFoundError as exc:
        if exc.name == "expecttest":
            print("PyTorch's test helpers (torch.testing._internal) need expecttest: pip install expecttest",
                  file=sys.stderr)
            return 2
        raise
    if args.functional and not args.torch:
        mod.F = _FunctionalProxy(mod.F, shadow)

    tests = [t for t in _iter_tests(unittest.defaultTestLoader.loadTestsFromModule(mod))
             if not args.k or any(k in t.id() for k in args.k)]
    mode = "torch's own classes" if args.torch else \
        "rawconv modules" + (" + F.conv*" if args.functional else "") + (" (shadowed by torch)" if shadow else "")
    print(f"{path} (sha256 {digest[:12]}{', the pinned version' if digest == PINNED_SHA256 else ''}); torch "
          f"{torch.__version__}; rawconv from {Path(rawconv.__file__).parent}; {mode}; {len(tests)} tests", flush=True)
    result = _Result(args.verbose)
    t0 = time.perf_counter()
    unittest.TestSuite(tests).run(result)
    _current[0] = None
    wall = time.perf_counter() - t0

    counts = collections.Counter(r["status"] for r in result.rows.values())
    tag_counts: collections.Counter = collections.Counter()
    bad = []
    rows_out = {}
    for tid, row in sorted(result.rows.items()):
        tags = _tags(tid, row)
        tag_counts.update(set(tags))
        row = dict(row, tags=tags, rawconv_calls=_calls.get(tid, 0), events=_events.get(tid, [])[:10],
                   known=_known(tid, row) if row["status"] in ("fail", "error") else "")
        rows_out[tid] = row
        if row["status"] in ("fail", "error", "xpass") or (tags and row["status"] != "skip"):
            bad.append((tid, row))
    print()
    for tid, row in bad:
        short = tid.split(".", 1)[-1]
        print(f"{row['status'].upper():5s} {short}  [{', '.join(row['tags'])}]")
        if row["reason"] and row["status"] in ("fail", "error"):
            print(f"      {row['reason']}")
        for tag, detail in row["events"][:3]:
            print(f"      {tag}: {detail}")
        if row["known"]:
            print(f"      known: {row['known']}")
    reached = sum(1 for r in rows_out.values() if r["rawconv_calls"] and r["status"] != "skip")
    internal = tag_counts.get("internal", 0)
    print(f"\nsummary ({wall:.0f} s): " + ", ".join(f"{counts[s]} {s}" for s in
                                                  ("pass", "fail", "error", "skip", "xfail", "xpass") if counts[s]))
    print(f"rawconv reached by {reached} tests; tests with: " +
          (", ".join(f"{n} {t}" for t, n in sorted(tag_counts.items())) or "no rawconv events"))
    fallbacks = rnn.torch_fallbacks() if not args.torch and hasattr(rnn, "torch_fallbacks") else {}
    if fallbacks:   # module calls no rawconv library runs, run on torch's own kernel (rawconv.pytorch.fallback)
        print(f"module calls run on torch's own kernel: {sum(fallbacks.values())} ("
              + "; ".join(f"{n}: {why}" for why, n in fallbacks.items()) + ")")
    if args.json:
        args.json.write_text(json.dumps({"file": str(path), "sha256": digest, "torch": torch.__version__,
                                         "mode": mode, "counts": dict(counts), "tags": dict(tag_counts),
                                         "torch_fallbacks": fallbacks,
                                         "tests": rows_out}, indent=1))
    failed = counts["fail"] + counts["error"] + counts["xpass"]
    return 1 if args.strict and (failed or internal) else 0


if __name__ == "__main__":
    sys.exit(main())
