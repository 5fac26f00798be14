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
from rawconv.errors import ArgumentError, ArgumentTypeError, NotSupportedError
from rawconv.problem import ErrorStats
from rawconv.tuning import TuningCache, TuningKey, TuningRecord

ENV = {"library": "cuDNN", "library_version": "9.19.0", "device": "NVIDIA H200", "device_arch": "sm_90"}


@pytest.fixture(autouse=True)
def isolated(fresh_tuning_cache):
    """The process's tuning cache empty, in memory, before and after (conftest's fresh_tuning_cache)."""
    yield


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


# ---------------------------------------------------------------- records of every backend's autotune
import torch  # noqa: E402

from rawconv import onednn  # noqa: E402


def _cpu_problem(**kw) -> ConvProblem:
    base = dict(n=1, c=8, k=8, in_spatial=(8, 8), kernel=(3, 3), pad_before=(1, 1), pad_after=(1, 1), name="tiny")
    base.update(kw)
    return ConvProblem(**base)


def test_record_label_roundtrip_and_older_records_without_one():
    r = record(label="layer1.0.conv2")
    d = json.loads(r.to_json())
    assert d["label"] == "layer1.0.conv2" and TuningRecord.from_dict(d).label == "layer1.0.conv2"
    old = {k: v for k, v in d.items() if k != "label"}
    assert TuningRecord.from_dict(old).label == "" and TuningRecord.from_dict(old) == r   # not part of equality
    assert "TuningKey(" not in repr(r) and repr(r).startswith("<TuningRecord layer1.0.conv2: cudnn_graph forward")
    assert "eng72{k17=1,k24=4}" in r._repr_html_() and "<table" in r._repr_html_()
    with pytest.raises(ArgumentTypeError):
        record(label=3)


def test_onednn_autotune_makes_a_record_with_its_environment():
    info = onednn.info()
    conv = onednn.Convolution.from_problem(_cpu_problem())
    table = conv.autotune(iterations=2, warmup=0)
    rec = conv.tuning_record
    assert rec is table.record and rec.choice == table[0].choice == conv.selected.choice
    k = rec.key
    assert (k.backend, k.direction, k.library, k.library_version) == ("onednn", "forward", "oneDNN", info["version"])
    assert k.device_arch == info["cpu_isa"] and k.device
    # a problem this small runs on one thread (threads="auto"); the key records the plan's count
    assert k.options == {"fpmath": "strict", "algorithm": "direct", "weights_layout": "nchw",
                         "threads": torch.get_num_threads() if conv.threads is None else conv.threads}
    assert k.conv_problem() == _cpu_problem(name="")
    # the pick's time as fresh rounds measured it (picked on other rounds: no winner's curse)
    assert rec.median_ms == pytest.approx(table[0].extra["confirmed"]["median_ms"]) and rec.label == "tiny"
    assert table[0].extra["rounds"]["rounds"] == 2 and table[0].extra["confirmed"]["rounds"]["rounds"] == 3
    # the error is the one measured against float64, within tolerance
    assert rec.error["max_rel"] == pytest.approx(table[0].accuracy.max_rel) and 0 <= rec.error["ratio"] <= 1
    assert rec.detail["impl"] == conv.selected.name and rec.detail["layouts"] == conv.selected.layouts
    assert tuning.cache().get(k) == rec
    assert TuningRecord.from_json(rec.to_json()) == rec


def test_onednn_autotune_marks_wrong_results_and_never_selects_them(monkeypatch):
    conv = onednn.Convolution.from_problem(_cpu_problem())
    victim = conv.implementations[0].choice
    real = onednn.Convolution.execute

    def corrupted(self, *a, **kw):
        y = real(self, *a, **kw)
        return y * 1.01 if self.selected.choice == victim else y

    monkeypatch.setattr(onednn.Convolution, "execute", corrupted)
    table = conv.autotune(iterations=2, warmup=0)
    bad = next(r for r in table if r.choice == victim)
    assert bad.status == "wrong" and bad.accuracy.ratio > 1 and bad.max_rel > 5e-3 and bad.median_ms > 0
    assert conv.selected.choice != victim and table[0].ok and table.best().choice != victim
    assert [r.group for r in table].index("wrong") > 0
    assert "rgba(229,72,77" in table._repr_html_()


