"""What the graph API's plan (:class:`rawconv.cudnn.graph.GraphConvolution`), its parts
(:mod:`rawconv.cudnn.graph.engines`, :mod:`rawconv.cudnn.graph.autotune`) and the function forms share:
the vocabulary (heuristic modes, activations, tensor roles and ids), the engine configs that are known
wrong, :class:`EngineConfig`, one finalized plan (:class:`_Built`), torch's epilogue, the tuning key's
environment. The face (:mod:`rawconv.cudnn.graph`) hands these names on; the parts import them from here,
not from the face.

``SERIALIZE_RTC`` is read here (by :class:`_Built`): set it on the face
(``rawconv.cudnn_graph.SERIALIZE_RTC = False``), whose module type passes it on to this module.
"""
from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass, field

import torch

from .. import _cuda, _ffi as _cudnn
from . import _backend_api as B
from ...core import known_bad as _known_bad
from ...core import check as _check
from ...core.errors import ArgumentError, ArgumentTypeError
from ...core.backend import Candidate
from ...core.problem import ConvProblem


log = logging.getLogger("rawconv.cudnn_graph")
HEURISTIC_MODES = ("instant", "b", "fallback")


#: pointwise activation nodes a forward graph ends with (``"gelu"``: GELU_FWD, erf; ``"gelu_tanh"``:
#: GELU_APPROX_TANH_FWD; ``"silu"`` = ``"swish"``: SWISH_FWD with beta 1; ``"relu6"``: RELU_FWD with
#: upper clip 6; the ReLU family propagates NaN, as torch does)
ACTIVATIONS = ("relu", "tanh", "sigmoid", "elu", "gelu", "swish", "silu", "gelu_tanh", "relu6")
DIRECTIONS = ("forward", "backward_data", "backward_weights")   # "backward_filter" (cuDNN's word) is accepted
DTYPES = ("float32", "float16", "bfloat16", "float64")
ALIGNMENT = 16  # bytes every data pointer bound to a graph tensor must be aligned to


# unique ids of the graph's tensors
UID = {"x": 1, "w": 2, "y": 3, "b": 4, "r": 5, "dx": 1, "dw": 2, "dy": 3}
_VIRTUAL_UIDS = (101, 102, 103)
_ROLES = {"forward": ("x", "w", "y"), "backward_data": ("dx", "w", "dy"), "backward_weights": ("x", "dw", "dy")}
_OUT_ROLE = {"forward": "y", "backward_data": "dx", "backward_weights": "dw"}
_ROLE_WORDS = {"b": "bias", "dy": "grad_y", "r": "residual"}   # role -> the argument's name in messages
_VENDOR_DIRECTION = {"backward_weights": "backward_filter"}   # the raw layer speaks cuDNN's words
_GRAPH_NAMES = {"x": "X", "w": "W", "y": "Y", "dx": "DX", "dw": "DW", "dy": "DY"}


# Engine configs that gave wrong results in rawconv's GPU tests: rows of rawconv.known_bad's table
# (backend "cudnn_graph"). Not known to be fixed in later cuDNN versions, so they apply to all: the
# default selection (no autotune, no forced engine) skips them, forcing one warns, and autotune
# checks every candidate anyway.
KNOWN_WRONG = tuple(_known_bad.entries(backend="cudnn_graph"))


def known_wrong(problem: ConvProblem, direction: str, engine: int) -> str:
    """Why engine ``engine`` is known to give wrong results for ``problem``/``direction`` ('' when
    it is not): what was seen, from :mod:`rawconv.known_bad` (``KNOWN_WRONG`` holds its rows)."""
    e = _known_bad.check("cudnn_graph", problem, direction, f"eng{int(engine)}")
    return e.seen if e is not None else ""
_NAME_RE = re.compile(r"^eng(\d+)(?:\{\s*((?:k\d+\s*=\s*-?\d+\s*(?:,\s*k\d+\s*=\s*-?\d+\s*)*)?)\}|((?:_k\d+=-?\d+)*))$")


