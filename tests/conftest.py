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
    """The loaded oneDNN library (skips the test when libdnnl.so.3 cannot be found)."""
    from rawconv import _dnnl
    from rawconv.errors import LibraryNotFoundError

    try:
        return _dnnl.load()
    except LibraryNotFoundError as exc:  # pragma: no cover - CI always has it
        pytest.skip(str(exc))
