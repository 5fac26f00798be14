"""rawconv.tuning without any library: structured keys, versioned JSON records, the thread-safe
cache, its file (environment variables, set_cache_file) and the errors for missing, malformed and
old-format files."""
from __future__ import annotations

import json
import logging
import threading
import warnings

import pytest

from rawconv import ConvProblem, tuning
from rawconv.errors import ArgumentError, ArgumentTypeError
from rawconv.problem import ErrorStats
from rawconv.tuning import TuningCache, TuningKey, TuningRecord

ENV = {"library": "cuDNN", "library_version": "9.19.0", "device": "NVIDIA H200", "device_arch": "sm_90"}


@pytest.fixture(autouse=True)
def isolated(monkeypatch):
    """No cache file from the environment; the process's cache empty, in memory, before and after."""
    for name in (tuning.ENV_FILE, *tuning.ENV_FILE_ALIASES):
        monkeypatch.delenv(name, raising=False)
    tuning.set_cache_file(None)
    tuning._cache.path = None
    tuning._cache.clear()
    yield
    tuning.set_cache_file(None)
    tuning._cache.path = None
    tuning._cache.clear()


def P(**kw) -> ConvProblem:
    base = dict(n=32, c=64, k=64, in_spatial=(56, 56), kernel=(3, 3), pad_before=(1, 1), pad_after=(1, 1),
                dtype="float16", layout="nhwc", device="cuda:0")
    base.update(kw)
    return ConvProblem(**base)


def key(problem=None, direction="forward", backend="cudnn_graph", **kw) -> TuningKey:
    env = dict(ENV, **{k: kw.pop(k) for k in list(kw) if k in ENV})
    return TuningKey(backend, direction, problem or P(), kw.pop("activation", None),
                     kw.pop("options", {"allow_tf32": False, "workspace_limit": None}), **env)


def record(k=None, choice="eng72{k17=1,k24=4}", **kw) -> TuningRecord:
    kw.setdefault("detail", {"engine": 72, "knobs": [[17, 1], [24, 4]]})
    return TuningRecord(k or key(), choice, **kw)


# ---------------------------------------------------------------- keys
def test_keys_are_structured_canonical_and_hashable():
    k = key()
    assert k.problem["in_spatial"] == (56, 56) and k.problem["device"] == "cuda" and "name" not in k.problem
    assert k.ndim == 2 and k.dtype == "float16" and k.layout == "nhwc"
    # the device index and the problem's name are not part of the question
    assert key(P(device="cuda:3", name="layer1.0.conv2")) == k
    assert hash(key(P(device="cuda:3"))) == hash(k)
    # a dict of the fields is the same key; lists and tuples alike
    fields = {f: getattr(P(), f) for f in ("n", "c", "k", "kernel", "stride", "dilation", "pad_before",
                                            "pad_after", "groups", "dtype", "layout", "device", "has_bias",
                                            "unbatched")}
    fields["in_spatial"] = [56, 56]
    assert key(fields) == k
    assert key(P(n=16)) != k and key(activation="relu") != k and key(library_version="9.20.0") != k
    assert key(options={"allow_tf32": True, "workspace_limit": None}) != k
    swapped = key(options={"workspace_limit": None, "allow_tf32": False})
    assert swapped == k and hash(swapped) == hash(k), "the order of the options does not matter"
    assert k.conv_problem() == P(device="cuda")
    assert {k: 1}[key()] == 1


def test_direction_names():
    assert key(direction="backward_filter").direction == "backward_weights"
    assert key(direction="backward_filter") == key(direction="backward_weights")
    assert tuning.canonical_direction("backward_data") == "backward_data"
    with pytest.raises(ArgumentError, match="direction"):
        key(direction="sideways")
    with pytest.raises(ArgumentTypeError):
        tuning.canonical_direction(3)


@pytest.mark.parametrize("bad,exc", [
    (dict(backend="mkl"), ArgumentError),
    (dict(options={"limit": object()}), ArgumentTypeError),
    (dict(options={1: 2}), ArgumentTypeError),
    (dict(activation=3), ArgumentTypeError),
    (dict(device=None), ArgumentTypeError),
])
def test_bad_key_fields_rejected(bad, exc):
    with pytest.raises(exc):
        key(**bad)
    with pytest.raises(ArgumentTypeError):
        TuningKey("cudnn", "forward", "not a problem")