@dataclass(frozen=True, repr=False)
class EngineConfig(Candidate):
    """One engine config of a graph: engine global index plus knob choices.

    ``engine``: global engine index; ``knobs``: sorted ``(knob type, value)`` pairs (empty: the
    engine's defaults); ``heuristics``: the heuristic modes that returned it (``"instant"``,
    ``"b"``, ``"fallback"``; empty when enumerated); ``numerical_notes`` / ``behavior_notes``: the
    engine's notes (names without ``CUDNN_NUMERICAL_NOTE_`` / ``CUDNN_BEHAVIOR_NOTE_``);
    ``workspace_bytes``: the execution plan's workspace (bytes, None until finalized);
    ``finalizes``: whether its execution plan finalizes for this graph and GPU (None: not tried);
    ``error``: why not. Equality and hashing use ``engine`` and ``knobs`` only.
    """

    engine: int
    knobs: tuple = ()
    heuristics: tuple = field(default=(), compare=False)
    numerical_notes: tuple = field(default=(), compare=False)
    behavior_notes: tuple = field(default=(), compare=False)
    workspace_bytes: int | None = field(default=None, compare=False)
    finalizes: bool | None = field(default=None, compare=False)
    error: str = field(default="", compare=False)
    direction: str = field(default="forward", compare=False)

    backend = "cudnn_graph"

    @property
    def choice(self) -> str:
        """The stable name ``select()`` and ``choice=`` take (:attr:`name`)."""
        return self.name

    @property
    def notes(self) -> tuple:
        return tuple(self.numerical_notes) + tuple(self.behavior_notes)

    def __post_init__(self):
        if isinstance(self.engine, bool) or not isinstance(self.engine, int) or self.engine < 0:
            raise ArgumentError(f"engine must be a non-negative int, got {self.engine!r}")
        knobs = self.knobs.items() if isinstance(self.knobs, dict) else self.knobs
        try:
            pairs = tuple(sorted((int(t), int(v)) for t, v in knobs))
        except (TypeError, ValueError):
            raise ArgumentError(f"knobs must be (knob type, value) int pairs, got {self.knobs!r}") from None
        if len({t for t, _ in pairs}) != len(pairs):
            raise ArgumentError(f"a knob type appears twice in {pairs}")
        if any(t < 0 for t, _ in pairs):
            raise ArgumentError(f"knob types are non-negative, got {pairs}")
        object.__setattr__(self, "knobs", pairs)

    @property
    def name(self) -> str:
        """``eng28{k2=3,k3=0}`` (``eng28`` for default knobs)."""
        if not self.knobs:
            return f"eng{self.engine}"
        return f"eng{self.engine}{{" + ",".join(f"k{t}={v}" for t, v in self.knobs) + "}"

    @classmethod
    def parse(cls, name: str) -> "EngineConfig":
        """``"eng28{k2=3,k3=0}"``, ``"eng28"`` or cudnn-frontend's ``"eng28_k2=3_k3=0"``.
        Raises :class:`ArgumentError` for anything else (before any C call)."""
        if not isinstance(name, str):
            raise ArgumentTypeError(f"engine name must be a str, got {type(name).__name__}")
        m = _NAME_RE.match(name.strip())
        if not m:
            raise ArgumentError(f"cannot parse engine config name {name!r}; expected e.g. 'eng28', "
                                "'eng28{k2=3,k3=0}' or 'eng28_k2=3_k3=0'")
        body = m.group(2) if m.group(2) is not None else (m.group(3) or "")
        pairs = [(int(t), int(v)) for t, v in re.findall(r"k(\d+)\s*=\s*(-?\d+)", body)]
        return cls(int(m.group(1)), tuple(pairs))

    @property
    def knob_names(self) -> str:
        """Knobs with cuDNN's names: ``TILE_SIZE=3, STAGES=0``."""
        return ", ".join(f"{B.knob_type_name(t)}={v}" for t, v in self.knobs)

    @property
    def tensor_cores(self) -> bool:
        return "TENSOR_CORE" in self.numerical_notes

    @property
    def deterministic(self) -> bool:
        return "NONDETERMINISTIC" not in self.numerical_notes

    @property
    def down_converts(self) -> bool:
        return "DOWN_CONVERT_INPUTS" in self.numerical_notes

    def with_(self, **kw) -> "EngineConfig":
        from dataclasses import replace

        return replace(self, **kw)

    def __str__(self) -> str:
        ws = "?" if self.workspace_bytes is None else f"{self.workspace_bytes}"
        fin = {None: "not tried", True: "finalizes", False: "does not finalize"}[self.finalizes]
        return (f"{self.name:<28} heur={','.join(self.heuristics) or '-':<18} "
                f"num={','.join(self.numerical_notes) or '-'}  beh={','.join(self.behavior_notes) or '-'}  "
                f"workspace={ws} B  {fin}")


def reference(p: ConvProblem, direction: str, tensors: dict, *, activation: str | None = None):
    """:func:`rawconv.check.reference` (kept here for old callers)."""
    return _check.reference(p, direction, tensors, activation=activation)
_stream_lock = threading.Lock()   # making them (the lookups of a made one take no lock)
_VPS_KEPT = 64                    # variant packs kept per finalized plan (by data pointers)


# launch a barrier kernel before every execute of a runtime-compiled engine config (see
# rawconv._cuda.stream_barrier: without it cuDNN 9.19's eng4 reads its input early, measured)
SERIALIZE_RTC = True