def test_cache_file_makes_the_second_autotune_a_lookup(tmp_path):
    path = tmp_path / "tuning.json"
    tuning.set_cache_file(str(path))
    first = onednn.Convolution.from_problem(_cpu_problem()).autotune(iterations=2, warmup=0)
    assert len(first) > 1 and path.exists()
    on_disk = TuningRecord.load(path)
    assert [r.choice for r in on_disk] == [first[0].choice]
    # another process would read the file: here, a cleared cache reloads it
    tuning._cache.clear()
    tuning._cache.path = None
    conv = onednn.Convolution.from_problem(_cpu_problem())
    hit = conv.autotune(iterations=2, warmup=0)
    assert len(hit) == 1 and hit[0].phase == "cache" and hit[0].choice == first[0].choice
    assert conv.selected.choice == first[0].choice and conv.tuning_record == on_disk[0]
    assert hit[0].max_rel == pytest.approx(on_disk[0].error["max_rel"])
    # use_cache=False searches again; another fpmath mode is another question
    assert len(onednn.Convolution.from_problem(_cpu_problem()).autotune(iterations=2, warmup=0,
                                                                          use_cache=False)) > 1
    assert len(onednn.Convolution.from_problem(_cpu_problem(), fpmath="any").autotune(iterations=2,
                                                                                        warmup=0)) > 1


def test_cache_hit_whose_choice_is_not_offered_searches():
    conv = onednn.Convolution.from_problem(_cpu_problem())
    k = conv._tuning_key(False)
    tuning.cache().put(TuningRecord(k, "winograd:avx9@any", {}))
    table = conv.autotune(iterations=2, warmup=0, use_cache=True)
    assert len(table) > 1 and table[0].phase != "cache"
    assert tuning.cache().get(k).choice == table[0].choice     # the stale record is replaced


def test_replay_selects_exactly_the_recorded_choice(tmp_path):
    p = _cpu_problem()
    impls = onednn.Convolution.from_problem(p).implementations
    # not oneDNN's first choice, so that a plan that ignored the record would differ
    chosen = next(i for i in reversed(impls) if not i.name.startswith("ref"))
    k = TuningKey.for_backend("onednn", p, "forward", onednn.key_options("strict"))
    rec = TuningRecord(k, chosen.choice, {"impl": chosen.name}, label="tiny")
    plan = rec.replay(strict=True)
    assert plan.selected.choice == chosen.choice and plan.direction == "forward"
    x, w, _ = p.make_inputs()
    ref = torch.nn.functional.conv2d(x.double(), w.double(), padding=1)
    assert torch.allclose(plan.execute(x, w).double(), ref, atol=1e-4)
    rec.save(tmp_path / "one.json")
    assert tuning.replay(str(tmp_path / "one.json")).selected.choice == chosen.choice
    TuningRecord.save_all([rec, rec.with_(choice=impls[0].choice)], tmp_path / "two.json")
    with pytest.raises(ArgumentError, match="holds 2 records"):
        tuning.replay(tmp_path / "two.json")
    with pytest.raises(ArgumentTypeError):
        tuning.replay(42)
    gone = rec.with_(choice="winograd:avx9@any")
    with pytest.raises(NotSupportedError, match="offered"):
        gone.replay()


def test_replay_warns_or_refuses_when_the_environment_differs():
    p = _cpu_problem()
    k = TuningKey.for_backend("onednn", p, "forward", onednn.key_options("strict"))
    elsewhere = TuningKey.from_dict(dict(k.to_dict(), library_version="3.1.0", device_arch="avx2_vnni"))
    rec = TuningRecord(elsewhere, "x64:gemm:jit@any", {})
    with pytest.raises(tuning.TuningEnvironmentError) as info:
        rec.replay(strict=True)
    fields = [d[0] for d in info.value.differences]
    assert fields == ["library_version", "device_arch"]
    assert "library_version: recorded '3.1.0'" in str(info.value) and "avx2_vnni" in str(info.value)
    with pytest.warns(RuntimeWarning, match="recorded '3.1.0', current"):
        plan = rec.replay()
    assert plan.selected.name == "x64:gemm:jit"