# ---------------------------------------------------------------- records
def test_record_json_roundtrip_and_schema():
    r = record(median_ms=0.0123, min_ms=0.0119, error=ErrorStats(1e-3, 2e-4, 0.31, 0), layout="")
    assert r.schema == 1 and r.layout == "nhwc" and r.created and r.rawconv_version
    assert r.error == {"max_abs": 1e-3, "max_rel": 2e-4, "ratio": 0.31}
    d = json.loads(r.to_json())
    assert d["schema"] == 1 and d["backend"] == "cudnn_graph" and d["direction"] == "forward"
    assert d["problem"]["in_spatial"] == [56, 56] and "name" not in d["problem"]
    assert d["choice"] == "eng72{k17=1,k24=4}" and d["detail"]["knobs"] == [[17, 1], [24, 4]]
    assert (d["library"], d["library_version"], d["device"], d["device_arch"]) == tuple(ENV.values())
    back = TuningRecord.from_json(r.to_json())
    assert back == r and back.key == r.key and back.created_ts == r.created_ts
    assert TuningRecord.from_dict(r.to_dict()) == r
    with pytest.raises(ArgumentError, match="schema 2"):
        TuningRecord.from_dict(dict(d, schema=2))
    with pytest.raises(ArgumentError, match="choice"):
        TuningRecord.from_dict({k: v for k, v in d.items() if k != "choice"})
    with pytest.raises(ArgumentError, match="not a JSON"):
        TuningRecord.from_json("{schema: 1")
    with pytest.raises(ArgumentError, match="median_ms"):
        TuningRecord.from_dict(dict(d, median_ms="fast"))
    with pytest.raises(ArgumentError, match="created"):
        record(created="yesterday")


def test_record_files_one_or_a_list(tmp_path):
    a, b = record(), record(key(P(n=8)), "eng1")
    a.save(tmp_path / "a.json")
    assert TuningRecord.load(tmp_path / "a.json") == a
    TuningRecord.save_all([a, b], tmp_path / "ab.json")
    assert TuningRecord.load(str(tmp_path / "ab.json")) == [a, b]
    cache = TuningCache()
    cache.put(a)
    cache.save(tmp_path / "cache.json")
    assert TuningRecord.load(tmp_path / "cache.json") == [a]


def test_check_environment_says_what_differs():
    r = record()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert r.check_environment(current=ENV) == []
    other = dict(ENV, library_version="9.24.0", device="NVIDIA H100")
    with pytest.warns(RuntimeWarning, match=r"library_version: recorded '9\.19\.0', current '9\.24\.0'"):
        diff = r.check_environment(current=other)
    assert diff == [("library_version", "9.19.0", "9.24.0"), ("device", "NVIDIA H200", "NVIDIA H100")]
    with pytest.raises(tuning.TuningEnvironmentError, match="device: recorded 'NVIDIA H200'") as ei:
        r.check_environment(strict=True, current=other)
    assert isinstance(ei.value, ArgumentError) and ei.value.differences == diff


def test_check_environment_asks_the_backend(monkeypatch):
    monkeypatch.setitem(tuning._env_probes, "onednn", lambda: {"library": "oneDNN", "library_version": "3.2.0",
                                                                "device": "cpu", "device_arch": "avx2"})
    r = record(key(backend="onednn", library="oneDNN", library_version="3.2.0", device="cpu", device_arch="avx2"),
               "brgconv:avx2@nhwc", detail={"impl": "brgconv:avx2"})
    assert r.check_environment(strict=True) == []
    with pytest.raises(ArgumentError):
        tuning.register_environment("mkl", lambda: {})