# what an "unfused:" config runs after the convolution, in place, in torch's own ops (their NaN and
# Inf behaviour is torch's: relu(nan) = nan)
_EPILOGUE_ACT = {"relu": torch.relu_, "tanh": torch.tanh_, "sigmoid": torch.sigmoid_,
                 "elu": lambda t: torch.nn.functional.elu_(t),
                 "gelu": lambda t: t.copy_(torch.nn.functional.gelu(t)),
                 "gelu_tanh": lambda t: t.copy_(torch.nn.functional.gelu(t, approximate="tanh")),
                 "swish": lambda t: torch.nn.functional.silu(t, inplace=True),
                 "silu": lambda t: torch.nn.functional.silu(t, inplace=True),
                 "relu6": lambda t: torch.nn.functional.relu6(t, inplace=True)}


def torch_epilogue(y: torch.Tensor, bias, residual, activation: str | None, nd: int) -> torch.Tensor:
    """``y`` (a convolution's output, batched or not) with ``bias``, ``residual`` and
    ``activation`` applied in place by torch's own ops, in that order (torch's order for
    ``act(conv(x, w, b) + r)``); returns ``y``."""
    if bias is not None:
        y.add_(bias.view(-1, *([1] * nd)))
    if residual is not None:
        y.add_(residual if residual.shape == y.shape else residual.view(y.shape))   # (an unbatched y)
    if activation:
        _EPILOGUE_ACT[activation](y)
    return y


class _Built(_cuda.KeptWorkspace):
    """A finalized execution plan and what executing it needs: a workspace and the variant packs
    (by data pointers, the workspace's included) that name it.

    Workspaces follow torch's own cuDNN calls, so that a plan is safe under CUDA graphs
    (``torch.cuda.graph``, ``torch.compile(mode="reduce-overhead")``): on the device's default
    stream (never captured) the plan keeps one (``ws``: :class:`rawconv.cudnn._cuda.KeptWorkspace`,
    counted in the plans' byte budget, released past it or by ``rawconv.clear_caches``); on any other
    stream each call takes its workspace from torch's caching allocator and gives it back after
    the launch (stream-ordered, as ``at::native`` does). A capture then records only memory its
    graph's pool owns, nothing a plan keeps is allocated inside a capture or a graph tree's
    warm-up, and two streams never share a workspace. A plan needing no workspace allocates
    none."""

    __slots__ = ("config", "plan", "workspace_bytes", "vps", "read_back", "finalized_at",
                 "serialize", "capture_why", "capture_alt")

    def __init__(self, config: EngineConfig, plan: B.Descriptor, workspace_bytes: int, read_back: dict,
                 fused: bool = True):
        self.config = config
        self.plan = plan
        self.workspace_bytes = workspace_bytes
        self.ws, self.used, self.lock = None, True, threading.Lock()   # (_cuda.KeptWorkspace)
        self.vps: dict = {}
        self.finalized_at = time.perf_counter()  # when cudnnBackendFinalize returned (perf_counter s)
        self.read_back = read_back
        # a runtime-compiled engine of a fused graph (pointwise nodes after the convolution: where
        # cuDNN 9.19's eng4 was seen to start before the kernel ahead of it ends) gets a barrier
        # kernel first (rawconv._cuda.stream_barrier). Convolution-only graphs do not: their
        # runtime-compiled engines (eng5, the depthwise engine torch runs; eng71) gave exact
        # results queued right behind a kernel writing their input, and the barrier cost them
        # 2-2.6 us of GPU time per call (H100, benchmarks/diag_depthwise_cuda.py section rtc)
        self.serialize = SERIALIZE_RTC and fused and "RUNTIME_COMPILATION" in tuple(config.behavior_notes or ())
        # CUDA-graph capture: None until probed (GraphConvolution._probe_capture), then "" when this
        # config can be captured, else why not; capture_alt: the _Built a call made inside a capture
        # runs instead (None: this one)
        self.capture_why = None
        self.capture_alt = None


def _version() -> str:
    try:
        return _cudnn.version()["version"]
    except Exception:  # pragma: no cover
        return "?"


def environment(device_index: int) -> dict:
    """The library and device a tuning key of this backend records: ``{"library": "cuDNN",
    "library_version": "9.19.0", "device": "NVIDIA H200", "device_arch": "sm_90"}`` (needs the GPU)."""
    major, minor = torch.cuda.get_device_capability(device_index)
    return {"library": "cuDNN", "library_version": _version(), "device": torch.cuda.get_device_name(device_index),
            "device_arch": f"sm_{major}{minor}"}


def _configs_of(records) -> list[EngineConfig]:
    """The engine configs tuning records hold (``detail``'s ``engine`` and ``knobs``), in order;
    records whose detail is not an engine config are skipped."""
    out = []
    for r in records:
        try:
            out.append(EngineConfig(r.detail["engine"], tuple(tuple(k) for k in r.detail.get("knobs", ()))))
        except (KeyError, TypeError, ValueError):  # ArgumentError is a ValueError
            continue
    return out
