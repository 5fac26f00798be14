"""A graph plan's operation graph, its engines and engine configs (heuristics, the global count, built
execution plans) and selection: a mixin of :class:`rawconv.cudnn_graph.GraphConvolution` (execution,
the "nhwc:" configs and lifetime stay there; autotune is :mod:`rawconv.cudnn.graph.autotune`)."""
from __future__ import annotations

import itertools
from . import _backend_api as B
from .. import _cuda
from ...core import guard as _guard
from ...core.check import ACTIVATION_REFERENCE
from ...core.errors import ArgumentError
from ...core.errors import ArgumentTypeError
from ...core.errors import LibraryError
from ...core.errors import NotSupportedError
from ...core.results import ResultTable
from .search import knob_combinations
from typing import Any
from typing import Sequence
from . import common as _o   # the names the graph plan shares (not the face: it imports this part)

__all__ = ["Engines"]


class Engines:
    """Part of :class:`rawconv.cudnn.graph.GraphConvolution` (see the module's notes)."""

    # ------------------------------------------------------------------ graph and engines
    def _graph_desc(self) -> B.Descriptor:
        self._check_live()
        if self._graph is None:
            raise ArgumentError(f"{self._describe()} is empty (zero batch or spatial size): no cuDNN graph")
        try:
            return self._graph.build(self.handle())
        except NotSupportedError as exc:
            raise NotSupportedError(f"cuDNN does not support this graph ({self._describe()}): {exc}",
                                    library="cuDNN", function=exc.function, status=exc.status,
                                    status_name=exc.status_name, detail=exc.detail) from None

    def _describe(self) -> str:
        extra = []
        if self.activation:
            extra.append(f"activation {self.activation}")
        return f"{self.direction} {self.problem.describe()}" + (" " + " ".join(extra) if extra else "")

    @property
    def global_count(self) -> int:
        """``CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT`` of this graph."""
        self._graph_desc()
        return self._graph.global_count

    @_cuda.on_plan_device
    def heuristic(self, mode: str = "instant") -> list[_o.EngineConfig]:
        """Engine configs heuristic ``mode`` (``"instant"``, ``"b"``, ``"fallback"``) returns, best
        first (not finalized; see :meth:`engines`). Mode B declines some graphs (3-D, grouped,
        dilated): then []. Wraps ``CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR``."""
        if mode == "a":
            mode = "instant"
        if mode not in _o.HEURISTIC_MODES:
            raise ArgumentError(f"heuristic mode must be one of {list(_o.HEURISTIC_MODES)}, got {mode!r}")
        if mode not in self._heur:
            graph = self._graph_desc()
            out = []
            try:
                cfgs = B.heuristics(graph, mode)
            except (NotSupportedError, LibraryError):
                cfgs = []
            for cfg in cfgs:
                try:
                    d = B.describe_config(cfg)
                except LibraryError:
                    continue
                ec = _o.EngineConfig(d["engine"], tuple(d["knobs"].items()), (mode,), d["numerical_notes"],
                                  d["behavior_notes"])
                out.append(self._remember(ec))
            self._heur[mode] = out
        return list(self._heur[mode])

    def _remember(self, ec: _o.EngineConfig) -> _o.EngineConfig:
        old = self._configs.get(ec.name)
        if old is not None:
            ec = ec.with_(heuristics=tuple(dict.fromkeys(old.heuristics + ec.heuristics)),
                          numerical_notes=ec.numerical_notes or old.numerical_notes,
                          behavior_notes=ec.behavior_notes or old.behavior_notes,
                          workspace_bytes=ec.workspace_bytes if ec.workspace_bytes is not None else old.workspace_bytes,
                          finalizes=ec.finalizes if ec.finalizes is not None else old.finalizes,
                          error=ec.error or old.error)
        self._configs[ec.name] = ec
        return ec

    @_cuda.on_plan_device
    def engine_info(self, index: int):
        """``(notes, knob_info)`` of engine ``index`` for this graph, or None when the engine does
        not support it. ``notes``: {"numerical_notes": (...), "behavior_notes": (...)};
        ``knob_info``: ``[(knob type, min, max, stride), ...]``."""
        if index not in self._engine_info:
            graph = self._graph_desc()
            try:
                eng = B.engine(graph, index)
                self._engine_info[index] = (B.engine_notes(eng), B.knob_info(eng))
            except (NotSupportedError, LibraryError):
                self._engine_info[index] = None
        return self._engine_info[index]

    def annotate(self, ec: _o.EngineConfig) -> _o.EngineConfig:
        """Fill the notes of a config that came from a name."""
        if ec.numerical_notes or ec.behavior_notes:
            return ec
        known = self._configs.get(ec.name)
        if known is not None and (known.numerical_notes or known.behavior_notes):
            return known
        info = self.engine_info(ec.engine)
        if info is None:
            return ec
        return ec.with_(numerical_notes=info[0]["numerical_notes"], behavior_notes=info[0]["behavior_notes"])

    @_cuda.on_plan_device
    def build(self, config: Any, *, handle=None) -> _o._Built:
        """Finalize the execution plan of one engine config (cached per config name), on this
        thread's cuDNN handle unless ``handle`` is given. Raises :class:`NotSupportedError` when it
        does not finalize. Wraps ``cudnnBackendFinalize`` on ENGINE, ENGINECFG and EXECUTION_PLAN
        descriptors."""
        ec = self._resolve(config)
        b = self._built.get(ec.name)
        if b is not None:
            return b
        why = self._failed.get(ec.name)
        if why is not None:
            raise NotSupportedError(f"engine config {ec.name} does not finalize for {self._describe()}: {why}",
                                    library="cuDNN")
        graph = self._graph_desc()
        try:
            eng = B.engine(graph, ec.engine)
            if not (ec.numerical_notes or ec.behavior_notes):
                ec = ec.with_(**B.engine_notes(eng))
            cfg = B.engine_config(eng, ec.knobs)
            plan = B.execution_plan(handle if handle is not None else self.handle(), cfg)
            ws = B.plan_workspace(plan)
            back = B.plan_config(plan)
        except (NotSupportedError, LibraryError) as exc:
            msg = f"{exc.function or 'cuDNN'}: {exc.status_name or exc}"
            self._failed[ec.name] = msg
            self._remember(ec.with_(finalizes=False, error=msg))
            raise NotSupportedError(f"engine config {ec.name} does not finalize for {self._describe()}: {exc}",
                                    library="cuDNN", function=exc.function, status=exc.status,
                                    status_name=exc.status_name, detail=exc.detail) from None
        ec = ec.with_(workspace_bytes=ws, finalizes=True, error="")
        _o.log.debug("finalized %s (workspace %d B) for %s", ec.name, ws, self._describe())
        ec = self._remember(ec)
        b = _o._Built(ec, plan, ws, back, fused=len(self._graph.ops) > 1)
        if b.serialize:
            _cuda.make_barrier(self.device_index)   # now, outside any capture
        if not self._freed:  # a background compilation may end after free()
            self._built[ec.name] = b
        return b

    def _resolve(self, config: Any) -> _o.EngineConfig:
        if isinstance(config, _o.EngineConfig):
            return config
        if isinstance(config, str):
            ec = _o.EngineConfig.parse(config)
            return self._configs.get(ec.name, ec)
        if isinstance(config, int) and not isinstance(config, bool):
            if config < 0:
                raise ArgumentError(f"engine index must be >= 0, got {config}")
            return self._configs.get(f"eng{config}", _o.EngineConfig(config))
        raise ArgumentTypeError(f"engine must be an EngineConfig, a name such as 'eng28{{k2=3}}' or an engine "
                                f"index, got {type(config).__name__}")

    @_cuda.on_plan_device
    def engines(self, heuristic: str | Sequence[str] = "instant", *, limit: int | None = 16,
                finalize: bool = True) -> list[_o.EngineConfig]:
        """Engine configs cuDNN offers for this graph.

        ``heuristic``: a mode (``"instant"``, ``"b"``, ``"fallback"``), a sequence of them, or
        ``"all"``: the three modes' configs plus every engine index below
        ``CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT`` that supports the graph, with its
        default knobs and then its knob choices (``min, min+stride, ..., max`` per knob, all
        combinations in order) up to ``limit`` configs per engine (None: no limit; beware, some
        engines have thousands). With ``finalize`` each config's execution plan is finalized to
        fill ``finalizes`` and ``workspace_bytes`` (runtime-compiled engines compile here).
        Rows keep the order: heuristic modes (instant, b, fallback), then engine index.
        """
        if heuristic == "all":
            modes, every = list(_o.HEURISTIC_MODES), True
        else:
            modes = [heuristic] if isinstance(heuristic, str) else list(heuristic)
            every = False
            for m in modes:
                if m not in _o.HEURISTIC_MODES + ("a",):
                    raise ArgumentError(f"heuristic must be 'all' or among {list(_o.HEURISTIC_MODES)}, got {m!r}")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ArgumentError(f"limit must be None or a positive int, got {limit!r}")
        order: list[str] = []
        for m in modes:
            for ec in self.heuristic(m):
                if ec.name not in order:
                    order.append(ec.name)
        if every:
            for idx in range(self.global_count):
                info = self.engine_info(idx)
                if info is None:
                    continue
                notes, knobs = info
                for combo in itertools.islice(knob_combinations(knobs), limit):
                    ec = self._remember(_o.EngineConfig(idx, combo, (), notes["numerical_notes"],
                                                     notes["behavior_notes"]))
                    if ec.name not in order:
                        order.append(ec.name)
        rows = []
        for name in order:
            if finalize:
                try:
                    self.build(name)
                except NotSupportedError:
                    pass
            rows.append(self._configs[name])
        return ResultTable(rows, title=f"cuDNN graph engine configs ({heuristic}): {self._describe()}")

    # ------------------------------------------------------------------ selection
    def allowed(self, ec: _o.EngineConfig, *, deterministic_only=False, no_tensor_cores=None,
                 no_down_conversion=True, no_reduced_precision=False) -> str:
        """'' when ``ec`` passes the note filters, else why not."""
        if no_tensor_cores is None:
            no_tensor_cores = self.problem.dtype == "float32" and not self.allow_tf32
        notes = ec.numerical_notes
        if deterministic_only and "NONDETERMINISTIC" in notes:
            return "nondeterministic"
        if no_tensor_cores and "TENSOR_CORE" in notes:
            return "tensor cores" + (" (float32 would run as TF32: allow_tf32=False)"
                                     if self.problem.dtype == "float32" else "")
        if no_down_conversion and "DOWN_CONVERT_INPUTS" in notes:
            return "down-converts inputs"
        if no_reduced_precision and "REDUCED_PRECISION_REDUCTION" in notes:
            return "reduced-precision reduction"
        return ""

    def select(self, engine: Any = None, *, choice: Any = None) -> _o.EngineConfig:
        """Select the engine config :meth:`execute` runs: an :class:`EngineConfig`, a name
        (``"eng28{k2=3,k3=0}"``, ``"eng28"``) or an engine index (default knobs). Forcing runs
        exactly that config, notes notwithstanding; one listed in ``KNOWN_WRONG`` for this problem
        warns (``RuntimeWarning``). On an NCHW plan, ``"nhwc:<name>"`` selects a config of the
        channels_last graph of the same problem, run on channels_last copies of the inputs with the
        output copied back (see ``autotune(relayout=True)``). The selected config is run once inside
        a throwaway CUDA-graph capture; one that cannot be captured keeps running in every other
        call, and a call made inside a capture runs the first heuristic config that can
        (``rawconv.cudnn_graph.CAPTURE_PROBE``). Raises :class:`NotSupportedError`
        (naming the configs heuristic mode instant offers) when it does not finalize,
        :class:`ArgumentError` for ``"nhwc:"`` on a channels_last or empty plan."""
        if choice is not None:
            if engine is not None and engine != choice:
                raise ArgumentError(f"choice={choice!r} and engine={engine!r} disagree; pass one")
            engine = choice
        return self._select(engine, stacklevel=3)

    def _select(self, engine: Any, warn: bool = True, stacklevel: int = 2) -> _o.EngineConfig:
        self._check_live()
        if isinstance(engine, str) and "|capture=" in engine:
            # a fused residual graph's capture choice (rawconv.fused): a plan without a residual
            # takes none, and runs the config named before it
            engine = engine.split("|capture=", 1)[0]
        if isinstance(engine, str) and engine.strip().lower().startswith("unfused:"):
            # the convolution-only graph's config (itself possibly "nhwc:..."), then torch's ops
            unf = self.unfused()
            rest = engine.strip()[8:]
            ec = unf._select(rest, warn, stacklevel + 1) if rest else unf._current().config
            self._split, self._selected, self._via, self._bufs = True, None, None, None
            return ec
        if isinstance(engine, str) and engine.strip().lower().startswith("nhwc:"):
            cl = self.channels_last()
            ec = cl._select(engine.strip()[5:], warn, stacklevel + 1)
            self._via, self._split = cl, False
            return ec
        ec = self._resolve(engine)
        bad = _o.known_wrong(self.problem, self.direction, ec.engine) if warn else ""
        if bad:
            import warnings
            warnings.warn(f"engine {ec.engine} gave wrong results for a problem like this one ({bad}); "
                          f"rawconv's default selection skips it", RuntimeWarning, stacklevel=_guard.stacklevel())
        try:
            b = self.build(engine)
        except NotSupportedError as exc:
            offered = [ec.name for ec in self.heuristic("instant")]
            raise NotSupportedError(f"{exc}; heuristic mode instant offers: {', '.join(offered) or 'nothing'}"
                                    + self._layout_hint(), library="cuDNN", offered=offered) from None
        self._probe_capture(b)
        self._selected = b
        self._via = self._bufs = None
        self._split = False
        return b.config

    def _layout_hint(self) -> str:
        if self.problem.layout == "nchw" and self.problem.ndim >= 1:
            return (" (this graph is NCHW: most cuDNN engines take NHWC; pass channels_last tensors, "
                    "x.to(memory_format=torch.channels_last) and the weights likewise)")
        return ""

    def _select_default(self) -> _o._Built:
        tried = []
        for mode in ("instant", "fallback"):
            for ec in self.heuristic(mode):
                if self.allowed(ec):
                    continue
                bad = _o.known_wrong(self.problem, self.direction, ec.engine)
                if bad:
                    tried.append(f"{ec.name}: skipped, known wrong ({bad})")
                    continue
                try:
                    self._selected = self.build(ec)
                    return self._selected
                except NotSupportedError as exc:
                    tried.append(f"{ec.name}: {self._failed.get(ec.name, exc)}")
        # nothing the heuristics gave finalizes: every engine with default knobs
        for idx in range(self.global_count):
            info = self.engine_info(idx)
            if info is None:
                continue
            ec = _o.EngineConfig(idx, (), (), **info[0])
            if self.allowed(ec) or _o.known_wrong(self.problem, self.direction, idx):
                continue
            try:
                self._selected = self.build(ec)
                return self._selected
            except NotSupportedError:
                tried.append(ec.name)
        raise NotSupportedError(
            f"cuDNN {_o._version()} offers no engine config that finalizes for {self._describe()}"
            + (f" with allow_tf32={self.allow_tf32}" if self.problem.dtype == "float32" else "")
            + f"; tried {len(tried)}: {'; '.join(tried[:8])}" + self._layout_hint(), library="cuDNN")

    def _current(self) -> _o._Built:
        self._check_live()
        if self._split or (self._selected is None and self._via is None and self._default_split()):
            self._split = True   # an "unfused:" config (selected, or the default): the convolution-only plan's
            return self.unfused()._current()
        if self._via is not None:
            return self._via._current()
        return self._selected or self._select_default()

    @property
    def selected(self) -> _o.EngineConfig:
        """The engine config :meth:`execute` runs (cuDNN's first heuristic choice unless selected);
        of the channels_last graph when :attr:`selected_name` starts with ``"nhwc:"`` (an
        :class:`EngineConfig` carries no layout: re-select such a config by :attr:`selected_name`)."""
        return self._current().config

    @property
    def selected_name(self) -> str:
        """The selected config's name as :meth:`select` takes it (``"nhwc:"`` first when it runs on
        channels_last copies)."""
        name = self._current().config.name
        if self._split:
            return f"unfused:{self._unf.selected_name}"
        return f"nhwc:{name}" if self._via is not None else name

    def engine_id(self) -> int:
        """The engine global index of the selected plan, read back from cuDNN
        (``CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG`` -> ``CUDNN_ATTR_ENGINE_GLOBAL_INDEX``)."""
        return int(self._current().read_back["engine"])

    def plan_readback(self) -> dict:
        """The selected plan's engine config as cuDNN reports it: engine, knobs, notes."""
        return dict(self._current().read_back)

    @property
    def workspace_bytes(self) -> int:
        """Workspace of the selected plan, in bytes (an ``"nhwc:"`` config needs
        :attr:`transpose_bytes` more)."""
        return self._current().workspace_bytes


# only rawconv's exceptions leave them (rawconv.core.guard), named as the public methods they are
_guard.public_methods("global_count", "heuristic", "engine_info", "build", "engines", "select", "selected", "selected_name", owner="rawconv.cudnn.graph.GraphConvolution")(Engines)


def empty_result(plan, result, bias):
    """Zero-sized problems: torch's result without any library call."""
    p = plan.problem
    result.zero_()
    if plan.direction == "forward":
        if bias is not None and result.numel():
            result += bias.view(1, -1, *([1] * p.ndim))
        if plan.activation and result.numel():
            result.copy_(ACTIVATION_REFERENCE[plan.activation](result))
    if p.unbatched and plan.direction in ("forward", "backward_data"):
        return result.squeeze(0)
    return result
