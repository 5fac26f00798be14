"""Implementations the libraries are known to get wrong: crash, hang or a wrong result.

Each :class:`KnownBad` row names the library, the versions, rawconv's backend and direction, the
implementation (``fnmatch`` patterns on the name rawconv lists), the condition on the problem (and
on the formats the implementation takes), what goes wrong, and the public issue. :func:`check`
answers for one candidate before any call runs it; rawconv's backends ask it:

* forcing a known-bad oneDNN implementation (``impl=`` of :func:`rawconv.onednn.forward`,
  ``backward_data``, ``backward_weights``, :meth:`rawconv.onednn.Convolution.select`) raises
  :class:`~rawconv.errors.KnownBadError` naming the issue, unless ``allow_known_bad=True``;
* oneDNN's first choice (``impl=None``) that is known bad is passed over for the next one in
  oneDNN's order, with a ``RuntimeWarning`` saying so (never silently, never the bad one);
* listings mark them (:attr:`rawconv.onednn.Implementation.known_bad`), autotune skips them
  unless allowed;
* cuDNN graph-API engines (``rawconv.cudnn_graph.known_wrong``): the default selection skips
  them, forcing one warns (``RuntimeWarning``), autotune checks every candidate against float64.

To run a known-bad candidate anyway without risking the process, run it in a child process:
``rawconv.onednn.implementations(..., isolate=True, allow_known_bad=True)`` (see
:mod:`rawconv._isolate`): a crash or hang there becomes a row status.

oneDNN issue #6035: the exact condition, as reproduced here
------------------------------------------------------------
https://github.com/uxlfoundation/oneDNN/issues/6035 ("1x1 convolution backward_weights writes
past the rtus workspace (nhwc, IC < ic_block)"), open upstream. Reproduced on oneDNN 3.2.0 (the
``onednn-cpu-gomp`` 2023.2.0 wheel) on an AMD EPYC with AVX-512 (``avx512_core_bf16``), 2 cores.
``tools/probe_known_bad.py`` runs backward weights with one implementation on a scratchpad followed
by a 1 MiB guard band, so that the bytes written past the scratchpad are counted whether or not
the process dies; every case runs in its own process under ``timeout``.

The bug is there exactly when all of these hold:

* direction backward weights, implementation ``jit_1x1:avx2`` (ic_block 8), ``jit_1x1:avx512_core``
  (ic_block 16) or ``jit_bf16_1x1:avx512_core_bf16`` (ic_block 16; found here, not in the report);
* the source taken in plain channels-last format (``acdb``/``acb``: rawconv's ``layouts=user``
  rows of a channels_last problem; the ``layouts=any`` rows reorder the source to a blocked
  format and are fine, as is an NCHW source);
* a stride above 1 in any spatial dim (the "reduce to unit stride" copy; stride 1 is fine);
* input channels per group below ic_block: IC 1-7 on ``jit_1x1:avx2``, IC 1-15 on the AVX-512
  ones. IC = 8 and 12 (avx2), 16 and 24 (avx512) are fine. (IC 1 reaches them only from a
  ``ConvProblem`` with ``layout="nhwc"``: a torch tensor with one channel reads as NCHW.)

Output channels, batch, 1-D or 2-D do not matter (3-D and grouped 1x1 backward weights are not
offered by these implementations). What goes wrong depends on the thread count: the reduced
copy of the source is written with ic_block channels into a per-thread space sized for IC.
With 1 thread the writes run past the end of the scratchpad (3776 B past a 4224 B scratchpad for
``mb32ic4ih32oc8oh16kh1sh2``; from 5696 B at IC 2 down to 896 B at IC 7), dW stays right, and the heap
is corrupted: glibc aborts (``corrupted double-linked list``, SIGABRT) or the process segfaults
later. With 2 or more threads each thread overwrites the next one's space: wrong dW (max
relative error 0.09-1.3 vs float64) or a hang (timeout). On small outputs the overflow stays in
the allocation's slack (avx2: none at 2x2 outputs, 128 B at 4x4; avx512_core: none up to 20x20
outputs, 13.7 KB at 24x24): the code is wrong there too, so the table flags every size.

``jit_1x1:avx2`` is listed on AVX-512 CPUs too (after ``jit_1x1:avx512_core``) and fails there
the same way. Backward data through ``jit_1x1:*`` with the same shapes was clean.

Commands (each prints its verdict; rc 134 = SIGABRT, 124 = killed by ``timeout``)::

    # the report's case, 1 thread: "corrupted double-linked list", rc=134
    timeout 60 env ONEDNN_MAX_CPU_ISA=AVX2 OMP_NUM_THREADS=1 python -c "
    import torch; from rawconv import onednn
    x = torch.randn(32, 4, 32, 32).to(memory_format=torch.channels_last)
    gy = torch.randn(32, 8, 16, 16).to(memory_format=torch.channels_last)
    onednn.backward_weights(x, gy, (8, 4, 1, 1), stride=2, impl='jit_1x1:avx2@user', allow_known_bad=True)"
    # the same with 2 threads: rc=124 (hang)
    # the boundary, with bytes written past the scratchpad and the error vs float64:
    python tools/probe_known_bad.py --isa AVX2 --threads 1,2 --ic 1,2,3,4,5,6,7,8,12,16 --stride 1,2,3
    python tools/probe_known_bad.py --impl jit_1x1:avx512_core@user --oc 16 --ih 32,48,128 --ic 4,8,15,16,24
"""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from typing import Callable, Mapping

