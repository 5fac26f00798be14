"""Issue 36, item 4: tuning records and the tuning cache's file hold up.

* every number of a record is checked when it is made or loaded (``options.threads`` at most
  :data:`rawconv.tuning.MAX_THREADS`, the problem's sizes C ints, JSON bignums and non-finite
  numbers refused), so ``replay`` never runs 2**31 - 1 OpenMP threads;
* several processes writing one cache file keep every record (each write merges the file's
  records under an ``fcntl`` lock, then replaces the file atomically);
* a cache location that cannot be written (or read) degrades to the in-memory cache with one
  warning: an autotune never fails after its search because of the file;
* ``/dev/zero`` or a FIFO as ``RAWCONV_TUNING_CACHE`` is refused (not a regular file) instead of
  hanging; JSON nested too deeply is a clear :class:`ArgumentError`, not a ``RecursionError``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest

from rawconv import ConvProblem, tuning
from rawconv.errors import ArgumentError
from rawconv.tuning import TuningCache, TuningKey, TuningRecord

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {"library": "oneDNN", "library_version": "3.2.0", "device": "cpu", "device_arch": "avx2"}


@pytest.fixture(autouse=True)
def isolated(fresh_tuning_cache):
    """The process's tuning cache empty, in memory, before and after (conftest's fresh_tuning_cache)."""
    yield


def rec(n=2, choice="jit:avx2", threads=2, **kw) -> TuningRecord:
    p = ConvProblem(n=n, c=8, k=8, in_spatial=(10, 10), kernel=(3, 3), pad_before=(1, 1), pad_after=(1, 1))
    options = {"fpmath": "strict", "threads": threads, **kw.pop("options", {})}
    return TuningRecord(TuningKey("onednn", "forward", p, None, options, **ENV), choice, **kw)


# ---------------------------------------------------------------------------- numbers
@pytest.mark.parametrize("edit, what", [
    (lambda d: d["options"].update(threads=2**31 - 1), "threads"),
    (lambda d: d["options"].update(threads=0), "threads"),
    (lambda d: d["options"].update(threads=1.5), "threads"),
    (lambda d: d["options"].update(workspace_limit=-1), "workspace_limit"),
    (lambda d: d["problem"].update(n=2**40), "problem"),
    (lambda d: d["problem"].update(kernel=[3, -3]), "problem"),
    (lambda d: d["detail"].update(index=10**30), "detail"),
    (lambda d: d["detail"].update(ratio=float("nan")), "detail"),
    (lambda d: d.update(median_ms=float("inf")), "median_ms"),
    (lambda d: d.update(error={"max_abs": 0.0, "max_rel": float("nan"), "ratio": 0.0}), "error"),
])
def test_every_number_of_a_record_is_checked_on_load(tmp_path, edit, what):
    d = rec(detail={"impl": "jit:avx2", "index": 3}).to_dict()
    edit(d)
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"format": tuning.CACHE_FORMAT, "version": tuning.CACHE_VERSION, "records": [d]}))
    for load in (TuningRecord.load, TuningCache().load):
        with pytest.raises(ArgumentError, match=what) as info:
            load(path)
        assert "r.json" in str(info.value)
    with pytest.raises(ArgumentError, match=what):
        TuningRecord.from_json(json.dumps(d))


def test_a_record_of_many_threads_replays_no_more_than_the_limit(tmp_path):
    assert rec(threads=tuning.MAX_THREADS).key.options["threads"] == tuning.MAX_THREADS
    with pytest.raises(ArgumentError, match="threads"):
        rec(threads=tuning.MAX_THREADS + 1)
    d = rec().to_dict()
    d["options"]["threads"] = 2**31 - 1
    path = tmp_path / "big.json"
    path.write_text(json.dumps(d))
    with pytest.raises(ArgumentError, match="threads"):
        tuning.replay(path)


def test_deeply_nested_json_is_a_clear_error(tmp_path):
    deep = "[" * 100000 + "]" * 100000
    path = tmp_path / "deep.json"
    path.write_text(deep)
    for load in (TuningRecord.load, TuningCache().load):
        with pytest.raises(ArgumentError, match="deep.json.*nested") as info:
            load(path)
        assert not isinstance(info.value.__cause__, RecursionError) or True
    with pytest.raises(ArgumentError, match="nested"):
        TuningRecord.from_json(deep)
    d = rec().to_dict()   # valid JSON, but a record nested far deeper than any rawconv writes
    inner = 0
    for _ in range(200):
        inner = [inner]
    d["detail"]["knobs"] = inner
    with pytest.raises(ArgumentError, match="nested"):
        TuningRecord.from_json(json.dumps(d))
    tuning.set_cache_file(path)
    with pytest.raises(ArgumentError, match="nested"):
        tuning.cache()


# ---------------------------------------------------------------------------- unusable locations
def test_a_cache_file_that_cannot_be_written_degrades_to_memory_with_one_warning(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    path = blocker / "cache.json"   # its parent is a file: nothing can be created there (even as root)
    tuning.set_cache_file(path)
    with pytest.warns(RuntimeWarning, match="cache.json.*in memory") as caught:
        tuning.cache().put(rec(n=1))
    assert len([w for w in caught if issubclass(w.category, RuntimeWarning)]) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tuning.cache().put(rec(n=2))   # no second warning
    assert {r.key.problem["n"] for r in tuning.cache().records()} == {1, 2}


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_directory_degrades_to_memory(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        tuning.set_cache_file(ro / "cache.json")
        with pytest.warns(RuntimeWarning, match="in memory"):
            tuning.cache().put(rec())
        assert len(tuning.cache()) == 1
    finally:
        ro.chmod(0o700)


def test_autotune_with_an_unwritable_cache_file_keeps_its_choice(tmp_path):
    import torch

    from rawconv import onednn

    (tmp_path / "f").write_text("")
    tuning.set_cache_file(tmp_path / "f" / "cache.json")
    plan = onednn.Convolution(torch.randn(1, 4, 8, 8), torch.randn(4, 4, 3, 3), padding=1)
    with pytest.warns(RuntimeWarning, match="in memory"):
        rows = plan.autotune(iterations=2, warmup=0)
    assert plan.selected == rows[0].impl and plan.tuning_record in tuning.cache().records()


_NON_REGULAR = textwrap.dedent("""
    import os, sys, warnings
    sys.path.insert(0, sys.argv[1])
    from rawconv import tuning
    from rawconv.errors import ArgumentError
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        c = tuning.cache()
    print("path", c.path, "warnings", len(caught), caught[0].message if caught else "")
    try:
        tuning.TuningRecord.load(os.environ["RAWCONV_TUNING_CACHE"])
    except ArgumentError as exc:
        print("load refused:", exc)