def test_compare_records_and_replay_drift(tmp_path):
    from rawconv import cli, compare

    problems = [_cpu_problem(name="a"), _cpu_problem(name="b", c=16, k=4, kernel=(1, 1), pad_before=(0, 0),
                                                   pad_after=(0, 0))]
    rows = compare.compare(problems, iterations=2, warmup=0, budget_s=0.02, include_ref=False, progress=False)
    recs = compare.records(rows, problems)
    assert [r.label for r in recs] == ["a", "b"]
    for r, p in zip(recs, problems):
        # the fastest row that reads its weights on every call, as rawconv.nn's modules do
        best = compare.best_rawconv([row for row in rows if row.problem == p.name], "per call")
        assert r.choice == best.choice and r.key.conv_problem() == p.with_(name="")
        # the confirmation rounds' time (the best was picked on other rounds)
        assert r.median_ms == pytest.approx(best.extra.get("confirmed", {}).get("median_ms", best.median_ms))
        assert r.error["max_rel"] == pytest.approx(best.max_rel)
        assert r.detail["weights"] in ("per call", "as given") and isinstance(r.timing["trustworthy"], bool)
    # (a record whose time was not to be trusted gets no drift: test_compare_trust.py; here the drift itself)
    recs = [r.with_(timing=None) for r in recs]
    again = compare.replay(recs, iterations=2, warmup=0, budget_s=0.02, progress=False)
    assert [r.status for r in again] == ["ok", "ok"] and [r.name for r in again] == [r.choice for r in recs]
    for r, rec in zip(again, recs):
        assert r.extra["drift"] == pytest.approx(r.median_ms / rec.median_ms - 1)
        assert r.extra["recorded_max_rel"] == rec.error["max_rel"] and r.accuracy.ok
    assert "drift" in again._repr_html_()
    # the command line: --record, then replay (and --strict with another environment)
    path = tmp_path / "recs.json"
    code = cli.main(["compare", "mb1ic8ih8oc8oh8kh3ph1", "--device", "cpu", "--iterations", "2", "--warmup", "0",
                     "--budget", "0.02", "--no-ref", "--quiet", "--record", str(path)])
    assert code == 0
    saved = TuningRecord.load(path)
    assert len(saved) == 1 and saved[0].key.backend == "onednn"
    assert cli.main(["replay", str(path), "--iterations", "2", "--warmup", "0", "--quiet"]) == 0
    TuningRecord.save_all([saved[0].with_(key=TuningKey.from_dict(dict(saved[0].key.to_dict(), device="elsewhere")))],
                          path)
    assert cli.main(["replay", str(path), "--strict", "--quiet", "--width", "200"]) == 2
    assert cli.main(["replay", str(path), "--iterations", "1", "--warmup", "0", "--quiet"]) == 0
    gone = saved[0].with_(choice="winograd:avx9@any")
    TuningRecord.save_all([gone], path)
    assert cli.main(["replay", str(path), "--quiet"]) == 4
    (tmp_path / "bad.json").write_text("{}")
    assert cli.main(["replay", str(tmp_path / "bad.json")]) == 2


def _replay_file(tmp_path):
    from rawconv import onednn

    p = _cpu_problem(name="tiny")
    conv = onednn.Convolution.from_problem(p)
    choice = conv.implementations[0].name
    k = TuningKey.for_backend("onednn", p, "forward", onednn.key_options("strict"))
    path = tmp_path / "r.json"
    TuningRecord(k, choice, {}, label="tiny", median_ms=0.01, min_ms=0.01).save(path)
    return path


@pytest.mark.parametrize("busy", [True, False])
def test_replay_monitors_the_machine_as_compare_does(tmp_path, capsys, monkeypatch, busy):
    """replay times as compare does (interleaved rounds), records what the machine did while it
    timed, flags a record whose calls all waited for a CPU (here a fake schedstat reader growing
    10 ms per read), warns as compare does, marks its summary UNRELIABLE and shows min beside
    median; a quiet machine gets no warning."""
    from rawconv import bench, cli, compare

    report = (bench.LoadReport(1.0, 2, 2, 1.2, 0.6, 3.0) if busy      # another process kept a CPU busy
              else bench.LoadReport(1.0, 2, 2, 0.05, 0.0, 0.2))
    monkeypatch.setattr(bench.LoadMonitor, "report", lambda self: report)
    ticks = iter(range(10 ** 6))
    monkeypatch.setattr(bench, "_self_wait_seconds", (lambda: 0.01 * next(ticks)) if busy else (lambda: 0.0))
    path = _replay_file(tmp_path)
    recs = TuningRecord.load(path)
    table = compare.replay(recs, iterations=1, warmup=0, budget_s=0.02, progress=False)
    assert [r.status for r in table] == ["ok"] and table[0].extra["machine"]["oversubscribed"] is busy
    assert table[0].extra["rounds"]["clean_calls"] == (0 if busy else table[0].extra["rounds"]["calls"])
    s = compare.replay_summary(table, hint="--threads {threads} or a quiet machine")
    assert s["timings_trustworthy"] is not busy and s["within_tolerance"] == 1
    assert s["geomean_drift"] == pytest.approx(table[0].median_ms / 0.01 - 1)
    assert cli.main(["replay", str(path), "--iterations", "1", "--warmup", "0", "--quiet", "--threads", "2",
                     "--width", "250"]) == 0
    out = capsys.readouterr().out
    summary = [line for line in out.splitlines() if line.startswith("summary:")]
    assert len(summary) == 1 and "1 within tolerance" in summary[0]
    assert "now min" in out
    if busy:
        assert "waited for a CPU: 1 of 1 timed results had no clean call" in out
        assert "(--threads 1 or a quiet machine)" in out and "busy before the start" in out
        assert "UNRELIABLE" in summary[0]
    else:
        assert "oversubscribed" not in out and "UNRELIABLE" not in out and "warning:" not in out