from .errors import ArgumentError, KnownBadError
from .problem import ConvProblem

__all__ = ["KnownBad", "Context", "TABLE", "entries", "check", "error", "short", "EFFECTS"]

EFFECTS = ("crash", "hang", "wrong result")
_DIRECTIONS = {"forward": "forward", "backward_data": "backward_data", "backward_weights": "backward_weights",
               "backward_filter": "backward_weights"}
_BACKENDS = ("onednn", "cudnn", "cudnn_graph")


@dataclass(frozen=True)
class Context:
    """What rawconv knows of a candidate beside its name: ``formats`` (role -> oneDNN format
    string, as :class:`rawconv.onednn.Implementation` lists them: ``"x"`` is the source),
    ``layouts`` (``"any"``/``"user"`` for oneDNN), ``threads`` (the thread count it runs with).
    Any of them may be None (unknown): conditions then answer for the worst case."""

    name: str
    formats: Mapping[str, str] | None = None
    layouts: str | None = None
    threads: int | None = None


@dataclass(frozen=True)
class KnownBad:
    """One known-bad implementation.

    ``library`` ("oneDNN"/"cuDNN"), ``backend`` (rawconv's module: "onednn", "cudnn_graph"),
    ``direction`` ("forward", "backward_data", "backward_weights"), ``implementations``
    (``fnmatch`` patterns on the candidate's name), ``condition`` (in words) and ``when`` (the
    same as a function of the :class:`~rawconv.ConvProblem` and a :class:`Context`),
    ``effects`` (a subset of :data:`EFFECTS`), ``link`` (the public issue; "" when there is
    none), ``source`` (where rawconv saw it), ``seen`` (what was seen, on which version and
    machine), ``first``/``fixed`` (first affected version and first fixed one, None when not
    known: the row then holds for every version).
    """

    library: str
    backend: str
    direction: str
    implementations: tuple[str, ...]
    condition: str
    when: Callable[[ConvProblem, Context], bool] = field(repr=False, compare=False)
    effects: tuple[str, ...]
    link: str = ""
    source: str = ""
    seen: str = ""
    first: str | None = None
    fixed: str | None = None

    @property
    def reference(self) -> str:
        """The public issue, or where rawconv found it when there is no public issue."""
        return self.link or self.source

    def versions(self) -> str:
        """The affected versions in words, e.g. ``"all known"`` or ``">= 3.0, < 3.5"``."""
        parts = ([f">= {self.first}"] if self.first else []) + ([f"< {self.fixed}"] if self.fixed else [])
        return ", ".join(parts) or "all known (not fixed in a release rawconv knows of)"

    def applies_to_version(self, version: str | None) -> bool:
        """Whether library ``version`` ("3.2.0"; None = unknown, answered True) is affected."""
        if version is None:
            return True
        v = _version_tuple(version)
        if v is None:
            return True
        if self.first and v < _version_tuple(self.first):
            return False
        if self.fixed and v >= _version_tuple(self.fixed):
            return False
        return True

    def matches_name(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, pat) for pat in self.implementations)

    def describe(self) -> str:
        """One line: library, direction, implementations, condition, effects, reference."""
        return (f"{self.library} {self.direction} {', '.join(self.implementations)}: {self.condition} -> "
                f"{' / '.join(self.effects)} ({self.reference})")

    def as_dict(self) -> dict:
        return {"library": self.library, "backend": self.backend, "direction": self.direction,
                "implementations": list(self.implementations), "condition": self.condition,
                "effects": list(self.effects), "link": self.link, "source": self.source, "seen": self.seen,
                "versions": self.versions()}


