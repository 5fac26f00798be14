"""An explicit RAWCONV_DNNL_LIBRARY / RAWCONV_CUDNN_LIBRARY that does not load is an error naming the
path and the loader's message, never a silent fall-back; ``rawconv info`` shows it. Each case runs
in a subprocess: the loaders cache what they loaded per process."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rawconv.onednn import _ffi as _dnnl

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str, **env) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in ("RAWCONV_DNNL_LIBRARY", "RAWCONV_CUDNN_LIBRARY")}
    e.update(env)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e, capture_output=True, text=True,
                          timeout=180)


LOAD_DNNL = """
    from rawconv.onednn import _ffi as _dnnl
    from rawconv.errors import LibraryNotFoundError
    try:
        l = _dnnl.load()
        print("LOADED", l.found_via, l.path)
    except LibraryNotFoundError as e:
        print("ERROR"); print(e)
"""


def _libc_path() -> str:
    with open("/proc/self/maps") as f:
        for line in f:
            p = line.split()[-1]
            if os.path.basename(p).startswith("libc.so"):
                return p
    pytest.skip("no libc.so mapped in this process (not glibc?)")


def _bad_files(tmp_path):
    text = tmp_path / "text" / "libdnnl.so.3"
    text.parent.mkdir()
    text.write_text("not a shared library\n")
    return {"missing": (str(tmp_path / "missing" / "libdnnl.so.3"), "no such file"),
            "not-a-library": (str(text), None),       # the dynamic loader's own words (invalid ELF header...)
            "directory": (str(tmp_path), "is a directory"),
            "another-library": (_libc_path(), "exports no dnnl_version")}


@pytest.mark.parametrize("case", ["missing", "not-a-library", "directory", "another-library"])
def test_explicit_dnnl_library_that_does_not_load_is_an_error(tmp_path, case):
    path, words = _bad_files(tmp_path)[case]
    r = _run(LOAD_DNNL, RAWCONV_DNNL_LIBRARY=path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith("ERROR"), out             # no fall-back to the wheel's copy
    assert f"$RAWCONV_DNNL_LIBRARY={path}" in out and f"$RAWCONV_DNNL_LIBRARY: {path}: " in out
    assert "tried no other copy" in out and "wheel" not in out and "system loader" not in out
    reason = out.split(f"$RAWCONV_DNNL_LIBRARY: {path}: ", 1)[1].strip()
    if words:
        assert words in reason
    else:   # dlopen's message, whatever the C library words it as
        assert reason and path in out and ("ELF" in reason or "too short" in reason or "header" in reason), reason


def test_explicit_dnnl_library_that_loads_is_used(dnnl):
    r = _run(LOAD_DNNL, RAWCONV_DNNL_LIBRARY=dnnl.path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["LOADED", "$RAWCONV_DNNL_LIBRARY", dnnl.path]


def test_rawconv_info_shows_the_explicit_library_error(tmp_path):
    path = str(tmp_path / "nowhere" / "libdnnl.so.3")
    r = _run("from rawconv.cli import main; raise SystemExit(main(['info', '--json']))", RAWCONV_DNNL_LIBRARY=path)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    err = data["onednn"]["error"]
    assert err.startswith("LibraryNotFoundError") and path in err and "no such file" in err
    assert "did not load" in data["capabilities"]["onednn"]
    r = _run("from rawconv.cli import main; raise SystemExit(main(['info']))", RAWCONV_DNNL_LIBRARY=path,
             COLUMNS="200")
    assert r.returncode == 0, r.stderr
    flat = " ".join(r.stdout.split())
    assert "LibraryNotFoundError" in flat and "no such file" in flat and "nowhere" in flat


def test_a_cpu_build_of_torch_imports_every_backend_and_info_works():
    # a CPU build of torch (pip install torch==2.13.0 here, or PyTorch's CPU wheel index, which the
    # README suggests without a GPU) has no torch._C._cuda_getDevice: importing rawconv.cudnn raised
    # AttributeError at class definition, so rawconv info, tuning.replay and every registry walk failed
    r = _run("""
        import torch
        if hasattr(torch._C, "_cuda_getDevice"):
            del torch._C._cuda_getDevice   # as a CPU build of torch has it
        import rawconv.cudnn, rawconv.cudnn_graph
        from rawconv.core import backend as _backend
        from rawconv.cudnn import _cuda
        print("BACKENDS", sorted(b.name for b in _backend.backends()))
        print("DEVICE", _cuda.current_device())
        from rawconv.cli import main
        raise SystemExit(main(["info", "--json"]))
    """)
    assert r.returncode == 0, r.stderr
    assert "BACKENDS ['cudnn', 'cudnn_graph', 'onednn']" in r.stdout and "DEVICE None" in r.stdout
    assert '"onednn"' in r.stdout


# ---------------------------------------------------------------- cuDNN
LOAD_CUDNN = """
    from rawconv.cudnn import _ffi as _cudnn
    from rawconv.errors import LibraryNotFoundError
    try:
        l = _cudnn.load()
        print("LOADED", l.found_via, l.path)
    except LibraryNotFoundError as e:
        print("ERROR"); print(e)
