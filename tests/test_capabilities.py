"""rawconv.onednn.capabilities() / rawconv.cudnn.capabilities(): what the library offers here, asked
of the library, and checked against real calls (a capability that lies fails here on any CPU)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from conftest import requires_onednn as requires_onednn_fn
from rawconv import ArgumentError, ArgumentTypeError, ConvProblem, LibraryError, NotSupportedError, onednn
from rawconv.core.capabilities import Capabilities, CapabilityRow
from rawconv.problem import abs_reference, compare_to_reference

ROOT = Path(__file__).resolve().parents[1]
DIRS = ("forward", "backward_data", "backward_weights")


@pytest.fixture(scope="module")
def caps(dnnl):
    return onednn.capabilities()


# ---------------------------------------------------------------- what is probed
def test_every_direction_dtype_and_fpmath_is_probed(caps):
    keys = {(r.direction, r.dtype, r.fpmath) for r in caps.rows}
    want = {(d, "float32", m) for d in DIRS for m in onednn.FPMATH_MODES}
    want |= {(d, dt, "strict") for d in DIRS for dt in ("bfloat16", "float16")}
    assert keys == want and len(caps.rows) == len(want)
    from rawconv.onednn import _ffi as _dnnl

    assert caps.library == "oneDNN" and caps.version == _dnnl.version()["version"]
    assert caps.platform == _dnnl.effective_cpu_isa()


def test_rows_split_reference_from_the_rest(caps):
    for r in caps.rows:
        assert all(not n.startswith("ref") for n in r.implementations), r
        assert all(n.startswith("ref") for n in r.reference), r
        assert (r.status == "ok") == bool(r.implementations or r.reference), r
    # float32 has a non-reference implementation in every direction on every x86-64 CPU (gemm)
    for d in DIRS:
        assert caps.offered(d, "float32") and "x64:gemm:jit" in caps.row(d, "float32").implementations


def test_rows_are_what_the_plans_list(caps):
    for r in caps.rows:
        plan = onednn.Convolution.from_problem(onednn.CAPABILITY_PROBE.with_(dtype=r.dtype), direction=r.direction,
                                               fpmath=r.fpmath)
        try:
            names = list(dict.fromkeys(i.name for i in plan.implementations))
        except NotSupportedError as exc:
            assert exc.status_name == r.status and not r.implementations and not r.reference
            continue
        assert names == list(r.implementations) + list(r.reference)


def _inputs(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 16, 9, 9, generator=g).to(dtype)
    w = (torch.randn(24, 16, 3, 3, generator=g) / 12).to(dtype)
    return x, w


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("direction", DIRS)
def test_offered_exactly_where_a_real_call_runs(caps, direction, dtype):
    """The capability is checked, not trusted: where it says offered, the function form runs
    (oneDNN's first choice) and matches the float64 reference; where the library lists
    nothing at all, the call raises NotSupportedError (dnnl_unimplemented)."""
    x, w = _inputs(dtype)
    p = ConvProblem.from_torch(x, w, padding=1)
    gy = torch.randn(p.y_shape).to(dtype)

    def call():
        if direction == "forward":
            return onednn.forward(x, w, padding=1)
        if direction == "backward_data":
            return onednn.backward_data(gy, w, x.shape, padding=1)
        return onednn.backward_weights(x, gy, w.shape, padding=1)

    row = caps.row(direction, dtype)
    if not row.implementations and not row.reference:
        with pytest.raises(NotSupportedError) as ei:
            call()
        assert ei.value.status_name == row.status == "dnnl_unimplemented"
        return
    out = call()
    if direction == "forward":
        ref, ra = p.reference(x, w), abs_reference(p, x, w)
    else:
        xd, wd, gyd = (t.double().requires_grad_() for t in (x, w, gy))
        torch.nn.functional.conv2d(xd, wd, padding=1).backward(gyd)
        ref = xd.grad if direction == "backward_data" else wd.grad
        ra = None
    if ra is not None:
        assert compare_to_reference(p, out, ref, ra).ok
    else:   # backward: relative to the reference's scale, at the dtype's precision
        tol = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 5e-3}[dtype]
        err = (out.double() - ref).abs().max() / ref.abs().max()
        assert err < tol, f"{direction} {dtype}: relative error {err:.3g}"


@pytest.mark.parametrize("fpmath", ["bf16", "f16", "tf32", "any"])
def test_down_conversion_claim_matches_random_inputs(caps, fpmath):
    """For each listed forward implementation under a reduced-precision fpmath mode, the claim
    is checked on random inputs: the ones said to round inputs land nearer the reference of the
    rounded inputs than float32 arithmetic allows; the others meet the strict float32 bound."""
    row = caps.row("forward", "float32", fpmath)
    assert row.down_converts is not None and set(row.down_converts) <= set(row.implementations)
    x, w = _inputs(torch.float32, seed=3)
    p = ConvProblem.from_torch(x, w, padding=1)
    ref, ra = p.reference(x, w), abs_reference(p, x, w)
    low = {"bf16": torch.bfloat16, "f16": torch.float16, "tf32": torch.bfloat16, "any": torch.bfloat16}[fpmath]
    for name in row.implementations:
        y = onednn.forward(x, w, padding=1, fpmath=fpmath, impl=name)
        strict_ok = compare_to_reference(p, y, ref, ra).ok
        if name in row.down_converts:
            ref_low = p.reference(x.to(low).float(), w.to(low).float())
            assert not strict_ok or (y.double() - ref_low).abs().max() < (y.double() - ref).abs().max(), name
        else:
            assert strict_ok, f"{name} with fpmath {fpmath} is said to compute in float32 but misses its bound"


# ---------------------------------------------------------------- the object
def test_cached_per_process_and_refresh(caps):
    assert onednn.capabilities() is caps
    again = onednn.capabilities(refresh=True)
    assert again is not caps and again == caps
    assert onednn.capabilities() is again
    with pytest.raises(ArgumentTypeError):
        onednn.capabilities(refresh="yes")


def test_lookup_accepts_aliases_and_rejects_the_unprobed(caps):
    assert caps.row("backward_filter", torch.float32) is caps.row("backward_weights", "f32")
    assert caps.offered("forward", "bf16") == caps.offered("forward", torch.bfloat16)
    with pytest.raises(ArgumentError, match="direction"):
        caps.row("sideways", "float32")
    with pytest.raises(ArgumentError, match="no row"):
        caps.row("forward", "bfloat16", "bf16")   # fpmath modes are probed on float32 only
    with pytest.raises(ArgumentError, match="no row"):
        caps.row("forward", "float64")
    with pytest.raises(ArgumentTypeError):
        caps.row("forward", 3)
    assert caps.down_converts("forward", "strict") is None


def _fake() -> Capabilities:
    return Capabilities("oneDNN", "3.2.0", "avx2", "tiny", (
        CapabilityRow("forward", "float32", "strict", ("brgconv:avx2", "x64:gemm:jit"), ("ref:any",)),
        CapabilityRow("forward", "float32", "bf16", ("brgconv:avx2",), ("ref:any",), setting="fpmath bf16",
                      down_converts=()),
        CapabilityRow("forward", "float32", "any", ("brgconv:avx512_core_amx", "brgconv:avx2"), (),
                      setting="fpmath any", down_converts=("brgconv:avx512_core_amx",)),
        CapabilityRow("forward", "bfloat16", "strict", (), (), "dnnl_unimplemented"),
        CapabilityRow("forward", "float16", "strict", (), ("ref:any",)),
        CapabilityRow("backward_weights", "bfloat16", "strict", (), (), "dnnl_unimplemented"),
    ))


def test_reasons_name_version_platform_and_status():
    c = _fake()
    assert c.reason("backward_weights", "bfloat16") == \
        "oneDNN 3.2.0 on avx2 offers no bfloat16 backward_weights convolution (dnnl_unimplemented)"
    assert c.reason("forward", "float16") == \
        "oneDNN 3.2.0 on avx2 offers only its reference implementation (ref:any) for float16 forward convolution"
    assert c.reason("forward", "float32") == \
        "oneDNN 3.2.0 on avx2 offers float32 forward convolution: brgconv:avx2, x64:gemm:jit"
    assert c.reason("forward", "float32", "bf16") == (
        "oneDNN 3.2.0 on avx2 offers float32 forward convolution with fpmath bf16: brgconv:avx2; "
        "none of them rounds inputs to bf16 (float32 arithmetic)")
    assert c.reason("forward", "float32", "any").endswith("; inputs rounded to any by brgconv:avx512_core_amx")
    assert c.down_converts("forward", "bf16") is False and c.down_converts("forward", "any") is True
    assert c.summary() == {"forward": "f32 yes, bf16 no, f16 ref only; fpmath down-converts: bf16 no, any yes",
                           "backward_weights": "bf16 no"}
    assert str(c).splitlines()[0] == "oneDNN 3.2.0 on avx2 (probe: tiny)"


def test_as_dict_is_json_with_reasons(caps):
    d = json.loads(json.dumps(caps.as_dict()))
    assert d["library"] == "oneDNN" and len(d["rows"]) == len(caps.rows)
    for row, r in zip(d["rows"], caps.rows):
        assert row["offered"] == r.offered and row["reason"] == caps.reason(r.direction, r.dtype, r.fpmath)


def test_requires_onednn_skips_with_the_reason():
    c = _fake()
    requires_onednn_fn("forward", "float32", caps=c)                    # offered: no skip
    with pytest.raises(pytest.skip.Exception, match=r"offers no bfloat16 forward convolution \(dnnl_unimplemented\)"):
        requires_onednn_fn("forward", torch.bfloat16, caps=c)
    with pytest.raises(pytest.skip.Exception, match="only its reference"):
        requires_onednn_fn("forward", "float16", caps=c)
    with pytest.raises(pytest.skip.Exception, match="none of them rounds inputs"):
        requires_onednn_fn("forward", "float32", "bf16", down_converts=True, caps=c)
    requires_onednn_fn("forward", "float32", "any", down_converts=True, caps=c)


def test_info_has_a_capabilities_section(caps):
    from rawconv.explore.info import collect

    part = collect()["capabilities"]
    assert part["onednn"]["platform"] == f"oneDNN {caps.version} on {caps.platform}"
    for d in DIRS:
        assert part["onednn"][d] == caps.summary()[d] and part["onednn"][d].startswith("f32 yes")
    if not torch.cuda.is_available():
        assert "no CUDA device" in part["cudnn"]


# ---------------------------------------------------------------- cuDNN
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU behaviour")
def test_cudnn_capabilities_without_gpu_raise_device_not_available(cudnn_lib):
    # the docs (guides/errors.md) promise DeviceNotAvailableError for a CUDA call where torch sees no GPU; this
    # raised cuDNN's LibraryError (cudnnCreate: CUDNN_STATUS_NOT_INITIALIZED) before (issue 25)
    from rawconv import cudnn
    from rawconv.errors import DeviceNotAvailableError

    with pytest.raises(DeviceNotAvailableError, match="no CUDA GPU") as ei:
        cudnn.capabilities()
    assert isinstance(ei.value, RuntimeError) and not isinstance(ei.value, LibraryError)
    with pytest.raises(ArgumentError):
        cudnn.capabilities(device=-1)


@pytest.mark.gpu
def test_cudnn_capabilities_on_a_gpu(cudnn_lib):
    from rawconv import cudnn

    c = cudnn.capabilities()
    assert c is cudnn.capabilities() and c.library == "cuDNN" and c.version.startswith("9.")
    keys = {(r.direction, r.dtype, r.fpmath) for r in c.rows}
    assert ("forward", "float32", "tf32") in keys and ("backward_weights", "float64", "strict") in keys
    for d in DIRS:
        assert c.offered(d, "float32"), c.reason(d, "float32")
        assert "cuDNN 9." in c.reason(d, "float16") and "compute capability" in c.reason(d, "float16")
    x = torch.randn(2, 16, 9, 9, device="cuda")
    w = torch.randn(24, 16, 3, 3, device="cuda")
    if c.offered("forward", "float32"):
        y = cudnn.forward(x, w, padding=1)
        torch.testing.assert_close(y, torch.nn.functional.conv2d(x.double(), w.double(), padding=1).float(),
                                   rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- the error hints are true
def _run(code: str, **env) -> subprocess.CompletedProcess:
    """Run ``code`` as a user would: output through a pipe, C stdio buffered as usual (no -u)."""
    e = {k: v for k, v in os.environ.items() if k not in ("PYTHONUNBUFFERED", "ONEDNN_VERBOSE", "ONEDNN_MAX_CPU_ISA")}
    e.update(env)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e, capture_output=True, text=True,
                          timeout=120)


def test_library_error_hint_shows_onednns_own_reason_before_the_error():
    """The hint for oneDNN's argument errors: ONEDNN_VERBOSE=check prints oneDNN's own reason; rawconv
    flushes the C stdout before raising, so the line is there even if the process then dies."""
    r = _run("""
        import os, sys
        from rawconv.onednn import _ffi as _dnnl
        from rawconv.errors import LibraryError
        L = _dnnl.lib()
        x = _dnnl.md_tag([1, 8, 6, 6], "float32", "any"); w = _dnnl.md_tag([8, 8, 3, 3], "float32", "any")
        y = _dnnl.md_tag([1, 8, 9, 9], "float32", "any")     # not the output of this convolution
        out = _dnnl.ffi.new("dnnl_primitive_desc_t *")
        try:
            _dnnl.call("dnnl_convolution_forward_primitive_desc_create", out, _dnnl.engine(),
                       L.dnnl_forward_inference, L.dnnl_convolution_direct, x, w, _dnnl.ffi.NULL, y,
                       [1, 1], [0, 0], [0, 0], [0, 0], _dnnl.attr())
        except LibraryError as e:
            sys.stdout.write("RAISED " + str(e) + "\\n"); sys.stdout.flush()
        os._exit(0)      # no exit-time flush of the C stdout: what oneDNN printed must already be out
    """, ONEDNN_VERBOSE="check")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    raised = next(i for i, ln in enumerate(lines) if ln.startswith("RAISED"))
    assert "dnnl_invalid_arguments" in lines[raised] and "ONEDNN_VERBOSE=check" in lines[raised]
    own = [ln for ln in lines[:raised] if ln.startswith("onednn_verbose") and "create:check" in ln]
    assert own and "convolution" in own[0], r.stdout


def test_not_supported_hint_says_where_the_reason_is(caps):
    """oneDNN 3.2 prints nothing for dnnl_unimplemented even with ONEDNN_VERBOSE=all (checked here:
    no create:check/dispatch line comes out); the hint therefore names the CPU ISA and
    capabilities(), whose reason says the same."""
    if not caps.version.startswith("3.2."):
        pytest.skip(f"the hint's claim is about oneDNN 3.2; loaded: {caps.version}")
    r = _run("""
        import sys, torch
        from rawconv import onednn
        from rawconv.errors import NotSupportedError
        try:
            onednn.forward(torch.randn(1, 8, 6, 6).bfloat16(), torch.randn(8, 8, 3, 3).bfloat16(), padding=1)
            print("RAN")
        except NotSupportedError as e:
            print("RAISED", e)
        print("REASON", onednn.capabilities().reason("forward", "bfloat16"))
    """, ONEDNN_VERBOSE="all", ONEDNN_MAX_CPU_ISA="AVX2")
    assert r.returncode == 0, r.stderr
    raised = [ln for ln in r.stdout.splitlines() if ln.startswith("RAISED")]
    assert raised, r.stdout
    assert "oneDNN 3.2.0 on CPU ISA avx2" in raised[0] and "capabilities()" in raised[0]
    assert "prints no reason for dnnl_unimplemented" in raised[0]
    reason = [ln for ln in r.stdout.splitlines() if ln.startswith("REASON")][0]
    assert reason == "REASON oneDNN 3.2.0 on avx2 offers no bfloat16 forward convolution (dnnl_unimplemented)"
    assert not [ln for ln in r.stdout.splitlines() if ":check" in ln or ":dispatch" in ln]