def _version_tuple(v: str):
    m = re.match(r"^\s*(\d+)(?:\.(\d+))?(?:\.(\d+))?", str(v))
    if not m:
        return None
    return tuple(int(g or 0) for g in m.groups())


# ---------------------------------------------------------------------------- conditions
def _plain_channels_last_src(p: ConvProblem, c: Context) -> bool:
    """The implementation takes the source in plain channels-last format (acb / acdb / acdeb)."""
    fmt = (c.formats or {}).get("x")
    if fmt:
        return fmt == "a" + "cdef"[:p.ndim] + "b"
    if c.layouts == "any":
        return False   # rawconv lists every "any" row with its formats; without them, oneDNN blocks
    return p.layout == "nhwc"


def _onednn_6035(ic_block: int) -> Callable[[ConvProblem, Context], bool]:
    def when(p: ConvProblem, c: Context) -> bool:
        return (any(s > 1 for s in p.stride) and p.c // p.groups < ic_block
                and _plain_channels_last_src(p, c))
    return when


_ISSUE_6035 = "https://github.com/uxlfoundation/oneDNN/issues/6035"
_SEEN_6035 = ("oneDNN 3.2.0 (onednn-cpu-gomp 2023.2.0), AMD EPYC with AVX-512: scratchpad overrun "
              "with 1 thread (heap corruption: SIGABRT/SIGSEGV), wrong dW or a hang with 2+ threads")


def _onednn_rows():
    rows = []
    for name, block, extra in (("jit_1x1:avx2", 8, ""), ("jit_1x1:avx512_core", 16, ""),
                               ("jit_bf16_1x1:avx512_core_bf16", 16, "; the bf16 implementation was found "
                                                                      "by rawconv, not in the issue's report")):
        rows.append(KnownBad(
            library="oneDNN", backend="onednn", direction="backward_weights", implementations=(name,),
            condition=(f"source in plain channels-last format (layouts=user on channels_last tensors), "
                       f"stride > 1 in any dim, input channels per group < {block} (ic_block)"),
            when=_onednn_6035(block), effects=("crash", "hang", "wrong result"), link=_ISSUE_6035,
            source="rawconv/known_bad.py docstring; tools/probe_known_bad.py", seen=_SEEN_6035 + extra))
    return rows


_CUDNN_SOURCE = "rawconv GPU tests (tests/test_cudnn_graph_gpu.py: every config checked against float64)"


def _cudnn_rows():
    # Engine configs that gave wrong results in rawconv's GPU tests. Not known to be fixed in later
    # cuDNN versions, so they apply to all. No public issue.
    def eng(*idx):
        return tuple(p for i in idx for p in (f"eng{i}", f"eng{i}{{*"))

    return [
        KnownBad(library="cuDNN", backend="cudnn_graph", direction="backward_weights", implementations=eng(1, 20),
                 condition="stride > 1 in any dim and padding before != padding after",
                 when=lambda p, c: any(s > 1 for s in p.stride) and tuple(p.pad_before) != tuple(p.pad_after),
                 effects=("wrong result",), source=_CUDNN_SOURCE,
                 seen="cuDNN 9.19 on an H200, float32 NHWC, stride 2, padding before (1,0) / after (2,1): "
                      "dw max relative error 1.5"),
        KnownBad(library="cuDNN", backend="cudnn_graph", direction="backward_data", implementations=eng(2),
                 condition="float16 data", when=lambda p, c: p.dtype == "float16",
                 effects=("wrong result",), source=_CUDNN_SOURCE,
                 seen="cuDNN 9.19 on an H200, float16 NHWC: dx 7-9x over the fp32-accumulation error bound"),
        KnownBad(library="cuDNN", backend="cudnn_graph", direction="forward", implementations=eng(71),
                 condition="NCHW layout, data other than float64",
                 when=lambda p, c: p.layout == "nchw" and p.dtype != "float64",
                 effects=("wrong result",),
                 source="rawconv GPU benchmarks (benchmarks/results/*/nchw*.json, mismatch_configs)",
                 seen="cuDNN 9.19 on an H200, NCHW float16/bfloat16/TF32 ResNet-50 layers (batch 32; float32 "
                      "runs this tensor-core engine as TF32): autotune found knob choices of this "
                      "runtime-compiled engine outside tolerance on 30 layer runs, mostly k24=27 and k24=30 "
                      "(benchmarks/results/*/nchw*.json, mismatch_configs)"),
    ]


