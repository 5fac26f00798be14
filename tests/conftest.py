"""Shared fixtures. Tests marked ``gpu`` skip where torch sees no CUDA device."""
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


@pytest.fixture(scope="session")
def dnnl():
    """The loaded oneDNN library. A missing libdnnl.so.3 fails the test: it is a dependency."""
    from rawconv import _dnnl

    return _dnnl.load()


@pytest.fixture(scope="session")
def cudnn_lib():
    """The loaded cuDNN library (``rawconv._cudnn.load()``); skips the test when libcudnn.so.9 cannot be loaded."""
    from rawconv import _cudnn
    from rawconv.errors import LibraryNotFoundError

    try:
        return _cudnn.load()
    except LibraryNotFoundError as exc:
        pytest.skip(f"libcudnn.so.9 not available: {exc}")