"""


@pytest.mark.parametrize("case", ["missing", "not-a-library"])
def test_explicit_cudnn_library_that_does_not_load_is_an_error(tmp_path, case):
    path, words = _bad_files(tmp_path)[case]
    r = _run(LOAD_CUDNN, RAWCONV_CUDNN_LIBRARY=path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith("ERROR"), out
    assert f"$RAWCONV_CUDNN_LIBRARY={path}" in out and f"$RAWCONV_CUDNN_LIBRARY: {path}: " in out
    assert "tried no other copy" in out and "already loaded" not in out and "wheel" not in out
    assert "system loader" not in out
    if words:
        assert words in out


def test_explicit_cudnn_library_beside_another_loaded_copy_is_an_error(cudnn_lib, tmp_path):
    """torch mapped its own libcudnn.so.9 first: another file under $RAWCONV_CUDNN_LIBRARY cannot be
    honoured (one cuDNN per process), the same file can."""
    copy = tmp_path / "libcudnn.so.9"
    shutil.copyfile(cudnn_lib.path, copy)
    code = textwrap.dedent("""
        import os, torch
        torch.backends.cudnn.version()            # torch maps its own copy
        os.environ["RAWCONV_CUDNN_LIBRARY"] = {path!r}
    """) + textwrap.dedent(LOAD_CUDNN)
    r = _run(code.format(path=str(copy)))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ERROR") and str(copy) in r.stdout and "already loaded another" in r.stdout, r.stdout
    r = _run(code.format(path=cudnn_lib.path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["LOADED", "$RAWCONV_CUDNN_LIBRARY", str(Path(cudnn_lib.path).resolve())]


# ---------------------------------------------------------------- runtime names (no library needed)
@pytest.mark.parametrize("cpu, gpu, want_cpu, want_gpu", [
    (2, 0, "OpenMP", "none"),                 # the onednn-cpu-gomp wheel
    (512, 512, "SYCL", "SYCL"),               # a DPC++ build (the `onednn` 2026.1 wheel reports 512)
    (4, 256, "TBB", "OpenCL"),
    (8, 1024, "threadpool", "Level Zero"),
    (1, 0, "sequential", "none"),
    (3, 2048, "unknown (3)", "unknown (2048)"),
])
def test_version_names_every_runtime_value(cpu, gpu, want_cpu, want_gpu):
    v = _dnnl.ffi.new("dnnl_version_t *")
    keep = _dnnl.ffi.new("char[]", b"0123abcd")
    v.major, v.minor, v.patch, v.hash, v.cpu_runtime, v.gpu_runtime = 3, 13, 1, keep, cpu, gpu
    assert _dnnl.version(v[0]) == {"version": "3.13.1", "commit": "0123abcd", "cpu_runtime": want_cpu,
                                   "gpu_runtime": want_gpu}


def test_runtime_values_match_the_3_2_header():
    """DNNL_RUNTIME_* as include/oneapi/dnnl/dnnl_config.h of onednn-devel-cpu-gomp 2023.2.0 (oneDNN
    3.2) defines them: NONE 0u, SEQ 1u, OMP 2u, TBB 4u, THREADPOOL 8u, OCL 256u, SYCL 512u."""
    header = {0: "none", 1: "sequential", 2: "OpenMP", 4: "TBB", 8: "threadpool", 256: "OpenCL", 512: "SYCL"}
    assert {k: _dnnl.runtime_name(k) for k in header} == header


def test_every_exception_class_and_options_are_reachable_from_the_top_level():
    """The docs (guides/errors.md) name them as rawconv.X: each class of rawconv.errors is rawconv.<name>, and
    rawconv.Options is the options object every backend takes."""
    import inspect

    import rawconv
    import rawconv.errors as errors
    import rawconv.options as options

    names = [n for n, v in vars(errors).items() if inspect.isclass(v) and v.__module__ == errors.__name__]
    assert len(names) >= 12
    for n in names:
        assert getattr(rawconv, n) is getattr(errors, n), n
        assert n in rawconv.__all__, n
    assert rawconv.Options is options.Options
