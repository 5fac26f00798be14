"""The legacy API plan's descriptors (no GPU needed), algo queries (``cudnnFind*`` / ``cudnnGet*_v7``)
and selection: a mixin of :class:`rawconv.cudnn.Convolution` (execution, the hot path and lifetime stay
there; the timed search is :mod:`rawconv.cudnn.legacy.autotune`)."""
from __future__ import annotations

import torch
from .. import _cuda
from .. import _ffi as _cudnn
from ...core.errors import ArgumentError
from ...core.errors import NotSupportedError
from ...core.problem import dense_strides
from ...core.problem import empty_like_layout
from ...core.results import ResultTable
from .._ffi import ffi
from typing import Any
from . import common as _o   # the names the legacy plan shares (not the face: it imports this part)
from ...core import guard as _guard, plans as _plans

__all__ = ["Algorithms"]


class Algorithms:
    """Part of :class:`rawconv.cudnn.Convolution` (see the module's notes)."""

    # ------------------------------------------------------------------ descriptors (no GPU needed)
    def _conv_desc(self, math: str):
        d = self._cdesc_by_math.get(math)
        if d is None:
            ip = self.inner
            pad, st, dil = list(ip.pad_before), list(ip.stride), list(ip.dilation)
            if ip.ndim == 1:
                pad, st, dil = [0] + pad, [1] + st, [1] + dil
            compute = "float64" if ip.dtype == "float64" else "float32"
            d = _cudnn.conv_desc(pad, st, dil, compute, groups=ip.groups,
                                 math=_cudnn.enum_value(_o.MATH_TYPES[math]))
            self._cdesc_by_math[math] = d
        return d

    def descriptors(self, n: int | None = None) -> tuple:
        """``(x, w, y, conv)`` descriptors for a batch of ``n`` (default: the chunk size). Wraps
        ``cudnnSetTensorNdDescriptor``, ``cudnnSetFilterNdDescriptor``, ``cudnnSetConvolutionNdDescriptor``."""
        n = self.batch_chunk if n is None else n
        d = self._descs.get(n)
        if d is None:
            ip = self.inner
            xs, ys = (n,) + ip.x_shape[1:], (n,) + ip.y_shape[1:]
            xd = _cudnn.tensor_desc(ip.dtype, _o._as4d(xs), dense_strides(_o._as4d(xs), ip.layout))
            yd = _cudnn.tensor_desc(ip.dtype, _o._as4d(ys), dense_strides(_o._as4d(ys), ip.layout))
            wd = _cudnn.filter_desc(ip.dtype, _o._as4d(ip.w_shape), self.w_layout)
            d = (xd, wd, yd, self._conv_desc(self.math))
            self._descs[n] = d
        return d

    def cudnn_output_shape(self) -> tuple[int, ...]:
        """The forward output shape cuDNN computes for the (inner) problem, in torch's rank.
        Wraps ``cudnnGetConvolutionNdForwardOutputDim``."""
        xd, wd, _yd, cd = self.descriptors()
        dims = _cudnn.forward_output_dim(cd, xd, wd, 4 if self.inner.ndim <= 2 else 5)
        if self.inner.ndim == 1:
            dims = dims[:2] + dims[3:]
        dims[0] = self.inner.n
        return tuple(dims)

    # ------------------------------------------------------------------ algo queries
    def _handle(self):
        return _cuda.handle_for(self.device_index)

    def _query(self, mode: str, math: str) -> list[_o.Algorithm]:
        key = (mode, math)
        rows = self._rows.get(key)
        if rows is not None:
            return rows
        _cudnn.lib()  # loads cuDNN, or raises, before any descriptor is made
        xd, wd, yd, _ = self.descriptors()
        cd = self._conv_desc(math)
        h = self._handle()
        d = self.direction
        perf_t = {"forward": "cudnnConvolutionFwdAlgoPerf_t", "backward_data": "cudnnConvolutionBwdDataAlgoPerf_t",
                  "backward_weights": "cudnnConvolutionBwdFilterAlgoPerf_t"}[d]
        count = 2 * len(_o.ALGOS[d]) * len(_o.MATH_TYPES)
        perf = ffi.new(f"{perf_t}[{count}]")
        ret = ffi.new("int *")
        if mode == "heuristic":
            fn, args = {"forward": ("cudnnGetConvolutionForwardAlgorithm_v7", (h, xd, wd, cd, yd)),
                        "backward_data": ("cudnnGetConvolutionBackwardDataAlgorithm_v7", (h, wd, yd, cd, xd)),
                        "backward_weights": ("cudnnGetConvolutionBackwardFilterAlgorithm_v7", (h, xd, yd, cd, wd))}[d]
            _cudnn.call(fn, *args, count, ret, perf, detail=self.problem.describe())
        elif mode == "find":
            _cuda.refuse_in_capture(f"cuDNN's Find (timing every algo) for {self.problem.describe()}")
            t = self._example_tensors()
            n = self.batch_chunk
            ws_bytes = self._find_workspace_bytes(math)
            ws = _cuda.workspace(ws_bytes, self.problem.device)
            P = lambda tt: ffi.cast("void *", tt.data_ptr())  # noqa: E731
            if d == "forward":
                y = empty_like_layout((n,) + self.inner.y_shape[1:], self.problem.layout, self.problem.torch_dtype,
                                      self.problem.device)
                _cudnn.call("cudnnFindConvolutionForwardAlgorithmEx", h, xd, P(t["x"][:n]), wd, P(t["w"]), cd, yd,
                            P(y), count, ret, perf, P(ws), ws_bytes, detail=self.problem.describe())
            elif d == "backward_data":
                dx = empty_like_layout((n,) + self.inner.x_shape[1:], self.problem.layout,
                                       self.problem.torch_dtype, self.problem.device)
                _cudnn.call("cudnnFindConvolutionBackwardDataAlgorithmEx", h, wd, P(t["w"]), yd, P(t["dy"][:n]), cd,
                            xd, P(dx), count, ret, perf, P(ws), ws_bytes, detail=self.problem.describe())
            else:
                dw = empty_like_layout(self.inner.w_shape, self.w_layout, self.problem.torch_dtype, self.problem.device)
                _cudnn.call("cudnnFindConvolutionBackwardFilterAlgorithmEx", h, xd, P(t["x"][:n]), yd,
                            P(t["dy"][:n]), cd, wd, P(dw), count, ret, perf, P(ws), ws_bytes,
                            detail=self.problem.describe())
            torch.cuda.current_stream(self.device_index).synchronize()
        else:
            raise ArgumentError(f"mode must be 'find' or 'heuristic', got {mode!r}")
        rows, seen = [], set()
        det_val = _cudnn.enum_value("CUDNN_DETERMINISTIC")
        table = _o.ALGOS[d]
        for i in range(ret[0]):
            r = perf[i]
            a = int(r.algo)
            if a not in table:
                continue
            m = _o._MATH_BY_VALUE.get(int(r.mathType), str(int(r.mathType)))
            if (a, m) in seen:
                continue
            seen.add((a, m))
            rows.append(_o.Algorithm(d, table[a], a, m, _cudnn.status_name(int(r.status)),
                                  float(r.time) if mode == "find" else None, int(r.memory),
                                  int(r.determinism) == det_val, mode, math))
        self._rows[key] = rows
        return rows

    def _find_workspace_bytes(self, math: str) -> int:
        """Workspace given to Find: the largest any algo asks for, capped by ``workspace_limit`` and
        by half the free device memory."""
        need = 0
        for a in _o.ALGOS[self.direction]:
            try:
                need = max(need, self._workspace_size(a, math))
            except NotSupportedError:
                continue
        free, _total = torch.cuda.mem_get_info(self.device_index)
        cap = free // 2 if self.workspace_limit is None else min(self.workspace_limit, free // 2)
        return int(min(need, cap))

    def _workspace_size(self, algo_id: int, math: str | None = None, n: int | None = None) -> int:
        L = _cudnn.lib()
        xd, wd, yd, cd = self.descriptors(n)
        if math is not None and math != self.math:
            cd = self._conv_desc(math)
        h = self._handle()
        out = ffi.new("size_t *")
        d = self.direction
        if d == "forward":
            st = L.cudnnGetConvolutionForwardWorkspaceSize(h, xd, wd, cd, yd, algo_id, out)
            fn = "cudnnGetConvolutionForwardWorkspaceSize"
        elif d == "backward_data":
            st = L.cudnnGetConvolutionBackwardDataWorkspaceSize(h, wd, yd, cd, xd, algo_id, out)
            fn = "cudnnGetConvolutionBackwardDataWorkspaceSize"
        else:
            st = L.cudnnGetConvolutionBackwardFilterWorkspaceSize(h, xd, yd, cd, wd, algo_id, out)
            fn = "cudnnGetConvolutionBackwardFilterWorkspaceSize"
        _cudnn.check(st, fn, f"algo {_o.ALGOS[d][algo_id]}, {self.problem.describe()}")
        return int(out[0])

    @_cuda.on_plan_device
    def algorithms(self, mode: str = "find", math: str | None = "all") -> list[_o.Algorithm]:
        """Rows of (algo, math type) for this plan's problem and direction (:class:`Algorithm`).

        ``mode``: ``"find"`` (cuDNN runs and times every algo: ``cudnnFind*AlgorithmEx`` on this
        plan's tensors, or random ones, with a workspace capped by ``workspace_limit``) or
        ``"heuristic"`` (``cudnnGet*Algorithm_v7``: no run, no times). ``math``: ``"all"`` queries
        with every math type set on the descriptor in turn and merges the rows; a name queries with
        that one; None uses the plan's math. Find rows come fastest first."""
        self._check_live()
        if math == "all":
            maths = list(_o.MATH_TYPES)
        else:
            maths = [self.math if math is None else _o._math_name(math, self.problem.dtype)]
        out, seen = [], set()
        for m in maths:
            for r in self._query(mode, m):
                if (r.algo_id, r.math) not in seen:
                    seen.add((r.algo_id, r.math))
                    out.append(r)
        if mode == "find":
            out.sort(key=lambda r: (not r.ok, r.time_ms if r.time_ms is not None and r.time_ms >= 0 else 1e30))
        return ResultTable(out, title=f"cuDNN {self.direction} algorithms ({mode}): {self.problem}")

    # ------------------------------------------------------------------ selection
    def _usable(self, r: _o.Algorithm) -> bool:
        return (r.ok and (not self.deterministic or r.deterministic)
                and (self.workspace_limit is None or r.workspace_bytes <= self.workspace_limit))

    def _supported_names(self) -> list[str]:
        names = []
        for r in self._query("heuristic", self.math):
            if self._usable(r) and r.algo not in names:
                names.append(r.algo)
        return names

    @_cuda.on_plan_device
    def _choose(self) -> _o.RunInfo:
        req = self._algo_request
        rows_h = self._query("heuristic", self.math)
        if self._algo_id is None:
            rows = self._query("find", self.math) if req == "fastest" else rows_h
            # prefer rows whose reported math is the one set on the descriptor
            same = [r for r in rows if self._usable(r) and r.math == self.math]
            usable = same or [r for r in rows if self._usable(r)]
            if not usable:
                raise NotSupportedError(
                    f"cuDNN offers no usable {self.direction} algo for {self.problem.describe()} (math {self.math}"
                    + (", deterministic" if self.deterministic else "")
                    + (f", workspace_limit {self.workspace_limit} B" if self.workspace_limit is not None else "")
                    + "): " + "; ".join(str(r) for r in rows), library="cuDNN", offered=[])
            algo_id = usable[0].algo_id
        else:
            algo_id = self._algo_id
        name = _o.ALGOS[self.direction][algo_id]
        try:
            ws = max(self._workspace_size(algo_id, None, n) for n in self._batch_sizes())
        except NotSupportedError as exc:
            sup = self._supported_names()
            raise NotSupportedError(
                f"cuDNN {_cudnn.version()['version']} does not support {self.direction} algo {name} for "
                f"{self.problem.describe()} (math {self.math}); supported: {', '.join(sup) or 'none'} "
                f"({exc.status_name})", library="cuDNN", function=exc.function, status=exc.status,
                status_name=exc.status_name, detail=exc.detail, offered=sup) from None
        match = [r for r in rows_h if r.algo_id == algo_id]
        pref = [r for r in match if r.math == self.math] or match
        if match and not any(r.ok for r in match):
            sup = self._supported_names()
            raise NotSupportedError(
                f"cuDNN does not support {self.direction} algo {name} for {self.problem.describe()} "
                f"(math {self.math}: {match[0].status}); supported: {', '.join(sup) or 'none'}",
                library="cuDNN", status_name=match[0].status, offered=sup)
        det = pref[0].deterministic if pref else False
        if self.deterministic and not det:
            raise NotSupportedError(
                f"{self.direction} algo {name} is not deterministic for {self.problem.describe()}; "
                f"deterministic and supported: {', '.join(self._supported_names()) or 'none'}",
                library="cuDNN", offered=self._supported_names())
        if self.workspace_limit is not None and ws > self.workspace_limit:
            raise NotSupportedError(
                f"{self.direction} algo {name} needs {ws} B of workspace, over workspace_limit "
                f"{self.workspace_limit} B; within the limit: {', '.join(self._supported_names()) or 'none'}",
                library="cuDNN", offered=self._supported_names())
        fused = None
        if self.direction == "forward" and (self.problem.has_bias or self.activation is not None):
            fused = self._can_fuse(algo_id)
        info = _o.RunInfo(self.direction, name, algo_id, self.math, pref[0].math if pref else self.math, ws, det,
                       fused, tuple(self.notes))
        _o.log.debug("chose %s@%s (workspace %d B) for %s %s", name, info.math_reported, ws, self.direction,
                  self.problem.describe())
        self._info = info
        self._ws = None
        return info

    # ------------------------------------------------------------------ workspaces
    def _workspace(self, stream: int):
        """``(tensor to hold until the launch, void * for cuDNN, stable)`` for a call on ``stream``:
        none for an algo that needs no workspace; on the device's default stream (never captured)
        the plan's own, kept between calls (``stable``: a hot-path pack may keep its address) and
        counted in the plans' byte budget from its allocation (:func:`rawconv.core.plans.charge`,
        under its device's name): past the budget, or at :func:`rawconv.clear_caches`, the least
        recently used are released (:meth:`_cache_release`) and the next call allocates again; on
        any other stream (a side stream, a CUDA graph capture, a graph tree's warm-up) this call's,
        from torch's caching allocator, given back after the launch as torch's own cuDNN calls do,
        so a captured graph uses only memory its pool owns and two streams never share one."""
        nbytes = self._info.workspace_bytes
        if not nbytes:
            return None, ffi.NULL, True
        if stream == 0:
            self.used = True   # (the byte budget's sweep: used since the last one)
            ws = self._ws
            if ws is None:
                ws = self._ws = _cuda.workspace(nbytes, self.problem.device)
                _plans.charge(self, nbytes, str(ws.device))
            return ws, ffi.cast("void *", ws.data_ptr()), True
        ws = _cuda.workspace(nbytes, self.problem.device)
        return ws, ffi.cast("void *", ws.data_ptr()), False

    def _launching(self, keep, stable: bool):
        """What a call's launches hold: the plan's lock while they use its kept workspace (the
        default stream's: every thread's default stream is the same stream, but the kernels two
        threads launch there at once interleave, each reading workspace the other's wrote), else
        :data:`rawconv.cudnn._cuda.NO_LOCK` (a call's own workspace, or none)."""
        return self._launch_lock if stable and keep is not None else _cuda.NO_LOCK

    def _cache_release(self) -> None:
        """Drop the default stream's workspace and the prepared calls that hold it (one running
        keeps it until it returns); the next call allocates again."""
        self._ws = None
        self._hot = self._ghot = None

    def _batch_sizes(self) -> list[int]:
        n, b = self.inner.n, self.batch_chunk
        sizes = [b] if n >= b else [max(n, 1)]
        if n > b and n % b:
            sizes.append(n % b)
        return sizes

    def _can_fuse(self, algo_id: int) -> bool:
        """cudnnConvolutionBiasActivationForward takes a bias and RELU or IDENTITY (IDENTITY only with
        IMPLICIT_PRECOMP_GEMM); anything else runs unfused."""
        if not self.problem.has_bias or self._fused is False:
            return False
        act = self.activation or "identity"
        if act == "relu":
            return True
        return act == "identity" and _o.ALGOS["forward"][algo_id] == "IMPLICIT_PRECOMP_GEMM"

    @property
    def info(self) -> _o.RunInfo:
        """What :meth:`execute` runs (:class:`RunInfo`): algo, math type set and reported,
        workspace bytes, determinism, fusion. Chooses the algo on first access (needs the GPU)."""
        self._check_live()
        if self._info is None:
            with self._lock:
                if self._info is None:
                    self._choose()
        return self._info

    @property
    def selected(self) -> _o.RunInfo:
        """The plan contract's name (:class:`rawconv.core.backend.Plan`) for :attr:`info`: what
        :meth:`execute` runs, as :meth:`select` returns it (its ``choice``-able name is
        ``f"{info.algo}@{info.math}"``)."""
        return self.info

    def select(self, algo: Any = None, math: str | None = None, *, choice: Any = None) -> _o.RunInfo:
        """Force ``algo`` (name, enum value, or ``None``/``"fastest"``), optionally with another
        math type; or ``choice``: an :class:`Algorithm` row or its stable name ``"ALGO@math"``
        (``algo="IMPLICIT_PRECOMP_GEMM@fma"`` works too). Raises :class:`NotSupportedError` naming
        the supported algos."""
        self._check_live()
        algo, math = _o._split_choice(self.direction, algo, choice, math)
        if math is not None:
            self.math = _o._math_name(math, self.problem.dtype)
            self._descs = {}
        self._algo_request = algo
        self._algo_id = _o.resolve_algo(self.direction, algo) if algo not in (None, "fastest") else None
        self._info = None
        with self._lock:
            return self._choose()


# only rawconv's exceptions leave them (rawconv.core.guard), named as the public methods they are
_guard.public_methods("descriptors", "cudnn_output_shape", "algorithms", "info", "selected", "select", owner="rawconv.cudnn.Convolution")(Algorithms)