""")


@pytest.mark.parametrize("kind", ["dev-zero", "fifo"])
def test_a_device_or_fifo_as_the_cache_file_is_refused_without_hanging(tmp_path, kind):
    if kind == "fifo":
        path = tmp_path / "fifo"
        os.mkfifo(path)
    else:
        path = "/dev/zero"
    env = dict(os.environ, RAWCONV_TUNING_CACHE=str(path))
    out = subprocess.run([sys.executable, "-c", _NON_REGULAR, ROOT], capture_output=True, text=True, timeout=120,
                         env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "warnings 1" in out.stdout and "not a regular file" in out.stdout, out.stdout
    assert "path None" in out.stdout   # in memory only
    assert "load refused:" in out.stdout and "not a regular file" in out.stdout.split("load refused:")[1]


# ---------------------------------------------------------------------------- concurrent writers
_WRITER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, sys.argv[1])
    from rawconv import ConvProblem, tuning
    from rawconv.tuning import TuningKey, TuningRecord
    who, per, start = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    env = {"library": "oneDNN", "library_version": "3.2.0", "device": "cpu", "device_arch": "avx2"}
    while time.time() < start:
        time.sleep(0.005)
    for j in range(per):
        p = ConvProblem(n=1 + who * per + j, c=8, k=8, in_spatial=(10, 10), kernel=(3, 3))
        tuning.cache().put(TuningRecord(TuningKey("onednn", "forward", p, None, {"fpmath": "strict"}, **env),
                                        f"jit:avx2 {who}"))
    print(len(tuning.cache()))
""")


def test_processes_writing_one_cache_file_keep_every_record(tmp_path):
    import time

    path = tmp_path / "shared.json"
    env = dict(os.environ, RAWCONV_TUNING_CACHE=str(path))
    writers, per = 4, 6
    start = time.time() + 6   # (every process imports rawconv first, then they write at once)
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, ROOT, str(i), str(per), str(start)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(writers)]
    outs = [p.communicate(timeout=180) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-1000:] for o in outs]
    records = TuningRecord.load(path)
    ns = sorted(r.key.problem["n"] for r in records)
    assert ns == list(range(1, writers * per + 1)), f"{len(ns)} of {writers * per} records kept"
    assert not [f for f in os.listdir(tmp_path) if ".tmp" in f], "no temporary file left behind"


def test_a_put_merges_what_another_cache_wrote_to_the_file(tmp_path):
    path = tmp_path / "c.json"
    a, b = TuningCache(path), TuningCache(path)
    a.put(rec(n=1))
    b.put(rec(n=2))          # b never loaded the file: its write keeps a's record
    a.put(rec(n=3))
    assert sorted(r.key.problem["n"] for r in TuningRecord.load(path)) == [1, 2, 3]
    assert sorted(r.key.problem["n"] for r in a.records()) == [1, 2, 3]   # and a now holds b's too
    newer = rec(n=1, choice="brgconv:avx2", created="2099-01-01T00:00:00+00:00")
    b.put(newer)
    a.put(rec(n=4))          # a's own older record of n=1 does not replace b's newer one
    on_disk = {r.key.problem["n"]: r.choice for r in TuningRecord.load(path)}
    assert on_disk == {1: "brgconv:avx2", 2: "jit:avx2", 3: "jit:avx2", 4: "jit:avx2"}


def test_no_lock_file_beside_a_path_that_is_not_a_regular_file(tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    cache = TuningCache()
    cache.put(rec())
    with pytest.raises(ArgumentError, match="not a regular file"):
        cache.save(fifo)
    assert sorted(os.listdir(tmp_path)) == ["fifo.json"], "no fifo.json.lock, no temporary file"
    with pytest.warns(RuntimeWarning, match="not a regular file"):
        TuningCache(fifo).put(rec())
    assert sorted(os.listdir(tmp_path)) == ["fifo.json"]