#: Every known-bad row, oneDNN first.
TABLE: tuple[KnownBad, ...] = tuple(_onednn_rows() + _cudnn_rows())


def entries(backend: str | None = None, library: str | None = None) -> list[KnownBad]:
    """The rows of :data:`TABLE` for ``backend`` ("onednn", "cudnn_graph") and/or ``library``
    ("oneDNN", "cuDNN"); all of them when both are None."""
    return [e for e in TABLE if (backend is None or e.backend == backend)
            and (library is None or e.library == library)]


def check(backend: str, problem: ConvProblem, direction: str, name: str, version: str | None = None, *,
          formats: Mapping[str, str] | None = None, layouts: str | None = None,
          threads: int | None = None) -> KnownBad | None:
    """The :class:`KnownBad` row that applies to running candidate ``name`` of ``backend``
    ("onednn", "cudnn_graph") on ``problem`` in ``direction`` ("forward", "backward_data",
    "backward_weights"; "backward_filter" is taken as "backward_weights") with library
    ``version`` (None: any), or None. ``formats``/``layouts``/``threads`` describe the candidate
    further (see :class:`Context`); left None, a condition answers for the worst case. Pure
    Python: calls no library. Raises :class:`~rawconv.errors.ArgumentError` for an unknown
    backend or direction."""
    if backend not in _BACKENDS:
        raise ArgumentError(f"backend must be one of {list(_BACKENDS)}, got {backend!r}")
    d = _DIRECTIONS.get(direction) if isinstance(direction, str) else None
    if d is None:
        raise ArgumentError(f"direction must be one of {list(_DIRECTIONS)}, got {direction!r}")
    ctx = None
    for e in TABLE:
        if e.backend != backend or e.direction != d or not e.matches_name(name):
            continue
        if not e.applies_to_version(version):
            continue
        if ctx is None:
            ctx = Context(name, formats, layouts, threads)
        if e.when(problem, ctx):
            return e
    return None


def error(entry: KnownBad, problem: ConvProblem, direction: str, name: str, version: str | None = None, *,
          what: str = "") -> KnownBadError:
    """The :class:`~rawconv.errors.KnownBadError` for forcing ``name`` where ``entry`` applies
    (``what``: how the candidate was named, e.g. ``"impl='jit_1x1:avx2'"``)."""
    lib = f"{entry.library} {version}" if version else entry.library
    msg = (f"{name} is known to {' / '.join(_VERB[e] for e in entry.effects)} for {problem.describe()} "
           f"({direction}) on {lib}: {entry.condition}. See {entry.reference}. "
           f"Pass allow_known_bad=True to run it anyway (isolate=True runs it in a child process, "
           f"where a crash or hang becomes a row status)")
    if what:
        msg = f"{what}: " + msg
    return KnownBadError(msg, entry=entry, implementation=name, library=entry.library)


_VERB = {"crash": "crash", "hang": "hang", "wrong result": "give wrong results"}


def short(reference: str) -> str:
    """A short form of a row's reference for tables: ``"oneDNN#6035"`` for a GitHub issue link,
    else the text itself."""
    m = re.match(r"^https?://github\.com/[^/]+/([^/]+)/(?:issues|pull)/(\d+)", reference or "")
    return f"{m.group(1)}#{m.group(2)}" if m else (reference or "")
