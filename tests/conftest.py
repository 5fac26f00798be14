"""Shared fixtures. Tests marked ``gpu`` skip where torch sees no CUDA device; tests that need a
oneDNN capability (bfloat16, float16, an fpmath mode) skip where oneDNN does not offer it, with the
reason :func:`rawconv.onednn.capabilities` gives (``requires_onednn``)."""
from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def load_cudnn_or_fail():
    """``rawconv.cudnn._ffi.load()`` for the tests of cuDNN's descriptor functions (they need no GPU). A
    CUDA build of torch brings libcudnn.so.9 (its nvidia-cudnn wheel): missing there, the test
    fails. A CPU build of torch (``torch.version.cuda`` None) brings none: the test skips, saying
    how to get it (``pip install 'rawconv[cuda12]'``)."""
    from rawconv.cudnn import _ffi as _cudnn

    try:
        return _cudnn.load()
    except Exception as exc:  # noqa: BLE001
        if torch.version.cuda is None:
            pytest.skip(f"a CPU build of torch ({torch.__version__}) brings no cuDNN; pip install 'rawconv[cuda12]' "
                        f"(nvidia-cudnn-cu12) for these tests: {str(exc).splitlines()[0]}")
        pytest.fail(f"libcudnn.so.9 is a dependency of these tests (torch's CUDA build brings it): {exc}")


@pytest.fixture(scope="session")
def dnnl():
    """The loaded oneDNN library. A missing libdnnl.so.3 fails the test: it is a dependency."""
    from rawconv.onednn import _ffi as _dnnl

    return _dnnl.load()


@pytest.fixture(scope="session")
def cudnn_lib():
    """The loaded cuDNN library (``rawconv.cudnn._ffi.load()``); skips the test when libcudnn.so.9 cannot be loaded."""
    from rawconv.cudnn import _ffi as _cudnn
    from rawconv.errors import LibraryNotFoundError

    try:
        return _cudnn.load()
    except LibraryNotFoundError as exc:
        pytest.skip(f"libcudnn.so.9 not available: {exc}")


def requires_onednn(direction: str, dtype="float32", fpmath: str = "strict", *, down_converts: bool = False,
                    caps=None):
    """Skip the calling test unless oneDNN offers a non-reference ``dtype`` ``direction``
    convolution with ``fpmath`` here (and, with ``down_converts``, unless that float32 fpmath
    mode really rounds inputs). The skip reason is :meth:`Capabilities.reason`'s line, e.g.
    "oneDNN 3.2.0 on avx2 offers no bfloat16 forward convolution (dnnl_unimplemented)".
    ``caps``: a Capabilities to ask instead of ``rawconv.onednn.capabilities()`` (tests of this helper)."""
    __tracebackhide__ = True   # the skip is reported at the calling test's line
    if caps is None:
        from rawconv import onednn

        caps = onednn.capabilities()
    if not caps.offered(direction, dtype, fpmath):
        pytest.skip(caps.reason(direction, dtype, fpmath))
    if down_converts and not caps.down_converts(direction, fpmath, dtype):
        pytest.skip(caps.reason(direction, dtype, fpmath))


@pytest.fixture(name="requires_onednn")
def requires_onednn_fixture():
    """:func:`requires_onednn` as a fixture: ``def test_x(requires_onednn): requires_onednn("forward", torch.bfloat16)``."""
    return requires_onednn


@pytest.fixture
def fresh_tuning_cache(monkeypatch):
    """The process's tuning cache empty and in memory (no file from the environment or
    ``set_cache_file``), before and after the test."""
    from rawconv import tuning

    for name in (tuning.ENV_FILE, *tuning.ENV_FILE_ALIASES):
        monkeypatch.delenv(name, raising=False)

    def reset():
        tuning.set_cache_file(None)
        tuning._cache.path = None
        tuning._cache.clear()
        tuning._unusable.clear()   # (files given up on by an earlier test)

    reset()
    yield
    reset()


def randomize_batchnorms(net, seed: int) -> None:
    """Running statistics and affine parameters of every BatchNorm2d of ``net`` drawn from a
    generator seeded with ``seed`` (a fold that ignored any of them would show)."""
    g = torch.Generator().manual_seed(seed)
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.copy_(torch.rand(m.num_features, generator=g) - 0.5)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.bias.data.copy_(torch.rand(m.num_features, generator=g) - 0.5)


def face_routing_tests(parts: dict, shared: dict | None = None):
    """The two tests of a split face's routed settings (``face._SETTINGS``: name -> the part that owns
    it), over ``parts`` ({face: its part modules' names}) and ``shared`` ({face: other modules that
    may read them}): a name set on the face is set in its owner, and no other part binds its own
    copy. Returns the two test functions, for a test module to bind at its top level."""
    import importlib

    shared = shared or {}
    routed = [(face, name) for face in parts for name in sorted(face._SETTINGS)]
    ids = [f"{face.__name__.rpartition('.')[2]}.{name}" for face, name in routed]

    @pytest.mark.parametrize("face,name", routed, ids=ids)
    def test_a_name_set_on_the_face_is_set_in_the_part_that_reads_it(monkeypatch, face, name):
        part = face._SETTINGS[name]
        real = getattr(part, name)
        assert getattr(face, name) is real
        new = object()
        monkeypatch.setattr(face, name, new)
        assert getattr(part, name) is new and getattr(face, name) is new
        other = object()   # set in the part directly: the face reads the part, never a copy of its own
        setattr(part, name, other)
        assert getattr(face, name) is other
        monkeypatch.undo()
        assert getattr(part, name) is real and getattr(face, name) is real

    @pytest.mark.parametrize("face,name", routed, ids=ids)
    def test_no_other_part_holds_its_own_binding_of_a_setting(face, name):
        """A part that imported a setting by name (``from .part import NAME``) would read its own
        copy, which the face never sets: only the owner binds it; the others read ``owner.NAME``."""
        owner = face._SETTINGS[name]
        for p in tuple(parts[face]) + tuple(shared.get(face, ())):
            mod = importlib.import_module(p)
            if mod is not owner:
                assert name not in vars(mod), f"{p} binds {name} (owned by {owner.__name__})"

    return test_a_name_set_on_the_face_is_set_in_the_part_that_reads_it, \
        test_no_other_part_holds_its_own_binding_of_a_setting


def child_json(code: str, timeout: float = 600):
    """Run ``code`` in a fresh Python process with this tree first on its path (a real load or
    environment of its own) and return the JSON object its last line prints; a ``{"skip": why}``
    object skips the calling test."""
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    if isinstance(out, dict) and "skip" in out:
        pytest.skip(out["skip"])
    return out