def test_replay_strict_message_names_the_difference(tmp_path, capsys):
    from rawconv import cli

    k = TuningKey.for_backend("onednn", _cpu_problem(), "forward", onednn.key_options("strict"))
    rec = TuningRecord(TuningKey.from_dict(dict(k.to_dict(), library_version="3.9.9")), "x64:gemm:jit@any", {},
                       label="tiny")
    rec.save(tmp_path / "r.json")
    assert cli.main(["replay", str(tmp_path / "r.json"), "--strict", "--width", "200"]) == 2
    out = capsys.readouterr().out
    assert "library_version: recorded '3.9.9'" in out and "tiny" in out


@pytest.mark.gpu
def test_cudnn_autotune_record_replays_the_same_algo_and_math():
    from rawconv import cudnn

    p = _cpu_problem(device="cuda")
    conv = cudnn.Convolution.from_problem(p)
    table = conv.autotune(iterations=3, warmup=1)
    rec = conv.tuning_record
    assert rec is table.record and rec.key.backend == "cudnn" and rec.key.library == "cuDNN"
    assert rec.key.device == torch.cuda.get_device_name() and rec.key.device_arch.startswith("sm_")
    assert rec.choice == f"{conv.info.algo}@{conv.info.math}" and rec.key.options["math"] == conv.info.math
    plan = rec.replay(strict=True)
    assert (plan.info.algo, plan.info.math) == (conv.info.algo, conv.info.math)
    again = compare_replay([rec])
    assert again[0].status == "ok"


def compare_replay(recs):
    from rawconv import compare

    return compare.replay(recs, iterations=3, warmup=1, progress=False)


@pytest.mark.gpu
def test_graph_autotune_record_replays():
    from rawconv import cudnn_graph

    p = _cpu_problem(device="cuda", layout="nhwc", dtype="float16")
    conv = cudnn_graph.GraphConvolution.from_problem(p)
    table = conv.autotune(budget_s=1.0, use_cache=False)
    rec = conv.tuning_record
    assert rec is table.record and rec.key.backend == "cudnn_graph" and rec.choice == table[0].name
    assert rec.replay(strict=True).selected_name == conv.selected_name
    assert compare_replay([rec])[0].status == "ok"


def test_fused_records_are_their_own_question_and_replay_fused():
    from rawconv import fused

    x, w, b = torch.randn(1, 4, 6, 6), torch.randn(4, 4, 3, 3), torch.randn(4)
    plan = fused.FusedConvolution(x, w, b, residual=True, activation="relu")
    plan.autotune(iterations=1, warmup=0)
    rec = plan.tuning_record
    assert rec.to_dict()["options"]["post_ops"] == [["sum", 1.0], ["eltwise", "relu", 0.0, 0.0]]
    plain = onednn.Convolution(x, w, b)._tuning_key(False)
    assert plain != rec.key                                      # not the plain convolution's record
    again = rec.replay(strict=True)
    assert isinstance(again, fused.FusedConvolution) and (again.residual, again.activation) == (True, "relu")
    r = torch.randn(1, 4, 4, 4)
    torch.testing.assert_close(again.run(x, w, b, r), torch.relu(torch.nn.functional.conv2d(x, w, b) + r),
                               rtol=1e-4, atol=1e-4)
