"""One tuning decision per job: rawconv's autotune shared by every rank under ``torch.distributed``.

In a data-parallel job (DDP, FSDP) every rank runs the same model on its own share of the batch.
:func:`rawconv.nn.convert` with ``autotune=`` on each rank would search each convolution once per
rank: minutes spent N times over, and, timings being noisy, ranks on identical devices can pick
different candidates, which is the uncertainty rawconv exists to remove. Here the search runs once
per job and every rank pins the same candidate for each layer::

    import torch.distributed as dist
    import rawconv.distributed

    dist.init_process_group("gloo")            # "nccl" with torch.cuda.set_device(local_rank) first
    model = rawconv.distributed.convert(model, x)                 # rank 0 tunes, every rank pins
    model = torch.nn.parallel.DistributedDataParallel(model)
    print(rawconv.distributed.check_consistent(model))            # layer x rank -> candidate
    print(model.module.rawconv_distributed)                       # who tuned what, and how long

* :func:`convert`: every rank converts its model with :func:`rawconv.nn.convert` (without
  ``autotune``), records the convolution calls on its example input, and the ranks check that
  they hold the same layers with the same problems. ``strategy="one"``: rank ``src`` searches
  every distinct problem and broadcasts the results (``torch.distributed.broadcast_object_list``);
  ``strategy="split"``: the distinct problems are dealt out to the ranks (largest first, to the
  least loaded), each searches its share, and the results are gathered
  (``torch.distributed.all_gather_object``). Each result travels as a
  :class:`rawconv.tuning.TuningRecord` (JSON: key with the problem, options, library version
  and device; the choice; times). Every rank then pins the same choice per layer.
* The environment a choice was made in must be the one it runs in: before any search, the
  ranks compare the library (name, version) and device (name, architecture) of every tuning
  rank with their own (:meth:`rawconv.tuning.TuningRecord.check_environment`'s fields); a
  difference raises :class:`rawconv.tuning.TuningEnvironmentError` on every rank (or warns, with
  ``environment="warn"``), naming the ranks and what differs.
* :func:`check_consistent`: gathers every rank's pinned choices (:func:`rawconv.nn.pinned_choices`)
  into a :class:`ConsistencyTable` (layer x rank -> candidate) that flags layers whose ranks differ;
  ``raise_on_mismatch=True`` raises :class:`InconsistentChoicesError` on every rank instead.

Every function here is a collective: call it on every rank of ``group`` (default: the whole job),
in the same order. Errors are decided on gathered data, so every rank raises the same error (no
rank is left waiting in a collective). Only ``torch.distributed`` carries data; the object
collectives pickle small lists and dicts of strings and numbers. With the NCCL backend, the
object collectives use ``torch.cuda.current_device()``: call ``torch.cuda.set_device`` first
(torch's rule). NCCL refuses two ranks on one GPU; use ``gloo`` there (it takes CUDA tensors).
"""
from __future__ import annotations

import dataclasses
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from . import nn as _nn
from ..core import tuning as _tuning
from ..core.errors import ArgumentError, ArgumentTypeError, NotSupportedError, RawconvError

__all__ = ["convert", "check_consistent", "environment", "ConsistencyTable", "DistributedReport",
           "InconsistentChoicesError", "DistributedTuningError", "STRATEGIES", "ENVIRONMENT_POLICIES"]

STRATEGIES = ("one", "split")
ENVIRONMENT_POLICIES = ("error", "warn")
_ENV_FIELDS = ("library", "library_version", "device", "device_arch")


class InconsistentChoicesError(RawconvError, RuntimeError):
    """Ranks run different candidates for some layers (:func:`check_consistent` with
    ``raise_on_mismatch=True``). ``table``: the :class:`ConsistencyTable`."""

    def __init__(self, message: str, table: "ConsistencyTable"):
        super().__init__(message)
        self.table = table


class DistributedTuningError(RawconvError, RuntimeError):
    """A rank's search failed with an error other than "not supported" (raised on every rank,
    naming the rank, the layer and the original error). ``failures``: ``[(rank, layer, error)]``."""

    def __init__(self, message: str, failures: list):
        super().__init__(message)
        self.failures = list(failures)


# ---------------------------------------------------------------------------- process group
def _dist():
    import torch.distributed as dist

    if not dist.is_available():
        raise ArgumentError("this torch was built without torch.distributed")
    if not dist.is_initialized():
        raise ArgumentError("torch.distributed is not initialized: call torch.distributed.init_process_group "
                            "(or run under torchrun) on every rank first")
    return dist


