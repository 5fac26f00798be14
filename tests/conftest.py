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