# ---------------------------------------------------------------- files: errors name the path
def test_missing_and_malformed_files_raise_argument_errors_naming_the_path(tmp_path):
    missing = tmp_path / "nope.json"
    for load in (TuningRecord.load, TuningCache().load):
        with pytest.raises(ArgumentError, match="nope.json.*does not exist") as ei:
            load(missing)
        assert not isinstance(ei.value, OSError)
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "rawconv-tuning-cache", "version": 1, "records": [')
    for load in (TuningRecord.load, TuningCache().load):
        with pytest.raises(ArgumentError, match="bad.json.*not valid JSON") as ei:
            load(bad)
        assert not isinstance(ei.value, json.JSONDecodeError)
    cases = {
        "other.json": ({"something": 1}, "not a rawconv tuning file"),
        "v2.json": ({"format": "rawconv-tuning-cache", "version": 2, "records": []}, "version 2"),
        "recs.json": ({"format": "rawconv-tuning-cache", "version": 1, "records": {}}, "must be a list"),
        "rec.json": ({"format": "rawconv-tuning-cache", "version": 1, "records": [{"schema": 1}]}, "record 0"),
    }
    cache = TuningCache()
    cache.put(record())
    for name, (data, msg) in cases.items():
        (tmp_path / name).write_text(json.dumps(data))
        with pytest.raises(ArgumentError, match=msg) as ei:
            cache.load(tmp_path / name)
        assert name in str(ei.value)
    assert len(cache) == 1, "a failed load leaves the cache as it was"


def test_old_format_files_are_refused_saying_so(tmp_path):
    """The previous format keyed entries by '|'-joined strings that hold neither the problem's
    fields nor the compute capability: rawconv says so rather than guess a conversion."""
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"rawconv_cudnn_graph_tuning": 1, "entries": {
        "forward 2d float16 nhwc x(32,64,56,56) w(64,64,3,3) p1|tf32=False|ws=None|deterministic_only=False"
        "|cudnn 9.19.0|NVIDIA H200": {"engine": "eng72{k17=1,k24=4}", "median_ms": 0.1, "t": 1.0}}}))
    cache = TuningCache()
    with pytest.raises(ArgumentError, match=r"old.json is a tuning cache of rawconv's old format .*1 entries") as ei:
        cache.load(old)
    assert "delete" in str(ei.value) and len(cache) == 0
    with pytest.raises(ArgumentError, match="old format"):
        TuningRecord.load(old)
    # configured as the process's cache file: refused, and not overwritten by the next put
    tuning.set_cache_file(old)
    with pytest.raises(ArgumentError, match="old format"):
        tuning.cache()
    before = old.read_text()
    tuning.set_cache_file("")
    tuning.cache().put(record())
    assert old.read_text() == before


# ---------------------------------------------------------------- the cache
def test_cache_get_put_records_and_file_format(tmp_path, caplog):
    cache = TuningCache()
    k = key()
    with caplog.at_level(logging.DEBUG, logger="rawconv.tuning"):
        assert cache.get(k) is None
        cache.put(record(k, "eng1"))
        cache.put(record(key(P(n=8)), "eng2"))
        cache.put(record(k, "eng3"))  # replaces, and becomes the newest
        assert cache.get(k).choice == "eng3"
        cache.save(tmp_path / "c.json")
        fresh = TuningCache()
        assert fresh.load(tmp_path / "c.json") == 2
    assert [r.choice for r in cache.records()] == ["eng2", "eng3"]
    assert fresh.records() == cache.records()
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["format"] == "rawconv-tuning-cache" and data["version"] == 1 and len(data["records"]) == 2
    lines = (tmp_path / "c.json").read_text().splitlines()
    assert len(lines) == 4 + 2 + 2, "the header fields, then one record per line"
    assert [json.loads(line.strip().rstrip(",")) for line in lines[4:6]] == data["records"]
    assert list(data["records"][0]["problem"])[:3] == ["n", "c", "k"], "ConvProblem's field order"
    msgs = caplog.messages
    assert msgs[0].startswith("miss cudnn_graph forward 2d float16 nhwc")
    assert any(m.startswith("hit cudnn_graph forward") and m.endswith("eng3") for m in msgs)
    assert any(m.startswith("saved 2 records to") for m in msgs) and any(m.startswith("loaded 2 records") for m in msgs)
    # merge=False replaces
    other = TuningCache()
    other.put(record(key(P(n=4)), "eng9"))
    other.load(tmp_path / "c.json", merge=False)
    assert [r.choice for r in other.records()] == ["eng2", "eng3"]
    with pytest.raises(ArgumentTypeError):
        cache.get("forward 2d ...")
    with pytest.raises(ArgumentTypeError):
        cache.put({"engine": "eng1"})
    with pytest.raises(ArgumentError, match="path"):
        cache.save()


