"""cuDNN binding tests that need libcudnn but no GPU (CI): declarations, enums, descriptors,
cuDNN's own output dims vs torch's, status/error formatting, loader search order, bad input."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from rawconv import ConvProblem, cudnn
from rawconv.cudnn import _cuda
from rawconv.cudnn import _ffi as _cudnn
from rawconv.errors import (ArgumentError, ArgumentTypeError, LibraryError, LibraryNotFoundError,
                            NotSupportedError)

ROOT = Path(__file__).resolve().parent.parent
CDEF_FUNCS = sorted(set(re.findall(r"\b(cudnn\w+)\s*\(", "".join(_cudnn.CDEFS))))


def _header_dir():
    for site in sys.path:
        p = Path(site) / "nvidia" / "cudnn" / "include"
        if (p / "cudnn_graph.h").is_file():
            return p
    return None


# ---------------------------------------------------------------- declarations and enums
def _cdefs_version() -> int:
    a, b, c = re.search(r"CUDNN_VERSION (\d+)\.(\d+)\.(\d+)", _cudnn.CDEFS[0]).groups()
    return int(a) * 10000 + int(b) * 100 + int(c)


def test_every_declared_function_resolves(cudnn_lib):
    missing = [f for f in CDEF_FUNCS if not hasattr(cudnn_lib.lib, f)]
    assert len(CDEF_FUNCS) > 70
    legacy = set(re.findall(r"\b(cudnn\w+)\s*\(", _cudnn.CDEFS[1]))
    assert [f for f in missing if f in legacy] == []  # everything rawconv.cudnn calls
    if int(cudnn_lib.lib.cudnnGetVersion()) >= _cdefs_version():
        assert missing == []
    else:  # an older cuDNN than the cdefs' (9.19 on the GPU machine): only newer graph-API functions
        print("declared but absent in this older cuDNN:", missing)
        assert len(missing) <= 10


def test_cdefs_are_version_stamped():
    for text in _cudnn.CDEFS:
        assert re.search(r"CUDNN_VERSION 9\.\d+\.\d+", text)
        assert "Taken from cuDNN 9." in text


def test_backend_api_is_declared_whole():
    names = set(_cudnn.ENUM_TYPES)
    for t in ("cudnnBackendDescriptorType_t", "cudnnBackendAttributeName_t", "cudnnBackendAttributeType_t",
              "cudnnBackendHeurMode_t", "cudnnBackendNumericalNote_t", "cudnnBackendBehaviorNote_t",
              "cudnnBackendKnobType_t"):
        assert t in names, t
    for f in ("cudnnBackendCreateDescriptor", "cudnnBackendSetAttribute", "cudnnBackendGetAttribute",
              "cudnnBackendFinalize", "cudnnBackendExecute", "cudnnBackendDestroyDescriptor"):
        assert f in CDEF_FUNCS


def test_enum_table_matches_headers():
    inc = _header_dir()
    if inc is None:
        pytest.skip("no nvidia/cudnn/include headers installed")
    text = "".join((inc / h).read_text() for h in ("cudnn_graph.h", "cudnn_ops.h", "cudnn_cnn.h"))
    literal = {n: int(v) for n, v in re.findall(r"\b(CUDNN_\w+)\s*=\s*(-?\d+)\s*[,}\n]", text)}
    common = set(literal) & set(_cudnn.ENUMS)
    assert len(common) > 400
    differ = {n: (_cudnn.ENUMS[n], literal[n]) for n in common if _cudnn.ENUMS[n] != literal[n]}
    ver = re.search(r"#define CUDNN_MINOR\s+(\d+)", (inc / "cudnn_version.h").read_text()).group(1)
    if int(ver) == _cdefs_version() // 100 % 100:
        assert differ == {}
    else:  # other headers than the cdefs came from: what rawconv.cudnn uses must still agree
        print(f"cuDNN 9.{ver} headers differ from the cdefs in:", differ)
        used = ("CUDNN_STATUS_", "CUDNN_CONVOLUTION_", "CUDNN_DATA_", "CUDNN_TENSOR_", "CUDNN_CROSS_CORRELATION",
                "CUDNN_ACTIVATION_", "CUDNN_DEFAULT_MATH", "CUDNN_FMA_MATH", "CUDNN_TENSOR_OP_MATH",
                "CUDNN_DETERMINISTIC", "CUDNN_NON_DETERMINISTIC", "CUDNN_PROPAGATE_NAN")
        assert {n: v for n, v in differ.items() if n.startswith(used)} == {}


def test_enum_values_agree_with_the_loaded_library(cudnn_lib):
    L = cudnn_lib.lib
    for name, value in _cudnn.ENUMS.items():
        assert getattr(L, name) == value, name


@pytest.mark.parametrize("name, value", [
    ("CUDNN_STATUS_NOT_SUPPORTED", 3000), ("CUDNN_STATUS_NOT_INITIALIZED", 1001), ("CUDNN_FMA_MATH", 3),
    ("CUDNN_DEFAULT_MATH", 0), ("CUDNN_TENSOR_OP_MATH", 1), ("CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED", 7),
    ("CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING", 6), ("CUDNN_DATA_HALF", 2), ("CUDNN_DATA_BFLOAT16", 9),
    ("CUDNN_TENSOR_NHWC", 1), ("CUDNN_CROSS_CORRELATION", 1), ("CUDNN_ACTIVATION_IDENTITY", 5)])
def test_known_enum_values(name, value):
    assert _cudnn.ENUMS[name] == value


def test_algo_tables_and_names():
    assert cudnn.ALGOS["forward"][1] == "IMPLICIT_PRECOMP_GEMM"
    assert cudnn.FwdAlgo.WINOGRAD_NONFUSED == 7
    assert cudnn.BwdDataAlgo.ALGO_1 == 1
    assert cudnn.BwdFilterAlgo.ALGO_3 == 3
    assert cudnn.resolve_algo("forward", "implicit_precomp_gemm") == 1
    assert cudnn.resolve_algo("forward", "CUDNN_CONVOLUTION_FWD_ALGO_FFT") == 4
    assert cudnn.resolve_algo("backward_data", "0") == 0
    assert cudnn.resolve_algo("backward_data", "CUDNN_CONVOLUTION_BWD_DATA_ALGO_1") == 1
    assert cudnn.resolve_algo("backward_filter", 5) == 5
    with pytest.raises(ArgumentError, match="known: IMPLICIT_GEMM"):
        cudnn.resolve_algo("forward", "NO_SUCH_ALGO")
    with pytest.raises(ArgumentError):
        cudnn.resolve_algo("forward", 8)  # _COUNT is not an algo


def test_data_types():
    assert _cudnn.data_type("float32") == _cudnn.ENUMS["CUDNN_DATA_FLOAT"]
    assert _cudnn.data_type(torch.float16) == _cudnn.ENUMS["CUDNN_DATA_HALF"]
    assert _cudnn.data_type("float64") == _cudnn.ENUMS["CUDNN_DATA_DOUBLE"]
    with pytest.raises(ValueError):
        _cudnn.data_type("complex64")


# ---------------------------------------------------------------- descriptors
def _read_tensor(desc, nb=5):
    dt, n = _cudnn.ffi.new("cudnnDataType_t *"), _cudnn.ffi.new("int *")
    dims, strides = _cudnn.ffi.new("int[]", nb), _cudnn.ffi.new("int[]", nb)
    _cudnn.call("cudnnGetTensorNdDescriptor", desc, nb, dt, n, dims, strides)
    return int(dt[0]), list(dims)[:n[0]], list(strides)[:n[0]]


def _read_filter(desc, nb=5):
    dt, fmt, n = (_cudnn.ffi.new("cudnnDataType_t *"), _cudnn.ffi.new("cudnnTensorFormat_t *"),
                  _cudnn.ffi.new("int *"))
    dims = _cudnn.ffi.new("int[]", nb)
    _cudnn.call("cudnnGetFilterNdDescriptor", desc, nb, dt, fmt, n, dims)
    return int(dt[0]), int(fmt[0]), list(dims)[:n[0]]


def _read_conv(desc, nb=3):
    n, mode, ct = _cudnn.ffi.new("int *"), _cudnn.ffi.new("cudnnConvolutionMode_t *"), _cudnn.ffi.new(
        "cudnnDataType_t *")
    pad, st, dil = (_cudnn.ffi.new("int[]", nb) for _ in range(3))
    _cudnn.call("cudnnGetConvolutionNdDescriptor", desc, nb, n, pad, st, dil, mode, ct)
    g, m = _cudnn.ffi.new("int *"), _cudnn.ffi.new("cudnnMathType_t *")
    _cudnn.call("cudnnGetConvolutionGroupCount", desc, g)
    _cudnn.call("cudnnGetConvolutionMathType", desc, m)
    k = n[0]
    return list(pad)[:k], list(st)[:k], list(dil)[:k], int(mode[0]), int(ct[0]), int(g[0]), int(m[0])


def _problem(**kw):
    kw.setdefault("device", "cuda:0")
    return ConvProblem(**kw)


def test_descriptors_1d_run_as_2d(cudnn_lib):
    p = _problem(n=2, c=4, k=6, in_spatial=(17,), kernel=(3,), stride=(2,), dilation=(2,), pad_before=(1,),
                 pad_after=(1,))
    plan = cudnn.Convolution.from_problem(p)
    xd, wd, yd, cd = plan.descriptors()
    assert _read_tensor(xd) == (_cudnn.ENUMS["CUDNN_DATA_FLOAT"], [2, 4, 1, 17], [68, 17, 17, 1])
    assert _read_filter(wd)[1:] == (_cudnn.ENUMS["CUDNN_TENSOR_NCHW"], [6, 4, 1, 3])
    pad, st, dil, mode, ct, g, m = _read_conv(cd)
    assert (pad, st, dil) == ([0, 1], [1, 2], [1, 2])
    assert mode == _cudnn.ENUMS["CUDNN_CROSS_CORRELATION"] and g == 1
    assert m == _cudnn.ENUMS["CUDNN_FMA_MATH"]  # fp32 default: never TF32 unless asked
    assert plan.cudnn_output_shape() == p.y_shape


def test_descriptors_2d_nhwc_groups_dilation(cudnn_lib):
    p = _problem(n=3, c=8, k=12, in_spatial=(9, 11), kernel=(3, 2), stride=(1, 2), dilation=(2, 3),
                 pad_before=(2, 1), pad_after=(2, 1), groups=4, layout="nhwc", dtype="float16")
    plan = cudnn.Convolution.from_problem(p, w_layout="nhwc")
    xd, wd, yd, cd = plan.descriptors()
    dt, dims, strides = _read_tensor(xd)
    assert dt == _cudnn.ENUMS["CUDNN_DATA_HALF"]
    assert dims == [3, 8, 9, 11]
    assert strides == [9 * 11 * 8, 1, 11 * 8, 8]  # channels last
    assert _read_tensor(yd)[1:] == ([3, 12] + list(p.out_spatial),
                                    [12 * p.out_spatial[0] * p.out_spatial[1], 1, 12 * p.out_spatial[1], 12])
    assert _read_filter(wd)[1:] == (_cudnn.ENUMS["CUDNN_TENSOR_NHWC"], [12, 2, 3, 2])
    pad, st, dil, _mode, ct, g, m = _read_conv(cd)
    assert (pad, st, dil, g) == ([2, 1], [1, 2], [2, 3], 4)
    assert ct == _cudnn.ENUMS["CUDNN_DATA_FLOAT"]  # fp16 data, fp32 accumulation
    assert m == _cudnn.ENUMS["CUDNN_TENSOR_OP_MATH"]
    assert plan.cudnn_output_shape() == p.y_shape


def test_descriptors_3d(cudnn_lib):
    p = _problem(n=1, c=3, k=5, in_spatial=(6, 7, 8), kernel=(3, 3, 3), stride=(2, 1, 1),
                 pad_before=(1, 0, 1), pad_after=(1, 0, 1), dtype="bfloat16")
    plan = cudnn.Convolution.from_problem(p, math="fma")
    xd, wd, yd, cd = plan.descriptors()
    assert _read_tensor(xd)[1] == [1, 3, 6, 7, 8]
    assert _read_filter(wd)[2] == [5, 3, 3, 3, 3]
    assert _read_conv(cd)[0] == [1, 0, 1]
    assert _read_conv(cd)[6] == _cudnn.ENUMS["CUDNN_FMA_MATH"]
    assert plan.cudnn_output_shape() == p.y_shape


def test_asymmetric_padding_pads_explicitly(cudnn_lib):
    p = _problem(n=1, c=32, k=64, in_spatial=(416, 416), kernel=(3, 3), stride=(2, 2), pad_before=(1, 1),
                 pad_after=(0, 0))  # shared/cases G4
    plan = cudnn.Convolution.from_problem(p)
    assert plan.inner.in_spatial == (417, 417) and plan.inner.pad_before == (0, 0)
    assert plan.cudnn_output_shape() == (1, 64, 208, 208) == p.y_shape
    assert any("asymmetric" in n for n in plan.notes)


try:
    from hypothesis import given, settings, strategies as st
except ImportError:  # pragma: no cover
    given = None


def _torch_out_shape(p: ConvProblem):
    x = torch.empty(p.x_shape, device="meta")
    w = torch.empty(p.w_shape, device="meta")
    pad = []
    for b, a in reversed(list(zip(p.pad_before, p.pad_after))):
        pad += [b, a]
    x = F.pad(x, pad)
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[p.ndim]
    return tuple(conv(x, w, None, p.stride, 0, p.dilation, p.groups).shape)


if given is not None:
    @st.composite
    def problems(draw):
        nd = draw(st.integers(1, 3))
        g = draw(st.sampled_from([1, 2, 3]))
        c, k = g * draw(st.integers(1, 4)), g * draw(st.integers(1, 4))
        kernel = tuple(draw(st.integers(1, 4)) for _ in range(nd))
        dil = tuple(draw(st.integers(1, 3)) for _ in range(nd))
        stride = tuple(draw(st.integers(1, 3)) for _ in range(nd))
        pb = tuple(draw(st.integers(0, 3)) for _ in range(nd))
        pa = tuple(draw(st.integers(0, 3)) for _ in range(nd)) if draw(st.booleans()) else pb
        ins = tuple(max(draw(st.integers(1, 20)), d * (kk - 1) + 1 - b - a)
                    for kk, d, b, a in zip(kernel, dil, pb, pa))
        return _problem(n=draw(st.integers(1, 3)), c=c, k=k, in_spatial=ins, kernel=kernel, stride=stride,
                        dilation=dil, pad_before=pb, pad_after=pa, groups=g,
                        layout=draw(st.sampled_from(["nchw", "nhwc"])),
                        dtype=draw(st.sampled_from(["float32", "float16", "bfloat16", "float64"])))

    @settings(max_examples=150, deadline=None)
    @given(problems())
    def test_cudnn_output_dims_equal_torch(cudnn_lib, p):
        plan = cudnn.Convolution.from_problem(p)
        assert plan.cudnn_output_shape() == p.y_shape == _torch_out_shape(p)


# ---------------------------------------------------------------- statuses and errors
def test_status_names():
    assert _cudnn.status_name(0) == "CUDNN_STATUS_SUCCESS"
    assert _cudnn.status_name(3000) == "CUDNN_STATUS_NOT_SUPPORTED"
    assert _cudnn.status_name(3007) == "CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH"
    assert _cudnn.status_name(2000) == "CUDNN_STATUS_BAD_PARAM"
    assert _cudnn.status_name(4000) == "CUDNN_STATUS_INTERNAL_ERROR"  # not its alias


def test_error_classes_and_text(cudnn_lib):
    e = _cudnn.error(3000, "cudnnConvolutionForward", "algo FFT")
    assert isinstance(e, NotSupportedError) and isinstance(e, LibraryError)
    assert "cudnnConvolutionForward failed: CUDNN_STATUS_NOT_SUPPORTED (3000)" in str(e)
    assert "algo FFT" in str(e) and "CUDNN_LOGLEVEL_DBG=3" in str(e)
    e = _cudnn.error(2000, "cudnnSetTensorNdDescriptor")
    assert type(e) is LibraryError and e.status == 2000 and e.status_name == "CUDNN_STATUS_BAD_PARAM"
    assert e.function == "cudnnSetTensorNdDescriptor" and e.library == "cuDNN"
    _cudnn.check(0, "anything")  # success: no exception


def test_library_error_carries_cudnn_last_error_text(cudnn_lib):
    with pytest.raises(LibraryError) as info:
        _cudnn.tensor_desc("float32", [2, 3, -1, 4], [12, 4, 4, 1])
    e = info.value
    assert e.status_name == "CUDNN_STATUS_BAD_PARAM"
    assert "cudnnSetTensorNdDescriptor failed" in str(e)
    assert "-1" in e.detail  # cuDNN's own text, from cudnnGetLastErrorString


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU behaviour")
def test_handle_without_gpu_says_why(cudnn_lib):
    with pytest.raises(LibraryError) as info:
        _cuda.handle(0)
    assert info.value.status_name == "CUDNN_STATUS_NOT_INITIALIZED"
    assert "cudnnCreate" in str(info.value)


# ---------------------------------------------------------------- loader
def test_candidates_order_with_fake_files(tmp_path):
    maps = tmp_path / "maps"
    mapped = tmp_path / "torch" / "libcudnn.so.9"
    maps.write_text("7f0000000000-7f0000001000 r-xp 00000000 08:01 1 /usr/lib/libc.so.6\n"
                    f"7f0000002000-7f0000003000 r-xp 00000000 08:01 2 {mapped}\n"
                    f"7f0000004000-7f0000005000 r-xp 00000000 08:01 3 {tmp_path}/libcudnn_graph.so.9\n")
    site = tmp_path / "site-packages"
    cands = _cudnn.candidates(maps=str(maps), site_dirs=[site], env={})
    assert [(c[0].split(" (")[0], c[1]) for c in cands] == [
        ("already loaded in this process", str(mapped)),
        ("nvidia-cudnn wheel", str(site / "nvidia" / "cudnn" / "lib" / "libcudnn.so.9")),
        ("system loader", "libcudnn.so.9")]
    # an explicit path is the only candidate (tests/test_loader.py: its errors)
    assert _cudnn.candidates(maps=str(maps), site_dirs=[site], env={"RAWCONV_CUDNN_LIBRARY": "/x/libcudnn.so.9"}) \
        == [("$RAWCONV_CUDNN_LIBRARY", "/x/libcudnn.so.9", None)]
    assert cands[0][2] & _cudnn.ffi.RTLD_NOLOAD
    # nothing mapped: the first candidate is only reported
    maps.write_text("")
    cands = _cudnn.candidates(maps=str(maps), site_dirs=[], env={})
    assert cands[0][2] == -1 and [c[0] for c in cands[1:]] == ["system loader"]


def _run(code: str, **env):
    e = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in sys.path if p]), **env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=e,
                          timeout=120)


def test_search_in_a_subprocess_takes_the_first_that_loads(tmp_path, cudnn_lib):
    bad = tmp_path / "env" / "libcudnn.so.9"
    bad.parent.mkdir()
    bad.write_text("not an ELF file")
    real = cudnn_lib.path
    r = _run(f"""
        from rawconv.cudnn import _cuda
        from rawconv.cudnn import _ffi as _cudnn
        loaded = _cudnn.search([("already loaded in this process", "(none)", -1),
                                ("$RAWCONV_CUDNN_LIBRARY", {str(bad)!r}, None),
                                ("nvidia-cudnn wheel", {str(tmp_path / 'missing' / 'libcudnn.so.9')!r}, None),
                                ("nvidia-cudnn wheel", {real!r}, None),
                                ("system loader", "libcudnn.so.9", None)])
        print(loaded.found_via, loaded.path)
        for a in loaded.attempts: print("ATTEMPT", a)
        print(loaded.lib.cudnnGetVersion())
    """)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"nvidia-cudnn wheel {real}"
    att = [ln for ln in lines if ln.startswith("ATTEMPT")]
    assert len(att) == 4
    assert "already loaded" in att[0] and str(bad) in att[1] and "no such file" in att[2] and "loaded" in att[3]
    assert int(lines[-1]) >= 90000


def test_search_reports_every_attempt_when_all_fail(tmp_path):
    bad = tmp_path / "libcudnn.so.9"
    bad.write_text("junk")
    r = _run(f"""
        from rawconv.cudnn import _ffi as _cudnn
        from rawconv.errors import LibraryNotFoundError
        try:
            _cudnn.search([("already loaded in this process", "(none)", -1),
                           ("$RAWCONV_CUDNN_LIBRARY", {str(bad)!r}, None),
                           ("nvidia-cudnn wheel", {str(tmp_path / 'nope' / 'libcudnn.so.9')!r}, None),
                           ("system loader", "libcudnn_no_such_name.so.9", None)])
        except LibraryNotFoundError as e:
            print(e)
    """)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "could not load cuDNN" in out
    for piece in ("already loaded in this process", str(bad), "no such file", "libcudnn_no_such_name.so.9"):
        assert piece in out
    assert isinstance(LibraryNotFoundError("x", []), OSError)


def test_info_says_what_was_loaded(cudnn_lib):
    i = cudnn.info()
    assert i["version"].startswith("9.") and i["path"].endswith("libcudnn.so.9")
    assert i["found_via"] and i["attempts"]
    assert i["same_as_torch"] == (torch.backends.cudnn.version() == i["version_int"])


# ---------------------------------------------------------------- bad input, before any C call
@pytest.fixture
def no_c_calls(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a C call was made")
    monkeypatch.setattr(_cudnn, "lib", boom)
    monkeypatch.setattr(_cuda, "handle_for", boom)


def test_cpu_tensors_point_to_onednn(no_c_calls):
    x, w = torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3)
    for call in (lambda: cudnn.forward(x, w), lambda: cudnn.algorithms(x, w),
                 lambda: cudnn.Convolution(x, w),
                 lambda: cudnn.backward_data(torch.randn(1, 4, 6, 6), w, (1, 3, 8, 8)),
                 lambda: cudnn.backward_filter(x, torch.randn(1, 4, 6, 6), (4, 3, 3, 3))):
        with pytest.raises(ArgumentError, match="rawconv.onednn"):
            call()


@pytest.mark.parametrize("args, exc, match", [
    ((torch.randn(1, 3, 8, 8), torch.randn(4, 2, 3, 3)), ArgumentError, "input channels"),
    ((torch.randn(1, 4, 8, 8), torch.randn(4, 2, 3, 3), None, 1, 0, 1, 3), ArgumentError, "groups"),
    ((torch.randn(1, 3, 8, 8).int(), torch.randn(4, 3, 3, 3).int()), ArgumentError, "dtype"),
    ((torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3).double()), ArgumentError, "same dtype"),
    ((torch.randn(1, 3, 2, 2), torch.randn(4, 3, 3, 3)), ArgumentError, "smaller than"),
    (("x", torch.randn(4, 3, 3, 3)), ArgumentTypeError, "torch.Tensor"),
])
def test_bad_input_rejected(no_c_calls, args, exc, match):
    with pytest.raises(exc, match=match):
        cudnn.forward(*args)


def test_bad_plan_options_rejected(no_c_calls):
    p = _problem(n=1, c=3, k=4, in_spatial=(8, 8), kernel=(3, 3))
    with pytest.raises(ArgumentError, match="math must be one of"):
        cudnn.Convolution.from_problem(p, math="tf32")
    with pytest.raises(ArgumentError, match="unknown forward algo"):
        cudnn.Convolution.from_problem(p, algo="ALGO_0")
    with pytest.raises(ArgumentError, match="activation"):
        cudnn.Convolution.from_problem(p, activation="gelu")
    with pytest.raises(ArgumentError, match="direction"):
        cudnn.Convolution.from_problem(p, direction="sideways")
    # one set of direction names (issue 11): backward_weights everywhere, backward_filter is cuDNN's alias
    for d in ("backward_weights", "backward_filter"):
        assert cudnn.Convolution.from_problem(p, direction=d).direction == "backward_weights"
    with pytest.raises(ArgumentError, match="workspace_limit"):
        cudnn.Convolution.from_problem(p, workspace_limit=-1)
    with pytest.raises(ArgumentError, match="output_padding"):
        cudnn.conv_transpose(torch.randn(1, 3, 4, 4), torch.randn(3, 2, 3, 3), stride=2, output_padding=2)


def test_int32_limit_named_or_batch_split(cudnn_lib):
    # shared/cases G3: one sample past 2^31 elements: a clear NotSupportedError, no descriptor, no crash
    p = _problem(n=1, c=514, k=1, in_spatial=(2048, 2048), kernel=(3, 3), pad_before=(1, 1), pad_after=(1, 1),
                 dtype="float16")
    with pytest.raises(NotSupportedError, match=r"2\^31-1"):
        cudnn.Convolution.from_problem(p)
    # a batch past 2^31 whose samples fit: split into chunks that each fit
    p2 = p.with_(n=3, in_spatial=(1200, 1200))
    plan = cudnn.Convolution.from_problem(p2)
    assert plan.batch_chunk == (2 ** 31 - 1) // (514 * 1200 * 1200)
    assert plan.batch_chunk * 514 * 1200 * 1200 <= 2 ** 31 - 1
    assert _read_tensor(plan.descriptors()[0])[1][0] == plan.batch_chunk
    assert plan._batch_sizes() == [plan.batch_chunk] + ([3 % plan.batch_chunk] if 3 % plan.batch_chunk else [])


def test_graph_api_reexport_is_lazy():
    try:
        import rawconv.cudnn_graph  # noqa: F401
    except ImportError:
        with pytest.raises(AttributeError, match="cudnn_graph"):
            cudnn.engines  # noqa: B018
        with pytest.raises(NotSupportedError, match="graph API"):
            cudnn.forward(torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3), engine=0)
    else:
        assert callable(cudnn.engines)


def test_the_plan_device_guard_works_on_a_torch_without_cuda_bindings(monkeypatch):
    """A CPU build of torch (2.13) has no torch._C._cuda_getDevice: ``import rawconv.cudnn`` raised
    AttributeError while defining its plan classes (and every test file importing it failed to
    collect). The guard and current_device() now treat it as 'no CUDA driver'."""
    monkeypatch.setattr(_cuda, "_get_device", _cuda._no_cuda_build)   # what rawconv.cudnn._cuda binds on such a torch

    class Plan:
        device_index = 0

        @_cuda.on_plan_device
        def run(self, v):
            return v + 1

    assert Plan().run(1) == 2
    assert _cuda.current_device() is None
    code = ("import torch; delattr(torch._C, '_cuda_getDevice') if hasattr(torch._C, '_cuda_getDevice') else None; "
            "import rawconv.cudnn, rawconv.cudnn_graph; print('imported')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert out.returncode == 0 and "imported" in out.stdout, out.stderr[-2000:]