def _group_info(group) -> tuple[int, int]:
    """(world size, this process's rank) in ``group``."""
    dist = _dist()
    return dist.get_world_size(group), dist.get_rank(group)


def _all_gather(obj, group) -> list:
    dist = _dist()
    out = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def _broadcast(obj, src: int, group):
    dist = _dist()
    src_global = src if group is None else dist.get_global_rank(group, src)
    box = [obj]
    dist.broadcast_object_list(box, src=src_global, group=group)
    return box[0]


# ---------------------------------------------------------------------------- environments
def environment(backend: str, device: Any = None) -> dict:
    """The library and device a choice of ``backend`` depends on, as a tuning key records them:
    ``{"library", "library_version", "device", "device_arch"}``. ``"onednn"``: ``"oneDNN"``, its
    version, ``"cpu"`` and oneDNN's effective ISA (``dnnl_get_effective_cpu_isa``: which
    implementations exist); ``"cudnn"`` / ``"cudnn_graph"``: ``"cuDNN"``, its version, the GPU's
    name and ``sm_XY`` of ``device`` (a CUDA device or index; default the current one). Loads the
    library."""
    if backend == "onednn":
        from .. import onednn

        return {**onednn.environment(), "device": "cpu"}
    if backend in ("cudnn", "cudnn_graph"):
        from ..cudnn import graph as cudnn_graph

        if device is None:
            idx = torch.cuda.current_device()
        elif isinstance(device, int):
            idx = device
        else:
            d = torch.device(device)
            idx = d.index if d.index is not None else torch.cuda.current_device()
        return cudnn_graph.environment(idx)
    raise ArgumentError(f"backend must be 'onednn', 'cudnn' or 'cudnn_graph', got {backend!r}")


def _env_diff(recorded: dict, current: dict) -> list:
    """``[(field, recorded, current)]`` that differ (the fields check_environment compares)."""
    return [(k, recorded.get(k, ""), current.get(k, "")) for k in _ENV_FIELDS if recorded.get(k, "") != current.get(k, "")]


# ---------------------------------------------------------------------------- layers
@dataclass
class _Layer:
    name: str
    module: Any
    kind: str
    args: dict
    backend: str          # "onednn" | "cudnn"
    local_key: tuple      # rawconv.nn's process-wide memo key
    key: _tuning.TuningKey  # rank-independent (no device index, no environment)
    env: dict


def _layers(model, example, budget_s) -> list[_Layer]:
    """Every rawconv convolution call of ``model`` on ``example`` (first call per module), with
    its tuning keys and environment."""
    from .. import onednn

    names = {id(m): n for n, m in model.named_modules()}
    out = []
    for m, kind, args in _nn._record_calls(model, example):
        x = args["x"]
        backend = _nn._resolve_backend(m.backend, x.device)
        problem = _nn._problem_of(m, kind, args)
        options = {"kind": kind, "precision": m.precision, "w_layout": onednn.weights_layout(m.weight),
                   "search": "rawconv.nn.convert", "budget_s": budget_s}
        if kind == "fused":
            options["residual"] = args.get("residual") is not None
        key = _tuning.TuningKey("onednn" if backend == "onednn" else "cudnn_graph",
                                "backward_data" if kind == "transpose" else "forward", problem,
                                m.activation if kind == "fused" else None, options)
        out.append(_Layer(names.get(id(m), "?"), m, kind, args, backend,
                          _nn._tune_key(m, kind, args, backend, problem), key,
                          environment(backend, x.device if backend == "cudnn" else None)))
    return out


def _assign(problems: list, world: int, strategy: str, src: int) -> list[int]:
    """The rank that searches each distinct problem: all ``src`` ("one"); "split": largest
    problem (multiply-adds) first, to the rank with the least work so far (ties: lowest rank)."""
    if strategy == "one" or world == 1:
        return [src] * len(problems)
    load = [0] * world
    owner = [0] * len(problems)
    order = sorted(range(len(problems)), key=lambda i: (-problems[i][1], i))
    for i in order:
        r = min(range(world), key=lambda q: (load[q], q))
        owner[i] = r
        load[r] += max(problems[i][1], 1)
    return owner