def test_cache_is_thread_safe_and_writes_its_file_after_each_put(tmp_path):
    path = tmp_path / "t.json"
    cache = TuningCache(path)
    n_threads, per = 8, 25

    def work(i):
        for j in range(per):
            cache.put(record(key(P(n=1 + i * per + j)), f"eng{j}"))
            assert cache.get(key(P(n=1 + i * per + j))) is not None

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(cache) == n_threads * per
    assert TuningRecord.load(path) == cache.records()


def test_seeds_stay_within_backend_direction_library_and_device():
    cache = TuningCache()
    own = key()
    cache.put(record(key(P(n=8), backend="onednn", library="oneDNN", library_version="3.2.0"), "brgconv:avx2"))
    cache.put(record(key(P(n=8), direction="backward_data"), "eng1"))
    cache.put(record(key(P(n=8), device_arch="sm_80"), "eng2"))
    cache.put(record(key(P(n=8), options={"allow_tf32": True}), "eng3"))  # options may differ
    cache.put(record(own, "eng4"))  # the key itself is no seed
    assert [r.choice for r in cache.seeds(own)] == ["eng3"]


# ---------------------------------------------------------------- the process's cache and its file
def test_process_cache_file_from_environment_alias_and_set_cache_file(tmp_path, monkeypatch):
    from rawconv import cudnn_graph as G

    assert tuning.cache_file() is None and tuning.cache().path is None
    monkeypatch.setenv(G.ENV_TUNING_FILE, str(tmp_path / "alias.json"))  # the older name
    assert G.ENV_TUNING_FILE == "RAWCONV_CUDNN_TUNING_CACHE"
    assert tuning.cache_file() == str(tmp_path / "alias.json")
    monkeypatch.setenv(tuning.ENV_FILE, str(tmp_path / "new.json"))  # the new name wins
    assert tuning.cache_file() == str(tmp_path / "new.json")
    tuning.set_cache_file(tmp_path / "set.json")  # set_cache_file wins over both
    assert tuning.cache_file() == str(tmp_path / "set.json")
    # a missing file: created by the first put
    tuning.cache().put(record())
    assert TuningRecord.load(tmp_path / "set.json") == [record().with_(created=tuning.cache().records()[0].created)]
    # switching to an existing file loads it into the cache
    other = TuningCache(tmp_path / "other.json")
    other.put(record(key(P(n=2)), "eng5"))
    tuning.set_cache_file(tmp_path / "other.json")
    assert {r.choice for r in tuning.cache().records()} == {"eng72{k17=1,k24=4}", "eng5"}
    # "": in memory only, whatever the environment says
    tuning.set_cache_file("")
    assert tuning.cache_file() is None
    tuning.cache().put(record(key(P(n=3)), "eng6"))
    assert not (tmp_path / "new.json").exists()
    assert len(TuningRecord.load(tmp_path / "other.json")) == 1, "no put since it was loaded: not rewritten"
    with pytest.raises(ArgumentTypeError):
        tuning.set_cache_file(3)


def test_cudnn_graph_wrappers_use_the_structured_cache(tmp_path):
    from rawconv import cudnn_graph as G

    G.clear_tuning_cache()
    r = record(median_ms=0.5)
    tuning.cache().put(r)
    tuning.cache().put(record(key(backend="onednn"), "brgconv:avx2", detail={}))
    snap = G.tuning_cache()
    assert list(snap) == [r.key], "the graph's records only"
    assert snap[r.key]["engine"] == r.choice and snap[r.key]["median_ms"] == 0.5 and snap[r.key]["record"] == r
    G.save_tuning_cache(str(tmp_path / "g.json"))
    G.clear_tuning_cache()
    assert G.tuning_cache() == {} and len(tuning.cache()) == 0
    assert G.load_tuning_cache(str(tmp_path / "g.json")) == 2
    with pytest.raises(ArgumentError, match="does not exist"):
        G.load_tuning_cache(str(tmp_path / "none.json"))
