"""Tuning records and the tuning cache: which candidate won the autotune of a problem.

A :class:`TuningKey` says what was tuned, as structured fields: the backend (``"cudnn_graph"``,
``"cudnn"``, ``"onednn"``), the direction (``"forward"``, ``"backward_data"``,
``"backward_weights"``; ``"backward_filter"`` is accepted as cuDNN's name for the last), the
problem (the :class:`~rawconv.problem.ConvProblem` fields, without ``name``, the device index
dropped), a fused activation, the options and filters in force (precision, workspace limit,
determinism, note filters...: whatever the backend's autotune takes), the library and its exact
version (``"cuDNN"``, ``"9.19.0"``) and the device (GPU name and compute capability
``"sm_90"``, or ``"cpu"`` and oneDNN's effective ISA).

A :class:`TuningRecord` is a key plus the choice: its stable candidate name (the name the
backend's ``select``/``choice=`` takes: ``"eng72{k17=1,k24=4}"``, ``"nhwc:eng72{k17=1}"``, a
legacy cuDNN ``"IMPLICIT_PRECOMP_GEMM math=fma"``, a oneDNN ``"brgconv:avx512_core@nhwc"``), a
backend-specific ``detail`` dict, its times and error against float64, when and by which rawconv it
was made. Records are JSON with a versioned schema (``"schema": 1``), saved and loaded one at a
time or as lists (:meth:`TuningRecord.save`, :meth:`TuningRecord.load`), and can say whether the
library or device they were made on differ from the current ones
(:meth:`TuningRecord.check_environment`).

A :class:`TuningCache` holds records by key, thread-safely: :meth:`~TuningCache.get`,
:meth:`~TuningCache.put`, :meth:`~TuningCache.seeds` (the winners of other problems, to seed a
search), :meth:`~TuningCache.save` / :meth:`~TuningCache.load`. The process-wide one is
:func:`cache`; it lives in memory only unless a file is configured with
``$RAWCONV_TUNING_CACHE`` (``$RAWCONV_CUDNN_TUNING_CACHE``, the older name, is read too) or
:func:`set_cache_file`: then it is loaded from that file on first use and written back after
each :meth:`~TuningCache.put` (merged with what other processes wrote there, under a file lock,
and replaced atomically; a location that cannot be used leaves the cache in memory, with one
warning). Every number of a record is checked when it is made or read (:data:`MAX_THREADS`...).

Nothing here is backend-specific: a backend builds its keys and records (and registers how to
read its current library version and device with :func:`register_environment`). Cache hits,
misses, loads and saves are logged at debug level on the ``rawconv.tuning`` logger.

File formats (JSON): a record is an object with ``"schema": 1``; a cache file is
``{"format": "rawconv-tuning-cache", "version": 1, "records": [record, ...]}``. Files of the
previous format (``{"rawconv_cudnn_graph_tuning": 1, "entries": {...}}``, keyed by ``|``-joined
strings) are refused with a message saying so: their keys do not hold the problem's fields or
the GPU's compute capability, so they cannot be converted faithfully.

The code lives in three parts, this module hands their names on: :mod:`rawconv.core.tuning_record`
(keys, records, environments, :func:`replay`), :mod:`rawconv.core.tuning_files` (reading and writing
the files, their limits and lock) and :mod:`rawconv.core.tuning_cache` (the caches). A limit set
here (``rawconv.tuning.LOCK_TIMEOUT_S = 5``) is set in the part that reads it.
"""
from __future__ import annotations

from .backend import BUILTIN as BACKENDS, DIRECTIONS, canonical_direction  # noqa: F401
from .face import route_settings as _route_settings
from . import tuning_files as _files, tuning_record as _record
from .tuning_files import LOCK_TIMEOUT_S, MAX_DEPTH, MAX_FILE_BYTES, _unusable  # noqa: F401
from .tuning_record import (CACHE_FORMAT, CACHE_VERSION, MAX_THREADS, SCHEMA, TuningEnvironmentError,  # noqa: F401
                            TuningKey, TuningRecord, _env_probes, current_environment, json_form,
                            register_environment, replay)
from .tuning_cache import (ENV_FILE, ENV_FILE_ALIASES, TuningCache, _cache, cache, cache_file,  # noqa: F401
                           set_cache_file)

__all__ = ["SCHEMA", "CACHE_FORMAT", "CACHE_VERSION", "ENV_FILE", "ENV_FILE_ALIASES", "BACKENDS", "DIRECTIONS",
           "TuningKey", "TuningRecord", "TuningCache", "TuningEnvironmentError", "canonical_direction",
           "cache", "cache_file", "set_cache_file", "register_environment", "current_environment", "replay",
           "MAX_THREADS", "MAX_FILE_BYTES", "MAX_DEPTH"]

# the limits users may set on this module are read by the parts at run time
_route_settings(__name__, {"MAX_THREADS": _record, "MAX_FILE_BYTES": _files, "MAX_DEPTH": _files,
                          "LOCK_TIMEOUT_S": _files})