def _describe_key(key: _tuning.TuningKey) -> str:
    """The problem of a key in one line: direction when not forward, the problem, a fused tail."""
    d = "" if key.direction == "forward" else f"{key.direction} "
    tail = ""
    if key.options.get("kind") == "fused":
        tail = " +" + ("residual+" if key.options.get("residual") else "") + str(key.activation)
    return f"{d}{key.conv_problem().describe()}{tail}"


def _flops(key: _tuning.TuningKey) -> int:
    try:
        return int(key.conv_problem().flops)
    except Exception:  # noqa: BLE001  (a problem of fields ConvProblem refuses: count it as small)
        return 1


# ---------------------------------------------------------------------------- report
@dataclass
class DistributedReport:
    """What :func:`convert` did on this rank (``model.rawconv_distributed``).

    ``strategy``, ``world_size``, ``rank``, ``src``; ``problems``: one dict per distinct problem
    (``problem``: its description, ``layers``: the layer names that share it, ``backend``,
    ``tuned_by``: the rank that searched it, ``choice`` (None: the backend's default, ``note``
    says why), ``seconds``: the search's wall time on that rank, ``searched``: False when that
    rank's process memo already held a winner, ``median_ms``/``min_ms``: the winner's time);
    ``records``: the :class:`~rawconv.tuning.TuningRecord` of each searched problem (the ones
    that travelled); ``shared_s``: per rank, the wall seconds :func:`convert` took from start to
    pinned choices (conversion, recording, collectives, searches); ``tune_s``: per rank, the
    seconds it spent searching; ``full_autotune_s``: the sum of every problem's search time, what
    one rank spends when it searches every problem itself (one autotune per rank costs this on
    every rank); with ``measure_independent``: ``independent_s`` (per rank, wall seconds of an
    actual independent search of every problem: no memo, no cuDNN tuning cache, oneDNN's primitive
    cache emptied first; cuDNN keeps the kernels it compiled) and ``independent_choices`` (per rank,
    the choice per problem it picked), ``independent_agree`` (whether every rank picked the same).
    ``environment_differences``: ``[(rank, tuning rank, field, tuner's, rank's)]`` (warned).
    """

    strategy: str
    world_size: int
    rank: int
    src: int
    problems: list = field(default_factory=list)
    records: list = field(default_factory=list)
    shared_s: list = field(default_factory=list)
    tune_s: list = field(default_factory=list)
    full_autotune_s: float = 0.0
    independent_s: list | None = None
    independent_choices: list | None = None
    environment_differences: list = field(default_factory=list)

    @property
    def shared_wall_s(self) -> float:
        """The slowest rank's :attr:`shared_s` (the job waits for it)."""
        return max(self.shared_s) if self.shared_s else 0.0

    @property
    def independent_agree(self) -> bool | None:
        if self.independent_choices is None:
            return None
        return all(c == self.independent_choices[0] for c in self.independent_choices)

    def __str__(self) -> str:
        n_layers = sum(len(p["layers"]) for p in self.problems)
        lines = [f"rawconv.distributed.convert: strategy {self.strategy!r}, {self.world_size} ranks, {n_layers} layers, "
                 f"{len(self.problems)} distinct problems" + (f" (src rank {self.src})" if self.strategy == "one" else "")]
        rows = [("problem", "layers", "tuned by", "choice", "search s")]
        for p in self.problems:
            rows.append((p["problem"], ",".join(p["layers"]), f"rank {p['tuned_by']}",
                         p["choice"] if p["choice"] is not None else f"(default: {p['note'][:60]})",
                         f"{p['seconds']:.2f}" + ("" if p["searched"] else " (memo)")))
        widths = [min(max(len(r[i]) for r in rows), 72) for i in range(len(rows[0]))]
        lines += ["  " + "  ".join(c[:w].ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        per = ", ".join(f"rank {r}: {t:.2f} s" for r, t in enumerate(self.tune_s))
        lines.append(f"  shared autotune: {self.shared_wall_s:.2f} s wall (slowest rank; searching {per}); one "
                     f"autotune per rank: {self.full_autotune_s:.2f} s of searching on each rank "
                     f"({self.full_autotune_s * self.world_size:.2f} s over {self.world_size} ranks)")
        if self.independent_s is not None:
            diff = sum(len({c[i] for c in self.independent_choices}) > 1 for i in range(len(self.problems)))
            lines.append("  measured, one independent autotune per rank: "
                         + ", ".join(f"rank {r}: {t:.2f} s" for r, t in enumerate(self.independent_s))
                         + f" wall; their choices differ on {diff} of {len(self.problems)} problems")
        for r, t, k, a, b in self.environment_differences:
            lines.append(f"  warning: rank {r} runs choices made on rank {t}: {k} {a!r} there, {b!r} here")
        return "\n".join(lines)

    __repr__ = __str__


# ---------------------------------------------------------------------------- convert
def convert(model: torch.nn.Module, example_input: Any, *, group=None, src: int = 0, strategy: str = "one",
            environment: str = "error", measure_independent: bool = False, **convert_kw) -> torch.nn.Module:
    """:func:`rawconv.nn.convert` with ONE autotune shared by every rank of ``group``; a collective.

    Call on every rank with that rank's model (same architecture, same names) and example input
    (same shapes on every rank: the per-rank batch). ``convert_kw`` go to
    :func:`rawconv.nn.convert` (``backend``, ``precision``, ``fuse``, ``inplace``, ``choice``,
    ``autotune_budget_s``: the search budget per problem), except ``autotune`` /
    ``example_input`` (this function's ``example_input`` is the autotune example).

    ``strategy="one"``: rank ``src`` (a rank of ``group``) searches every distinct problem, then
    broadcasts the results; ``"split"``: the distinct problems are dealt out to the ranks (largest
    first, to the least loaded rank), each searches its share, the results are gathered. Either
    way every rank pins the same forward choice on every layer, to the problem it was searched
    for (as :func:`rawconv.nn.convert` does: :func:`rawconv.nn.pinned_choices`; another problem
    runs the default; the backend's default where nothing could be timed, with the reason in the
    report; the backward passes are not searched here) and remembers it in
    :mod:`rawconv.nn`'s process memo (a later ``rawconv.nn.convert(autotune=...)`` of the same
    problems searches nothing and pins the same). The searches are :func:`rawconv.nn.convert`'s
    (oneDNN: every implementation timed; cuDNN: the graph API's autotune).

    ``environment``: before any search, each rank compares the library name and version and the
    device name and architecture of the rank that searches each problem with its own
    (:func:`environment`); a difference raises :class:`rawconv.tuning.TuningEnvironmentError`
    (an :class:`ArgumentError`) on every rank with ``"error"`` (default), or warns
    (``RuntimeWarning``) and pins anyway with ``"warn"``. ``measure_independent=True`` then
    also runs what the sharing avoids, one independent search of every problem on every rank
    (no memo, no tuning cache, oneDNN's primitive cache emptied first), and reports its wall time
    and whether the ranks' picks agree.

    Returns the converted model (``inplace=False``: a copy, as :func:`rawconv.nn.convert`) with
    ``model.rawconv_report`` (:class:`rawconv.nn.ConvertReport`; ``tuned[i]["searched"]`` is True
    on the rank that searched) and ``model.rawconv_distributed`` (:class:`DistributedReport`:
    per problem who searched it and the choice; the shared autotune's wall time against one
    autotune per rank).

    Raises, on every rank alike: :class:`ArgumentError` / :class:`ArgumentTypeError` for bad
    arguments or torch.distributed not initialized, and when the ranks' layers or problems differ
    (naming the first layer that does); :class:`rawconv.tuning.TuningEnvironmentError`;
    :class:`DistributedTuningError` when a search failed on some rank (other than "not
    supported", which leaves the default).
    """
    world, rank = _check_convert_args(model, example_input, group, src, strategy, environment, measure_independent,
                                      convert_kw)
    budget = convert_kw.get("autotune_budget_s")
    t_start = time.perf_counter()
    local = _nn.convert(model, **convert_kw)
    report = getattr(local, "rawconv_report", None) or _nn.ConvertReport()
    layers = _layers(local, example_input, budget)

    # 1. the same layers and problems everywhere, and the environments
    mine = {"layers": [(lay.name, lay.key.to_dict()) for lay in layers], "envs": [lay.env for lay in layers]}
    every = _all_gather(mine, group)
    _check_same_layers(every)
    distinct = _distinct_problems(layers)
    keys = list(distinct)
    owners = _assign([(k, _flops(k)) for k in keys], world, strategy, src)
    diffs = _check_environments(keys, distinct, owners, every, world, environment)

    # 2. search my share
    results_mine, tune_s = _search_share(layers, keys, distinct, owners, rank, budget)

    # 3. exchange
    results = _exchange_results(results_mine, layers, keys, distinct, strategy, world, rank, src, group)

    # 4. pin the same choices everywhere
    problems, records = _pin_shared(layers, keys, distinct, results, rank, report)
    report.autotune_s = shared = time.perf_counter() - t_start
    timings = _all_gather({"shared_s": shared, "tune_s": tune_s}, group)
    dreport = DistributedReport(strategy, world, rank, src, problems, records, [t["shared_s"] for t in timings],
                                [t["tune_s"] for t in timings], sum(p["seconds"] for p in problems),
                                environment_differences=diffs)

    # 5. what the sharing avoids, measured
    if measure_independent:
        _measure_independent(dreport, layers, keys, distinct, rank, budget, group)

    local.rawconv_report = report
    local.rawconv_distributed = dreport
    return local


def _check_convert_args(model, example_input, group, src, strategy: str, environment: str, measure_independent,
                        convert_kw: dict) -> tuple[int, int]:
    """Check :func:`convert`'s arguments: ``model``, ``strategy``, ``environment``,
    ``measure_independent``, the ``convert_kw`` it forwards (no ``autotune`` / ``example_input``),
    ``example_input``, then ``group`` (torch.distributed initialized) and ``src`` (a rank of it).
    Returns ``(world size, this rank)`` of ``group``; raises :class:`ArgumentTypeError` or
    :class:`ArgumentError` on the first bad one, in that order."""
    if not isinstance(model, torch.nn.Module):
        raise ArgumentTypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if strategy not in STRATEGIES:
        raise ArgumentError(f"strategy must be one of {list(STRATEGIES)}, got {strategy!r}")
    if environment not in ENVIRONMENT_POLICIES:
        raise ArgumentError(f"environment must be one of {list(ENVIRONMENT_POLICIES)}, got {environment!r}")
    if not isinstance(measure_independent, bool):
        raise ArgumentTypeError(f"measure_independent must be True or False, got {measure_independent!r}")
    for k in ("autotune", "example_input"):
        if k in convert_kw:
            raise ArgumentError(f"{k}= is not taken here: the example input is rawconv.distributed.convert's second "
                                "argument, and the autotune is the shared one")
    if example_input is None:
        raise ArgumentError("example_input is needed: the model runs once on it to record its convolutions")
    world, rank = _group_info(group)
    if isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < world:
        raise ArgumentError(f"src must be a rank of the group (0..{world - 1}), got {src!r}")
    return world, rank


def _distinct_problems(layers: list) -> dict:
    """Group ``layers`` by problem. Returns ``{tuning key: [layer index, ...]}``, in the order the
    problems first appear."""
    distinct: dict = {}
    for i, lay in enumerate(layers):
        distinct.setdefault(lay.key, []).append(i)
    return distinct


def _check_environments(keys: list, distinct: dict, owners: list, every: list, world: int, environment: str) -> list:
    """Compare, for each distinct problem (``keys``, the layer indices of each in ``distinct``, its
    searching rank in ``owners``), the searching rank's environment with every other rank's (from
    ``every``, the gathered layers and environments). Returns the differences,
    ``[(rank, tuning rank, field, tuner's, rank's)]`` without repeats; when there are any, raises
    :class:`rawconv.tuning.TuningEnvironmentError` with ``environment="error"``, or warns
    (``RuntimeWarning``, attributed to :func:`convert`'s caller) with ``"warn"``."""
    diffs = []
    for pi, k in enumerate(keys):
        li = distinct[k][0]
        tuner_env = every[owners[pi]]["envs"][li]
        for r in range(world):
            if r != owners[pi]:
                diffs += [(r, owners[pi], f, a, b) for f, a, b in _env_diff(tuner_env, every[r]["envs"][li])]
    diffs = list(dict.fromkeys(diffs))
    if diffs:
        what = "; ".join(f"rank {r} would run choices made on rank {t}: {f} there {a!r}, here {b!r}"
                         for r, t, f, a, b in diffs[:8])
        msg = (f"rawconv.distributed.convert: the ranks do not share one environment, so one tuning decision does "
               f"not fit them all: {what}" + (f" (and {len(diffs) - 8} more)" if len(diffs) > 8 else ""))
        if environment == "error":
            raise _tuning.TuningEnvironmentError(
                msg + " (environment='warn' pins the shared choices anyway)", [(f, a, b) for _, _, f, a, b in diffs])
        # stacklevel 3: convert's caller (this helper is called from convert)
        warnings.warn(msg, RuntimeWarning, stacklevel=3)
    return diffs


def _search_share(layers: list, keys: list, distinct: dict, owners: list, rank: int, budget) -> tuple[dict, float]:
    """Search, on this ``rank``, the distinct problems ``owners`` gives it (each on its first layer,
    with the memo). Returns ``(results, seconds)``: :func:`_search_one`'s result per problem index,
    and the sum of their search times."""
    results_mine: dict = {}
    tune_s = 0.0
    for pi, k in enumerate(keys):
        if owners[pi] != rank:
            continue
        lay = layers[distinct[k][0]]
        results_mine[pi] = res = _search_one(lay, budget, rank, memo=True)
        tune_s += res["seconds"]
    return results_mine, tune_s


def _exchange_results(results_mine: dict, layers: list, keys: list, distinct: dict, strategy: str, world: int,
                      rank: int, src: int, group) -> dict:
    """Share the search results: broadcast from ``src`` (``strategy="one"`` or one rank), else every
    rank's share gathered. Returns the results of every problem (problem index -> result); raises
    :class:`DistributedTuningError`, on every rank, when a search failed anywhere."""
    if strategy == "one" or world == 1:
        results = _broadcast(results_mine if rank == src else None, src, group)
    else:
        results = {}
        for part in _all_gather(results_mine, group):
            results.update(part)
    failures = [(results[pi]["rank"], layers[distinct[k][0]].name, results[pi]["error"])
                for pi, k in enumerate(keys) if results[pi]["error"]]
    if failures:
        raise DistributedTuningError("rawconv.distributed.convert: the search failed: " + "; ".join(
            f"rank {r}, layer {n}: {e}" for r, n, e in failures), failures)
    return results


def _pin_shared(layers: list, keys: list, distinct: dict, results: dict, rank: int, report) -> tuple[list, list]:
    """Pin each problem's shared choice (``results``) on every layer of it, forward only, remember it
    in :mod:`rawconv.nn`'s process memo and append the layers to ``report.tuned``. Returns
    ``(problems, records)``: :class:`DistributedReport`'s per-problem dicts and the
    :class:`rawconv.tuning.TuningRecord` of each problem that has one."""
    problems, records = [], []
    for pi, k in enumerate(keys):
        res = results[pi]
        if res["record"] is not None:
            records.append(_tuning.TuningRecord.from_dict(res["record"]))
        names = [layers[i].name for i in distinct[k]]
        problems.append({"problem": _describe_key(k), "layers": names, "backend": layers[distinct[k][0]].backend,
                         "tuned_by": res["rank"], "choice": res["choice"], "seconds": res["seconds"],
                         "searched": res["searched"], "median_ms": res["median_ms"], "min_ms": res["min_ms"],
                         "note": res["note"]})
        for i in distinct[k]:
            lay = layers[i]
            # pinned to this problem (another problem runs the default), forward only: the shared
            # search covers the forward passes
            direction = _nn._forward_direction(lay.kind)
            _nn._pin_tuned(lay.module, lay.kind, lay.args, _nn.TunedChoice(
                _nn._problem_of(lay.module, lay.kind, lay.args).describe(), lay.kind, lay.backend, res["choice"],
                None, {direction: res["choice"]}))
            _nn._TUNED[lay.local_key] = res["choice"]
            report.tuned.append({"name": lay.name, "kind": lay.kind, "problem": _describe_key(k),
                                 "backend": lay.backend, "choice": res["choice"], "backward_choice": None,
                                 "directions": {direction: res["choice"]}, "backward_searched": False,
                                 "searched": res["searched"] and res["rank"] == rank and i == distinct[k][0],
                                 "seconds": res["seconds"] if res["rank"] == rank and i == distinct[k][0] else 0.0,
                                 "key": lay.local_key, "note": res["note"], "tuned_by": res["rank"]})
    return problems, records


def _measure_independent(dreport: DistributedReport, layers: list, keys: list, distinct: dict, rank: int, budget,
                         group) -> None:
    """Run what the sharing avoids: one independent search of every problem on this rank (no memo,
    oneDNN's primitive cache emptied first), gathered from every rank. Returns None; fills
    ``dreport.independent_s`` and ``dreport.independent_choices``."""
    _flush_onednn_primitives()
    t0 = time.perf_counter()
    picks = [_search_one(layers[distinct[k][0]], budget, rank, memo=False)["choice"] for k in keys]
    ind = _all_gather({"s": time.perf_counter() - t0, "choices": picks}, group)
    dreport.independent_s = [d["s"] for d in ind]
    dreport.independent_choices = [d["choices"] for d in ind]


def _search_one(lay: _Layer, budget_s, rank: int, *, memo: bool) -> dict:
    """Search one layer's problem here (``memo``: rawconv.nn's process memo first, and the cuDNN
    tuning cache). Never raises: errors travel in the result."""
    from ..core import __version__

    res = {"rank": rank, "choice": None, "record": None, "seconds": 0.0, "searched": True,
           "median_ms": None, "min_ms": None, "note": "", "error": ""}
    if memo and lay.local_key in _nn._TUNED:
        res["choice"], res["searched"] = _nn._TUNED[lay.local_key], False
    else:
        info: dict = {}
        t = time.perf_counter()
        try:
            res["choice"] = _nn._tune_one(lay.module, lay.kind, lay.args, lay.backend, budget_s, info=info,
                                          use_cache=memo)
        except NotSupportedError as exc:
            res["note"] = f"not tuned: {exc}"
        except Exception as exc:  # noqa: BLE001  (sent to every rank, raised there as DistributedTuningError)
            res["error"] = f"{type(exc).__name__}: {exc}"
        res["seconds"] = time.perf_counter() - t
        res["median_ms"], res["min_ms"] = info.get("median_ms"), info.get("min_ms")
    if res["choice"] is not None:
        try:
            key = dataclasses.replace(lay.key, **lay.env)
            rec = _tuning.TuningRecord(key, str(res["choice"]), {"layer": lay.name, "kind": lay.kind,
                                                                 "searched": res["searched"]},
                                       median_ms=_finite(res["median_ms"]), min_ms=_finite(res["min_ms"]),
                                       rawconv_version=__version__)
            res["record"] = rec.to_dict()
        except (ArgumentError, ArgumentTypeError) as exc:
            res["error"] = f"{type(exc).__name__}: {exc}"
    return res


def _flush_onednn_primitives() -> None:
    """Empty oneDNN's primitive cache (capacity 0, then back), so that a measured search creates
    (JIT-compiles) its primitives again as a first search does. cuDNN keeps what it compiled."""
    try:
        from .. import onednn

        onednn.flush_primitive_cache()   # (a library not loaded yet has nothing cached)
    except Exception:  # noqa: BLE001  (no oneDNN: nothing cached)
        pass


def _finite(v):
    return v if isinstance(v, (int, float)) and v == v and v not in (float("inf"), float("-inf")) else None


def _check_same_layers(every: list) -> None:
    """Raise ArgumentError (on every rank alike) when the ranks' recorded layers differ."""
    ref = every[0]["layers"]
    for r, d in enumerate(every[1:], 1):
        lay = d["layers"]
        if [n for n, _ in lay] != [n for n, _ in ref]:
            a, b = [n for n, _ in ref], [n for n, _ in lay]
            raise ArgumentError(f"rawconv.distributed.convert: rank {r} records other convolution layers than rank 0: "
                                f"rank 0 {a}, rank {r} {b} (every rank must convert the same model)")
        for (name, k0), (_, k1) in zip(ref, lay):
            if k0 != k1:
                what = "; ".join(f"{f}: rank 0 {k0.get(f)!r}, rank {r} {k1.get(f)!r}"
                                 for f in ("backend", "direction", "problem", "activation", "options")
                                 if k0.get(f) != k1.get(f))
                raise ArgumentError(f"rawconv.distributed.convert: layer {name} is another problem on rank {r} than on "
                                    f"rank 0 ({what}); give every rank an example input of the same shape, "
                                    "dtype and layout (its per-rank batch)")


# ---------------------------------------------------------------------------- consistency
def _unwrap(model):
    from torch.nn.parallel import DistributedDataParallel

    while isinstance(model, DistributedDataParallel) or type(model).__name__ in ("FullyShardedDataParallel",):
        model = model.module
    return model


def _label(info: dict, show_backend: bool) -> str:
    s = str(info["choice"]) if info["choice"] is not None else "(default)"
    if info.get("backward_choice") is not None:
        s += f" bwd={info['backward_choice']}"
    if info.get("precision", "strict") != "strict":
        s += f" precision={info['precision']}"
    return f"{info['backend']}:{s}" if show_backend else s


@dataclass
class ConsistencyTable:
    """Every rank's pinned choice per layer (:func:`check_consistent`).

    ``ranks``: 0..world-1; ``layers``: the layer names (rank 0's order, then any only other ranks
    hold); ``cells``: ``{(layer, rank): label}`` (the candidate name, ``"(default)"`` for the
    backend's default; ``bwd=`` and ``precision=`` when set; ``"(missing)"`` where a rank has no
    such layer); ``pinned``: ``{(layer, rank): pinned_choices entry}``. ``differing``: the layers
    whose ranks differ in backend, choice, backward choice or precision; ``consistent``: none
    does. ``str()`` is the table, one line per layer, one column per rank."""

    ranks: list
    layers: list
    cells: dict
    pinned: dict

    @property
    def differing(self) -> list:
        out = []
        for name in self.layers:
            vals = [self.pinned.get((name, r)) for r in self.ranks]
            if any(v is None for v in vals) or any(v != vals[0] for v in vals[1:]):
                out.append(name)
        return out

    @property
    def consistent(self) -> bool:
        return not self.differing

    def rows(self) -> list[dict]:
        """One dict per layer: ``{"layer", "rank 0", "rank 1", ..., "differs"}``."""
        bad = set(self.differing)
        return [{"layer": n, **{f"rank {r}": self.cells[(n, r)] for r in self.ranks}, "differs": n in bad}
                for n in self.layers]

    def to_pandas(self):
        import pandas as pd

        return pd.DataFrame(self.rows()).set_index("layer")

    def __str__(self) -> str:
        bad = set(self.differing)
        head = ["layer"] + [f"rank {r}" for r in self.ranks] + [""]
        body = [[n] + [self.cells[(n, r)] for r in self.ranks] + ["<- DIFFERS" if n in bad else ""]
                for n in self.layers]
        widths = [max(len(str(row[i])) for row in [head] + body) for i in range(len(head))]
        line = lambda row: "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip()   # noqa: E731
        verdict = (f"consistent: every rank runs the same candidate on all {len(self.layers)} layers" if not bad else
                   f"INCONSISTENT: {len(bad)} of {len(self.layers)} layers differ between ranks: {sorted(bad)}")
        return "\n".join([line(head), line(["-" * w for w in widths])] + [line(b) for b in body] + [verdict])

    __repr__ = __str__


def check_consistent(model: torch.nn.Module, group=None, *, raise_on_mismatch: bool = False) -> ConsistencyTable:
    """Gather every rank's pinned choices (:func:`rawconv.nn.pinned_choices` of ``model``; a
    DistributedDataParallel wrapper is looked through) into a :class:`ConsistencyTable`
    (layer x rank -> candidate); a collective. ``table.consistent`` says whether every rank runs
    the same backend, candidate, backward candidate and precision on every layer;
    ``table.differing`` names the layers that do not. With ``raise_on_mismatch``, raises
    :class:`InconsistentChoicesError` (on every rank) when some differ."""
    if not isinstance(model, torch.nn.Module):
        raise ArgumentTypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    mine = {n: {k: (v if v is None or isinstance(v, (str, int, float, bool)) else str(v)) for k, v in d.items()}
            for n, d in _nn.pinned_choices(_unwrap(model)).items()}
    every = _all_gather(list(mine.items()), group)
    ranks = list(range(len(every)))
    layers: list = []
    for items in every:
        for n, _ in items:
            if n not in layers:
                layers.append(n)
    pinned = {(n, r): d for r, items in enumerate(every) for n, d in items}
    cells = {}
    for n in layers:
        backends = {pinned[(n, r)]["backend"] for r in ranks if (n, r) in pinned}
        for r in ranks:
            d = pinned.get((n, r))
            cells[(n, r)] = "(missing)" if d is None else _label(d, len(backends) > 1)
    table = ConsistencyTable(ranks, layers, cells, pinned)
    if raise_on_mismatch and not table.consistent:
        raise InconsistentChoicesError(f"ranks run different candidates on {table.differing}:\n{table}", table)
    return table
