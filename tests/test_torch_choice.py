"""rawconv.torch_choice: torch's own convolution choice (backend, oneDNN trace, cuDNN kernels) and
rawconv.torch_flags (torch's convolution flags for a block, restored)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import rawconv
from rawconv import torch_choice as tc
from rawconv.errors import ArgumentError, ArgumentTypeError

HAS_FP32_API = tc._has_fp32_api()


def direct_backend(x, w, b=None, stride=(1,), padding=(0,), dilation=(1,), transposed=False, output_padding=None,
                   groups=1) -> str:
    """torch's own answer, asked here without rawconv's argument handling."""
    nd = w.dim() - 2
    be = torch._C._select_conv_backend(x, w, b, list(stride) * (nd // len(stride)), list(padding) * (nd // len(padding)),
                                       list(dilation) * (nd // len(dilation)), transposed,
                                       list(output_padding or [0] * nd), groups)
    return tc.conv_backend_name(be)


# ---------------------------------------------------------------------------- torch_flags
def test_flags_set_inside_and_restored_after_the_block():
    before = tc.TorchFlags.current()
    with rawconv.torch_flags(mkldnn=not before.mkldnn_enabled, cudnn=not before.cudnn_enabled,
                             benchmark=not before.cudnn_benchmark, deterministic=not before.cudnn_deterministic,
                             allow_tf32=False, threads=1) as inside:
        assert torch.backends.mkldnn.enabled is (not before.mkldnn_enabled)
        assert torch.backends.cudnn.enabled is (not before.cudnn_enabled)
        assert torch.backends.cudnn.benchmark is (not before.cudnn_benchmark)
        assert torch.backends.cudnn.deterministic is (not before.cudnn_deterministic)
        assert torch.get_num_threads() == 1
        assert torch._C._get_cudnn_allow_tf32() is False
        assert inside == tc.TorchFlags.current()
        assert inside.cudnn_conv_tf32 is False
        if before.mkldnn_deterministic is not None:
            assert inside.mkldnn_deterministic is (not before.cudnn_deterministic)
    assert tc.TorchFlags.current() == before


def test_flags_restored_after_an_exception():
    before = tc.TorchFlags.current()
    with pytest.raises(KeyError, match="boom"):
        with rawconv.torch_flags(mkldnn=False, benchmark=True, threads=1, allow_tf32=not before.cudnn_allow_tf32):
            assert torch.backends.mkldnn.enabled is False
            raise KeyError("boom")
    assert tc.TorchFlags.current() == before


def test_nested_blocks_restore_their_own_values():
    before = tc.TorchFlags.current()
    with rawconv.torch_flags(mkldnn=False, threads=1):
        with rawconv.torch_flags(mkldnn=True, threads=2, deterministic=True):
            assert torch.backends.mkldnn.enabled is True and torch.get_num_threads() == 2
            assert torch.backends.cudnn.deterministic is True
        assert torch.backends.mkldnn.enabled is False and torch.get_num_threads() == 1
        assert torch.backends.cudnn.deterministic is before.cudnn_deterministic
    assert tc.TorchFlags.current() == before


def test_none_leaves_every_flag_alone():
    before = tc.TorchFlags.current()
    with rawconv.torch_flags() as inside:
        assert inside == before
    assert tc.TorchFlags.current() == before


@pytest.mark.skipif(not HAS_FP32_API, reason="this torch has no fp32_precision API (torch 2.9+)")
def test_fp32_precision_api_set_and_restored_exactly():
    before = tc.TorchFlags.current()
    with rawconv.torch_flags(cudnn_fp32_precision="ieee", mkldnn_fp32_precision="bf16") as f:
        assert torch.backends.cudnn.conv.fp32_precision == "ieee"
        assert torch.backends.mkldnn.conv.fp32_precision == "bf16"
        assert f.cudnn_conv_tf32 is False and f.mkldnn_conv_fp32_precision == "bf16"
        # the legacy flag inside a block set through the new API: conv and RNN now differ
        assert f.cudnn_allow_tf32 is None or isinstance(f.cudnn_allow_tf32, bool)
        with rawconv.torch_flags(allow_tf32=True):
            assert torch.backends.cudnn.conv.fp32_precision == "tf32"
        assert torch.backends.cudnn.conv.fp32_precision == "ieee"    # the legacy setter undone exactly
        with rawconv.torch_flags(cudnn_fp32_precision="tf32"):
            assert tc.TorchFlags.current().cudnn_conv_tf32 is True
    assert tc.TorchFlags.current() == before


def test_bad_values_raise_before_anything_changes():
    before = tc.TorchFlags.current()
    with pytest.raises(ArgumentError, match="threads"):
        with rawconv.torch_flags(mkldnn=False, threads=0):
            pass
    with pytest.raises(ArgumentError, match="threads"):
        with rawconv.torch_flags(threads=True):
            pass
    with pytest.raises(ArgumentTypeError, match="mkldnn"):
        with rawconv.torch_flags(mkldnn="yes"):
            pass
    if HAS_FP32_API:
        with pytest.raises(ArgumentError, match="cudnn_fp32_precision"):
            with rawconv.torch_flags(benchmark=True, cudnn_fp32_precision="bf16"):   # cuDNN has no bf16 mode
                pass
        with pytest.raises(ArgumentTypeError):
            with rawconv.torch_flags(mkldnn_fp32_precision=16):
                pass
    assert tc.TorchFlags.current() == before


def test_mkldnn_off_moves_torch_off_onednn():
    x, w = torch.randn(1, 16, 12, 12), torch.randn(16, 16, 3, 3)
    with rawconv.torch_flags(mkldnn=False):
        c = rawconv.torch_choice(x, w, padding=1)
        assert c.backend == direct_backend(x, w, padding=(1,))
    assert c.backend not in tc.ONEDNN_BACKENDS
    assert c.convolution is None and not c.flags.mkldnn_enabled
    assert "mkldnn off" in str(c)


# ---------------------------------------------------------------------------- torch_choice on the CPU
@pytest.mark.parametrize("threads", [1, 2])
def test_c4_backend_follows_the_thread_count(threads):
    """shared/cases C4: Conv1d(64,64,1) on ones (8,64,64); torch picks Mkldnn with 2 threads and
    Slow2d with 1 (torch 2.13-2.14): torch_choice reports what torch's own selector says under
    each thread count, and on Mkldnn the oneDNN implementation torch's oneDNN ran."""
    torch.manual_seed(0)
    conv = torch.nn.Conv1d(64, 64, 1)
    x = torch.ones(8, 64, 64)
    with rawconv.torch_flags(threads=threads):
        assert torch.get_num_threads() == threads
        expected = direct_backend(x, conv.weight, conv.bias)
        c = rawconv.torch_choice(x, conv.weight, conv.bias)
    assert c.backend == expected
    assert c.flags.threads == threads
    assert c.problem == "1d float32 nchw x(8,64,64) w(64,64,1) bias"
    if c.backend == "Mkldnn":
        conv_run = c.convolution
        assert conv_run is not None and conv_run.impl and conv_run.prop_kind.startswith("forward")
        # torch runs Conv1d as a 2-D convolution of height 1: the shape oneDNN reports says so
        assert "mb8_ic64oc64" in conv_run.shape and "kw1" in conv_run.shape
        assert f"oneDNN {conv_run.impl}" in str(c)
    else:
        assert c.convolution is None and "torch's own code" in str(c)


def test_backend_agrees_with_torch_on_several_calls():
    cases = [
        (torch.randn(2, 8, 10, 10), torch.randn(16, 8, 3, 3), {"padding": 1}, {"padding": (1,)}),
        (torch.randn(2, 8, 10, 10), torch.randn(8, 1, 3, 3), {"padding": 1, "groups": 8},
         {"padding": (1,), "groups": 8}),
        (torch.randn(1, 4, 6, 6, 6), torch.randn(4, 4, 3, 3, 3), {"stride": 2}, {"stride": (2,)}),
        (torch.randn(2, 8, 10, 10), torch.randn(16, 8, 3, 3), {"dilation": 2}, {"dilation": (2,)}),
    ]
    for x, w, kw, dkw in cases:
        c = rawconv.torch_choice(x, w, **kw)
        assert c.backend == direct_backend(x, w, **dkw), kw
        assert isinstance(c.backend_index, int)
        assert (c.convolution is not None) == (c.backend in tc.ONEDNN_BACKENDS), (kw, c)


def test_asymmetric_padding_runs_as_torch_would_pad():
    x, w = torch.randn(1, 8, 9, 9), torch.randn(8, 8, 3, 3)
    c = rawconv.torch_choice(x, w, padding=[(0, 1), (1, 0)])
    xp = F.pad(x, (1, 0, 0, 1))
    assert c.backend == direct_backend(xp, w)
    assert "p0/1,1/0" in c.problem


def test_transposed_backend_agrees_with_torch():
    for dtype in (torch.float32, torch.bfloat16):
        x, w = torch.randn(1, 16, 8, 8, dtype=dtype), torch.randn(16, 8, 3, 3, dtype=dtype)
        try:
            c = rawconv.torch_choice(x, w, stride=2, padding=1, output_padding=1, transposed=True)
        except RuntimeError as exc:    # torch itself may refuse bf16 transposed on a CPU without it
            pytest.skip(f"torch cannot run this transposed convolution here: {exc}")
        expected = direct_backend(x, w, stride=(2,), padding=(1,), transposed=True, output_padding=[1, 1])
        assert c.backend == expected
        assert c.problem.startswith("transposed ") and "x(1,16,8,8)" in c.problem
        if c.backend in tc.ONEDNN_BACKENDS:
            assert c.convolution is not None


def test_unnamed_backend_values_get_their_names():
    class Fake:      # what torch's binding gives for MkldnnTranspose (9): no name
        def __str__(self):
            return "_ConvBackend.???"

        def __int__(self):
            return 9

    assert tc.conv_backend_name(Fake()) == "MkldnnTranspose"
    assert tc.conv_backend_name(torch._C._ConvBackend.Mkldnn) == "Mkldnn"
    assert tc.CONV_BACKENDS[int(torch._C._ConvBackend.Slow2d)] == "Slow2d"
    assert tc.CONV_BACKENDS[int(torch._C._ConvBackend.Xnnpack2d)] == "Xnnpack2d"


def test_onednn_match_names_rawconv_implementations(dnnl):
    from rawconv import onednn

    x, w = torch.randn(1, 64, 28, 28), torch.randn(64, 64, 3, 3)    # torch 2.14 runs this on oneDNN
    with rawconv.torch_flags(threads=2):
        c = rawconv.torch_choice(x, w, padding=1)
    if c.convolution is None:
        pytest.skip(f"torch did not run oneDNN here ({c.backend})")
    names = {im.name for im in onednn.implementations(x, w, padding=1)}
    if c.matches:
        assert c.match in ("same name and layouts", "same name")
        assert all(m.split("@")[0] in names for m in c.matches)
        assert tc._normalize_impl(c.convolution.impl) in names
    else:
        assert c.match == "none" and tc._normalize_impl(c.convolution.impl) not in names


def test_bad_input_raises_before_running():
    x, w = torch.randn(1, 8, 6, 6), torch.randn(8, 8, 3, 3)
    with pytest.raises(ArgumentError):
        rawconv.torch_choice(x, torch.randn(8, 4, 3, 3))          # channel mismatch
    with pytest.raises(ArgumentTypeError):
        rawconv.torch_choice(x.numpy(), w)
    with pytest.raises(ArgumentError, match="output_padding"):
        rawconv.torch_choice(x, w, output_padding=1)
    with pytest.raises(ArgumentError, match="string"):
        rawconv.torch_choice(x, w, padding="same", transposed=True)
    with pytest.raises(ArgumentError, match="output_padding"):
        rawconv.torch_choice(x, w, stride=1, output_padding=1, transposed=True)
    with pytest.raises(ArgumentError, match="limit"):
        rawconv.torch_choice(x, w, limit=0)


def test_str_and_as_dict_are_json_friendly():
    x, w = torch.randn(2, 8, 10, 10), torch.randn(8, 8, 3, 3)
    c = rawconv.torch_choice(x, w, padding=1)
    s = str(c)
    assert "\n" not in s and s.startswith(c.backend + ":")
    d = json.loads(json.dumps(c.as_dict()))
    assert d["backend"] == c.backend and d["summary"] == s
    assert d["flags"]["threads"] == c.flags.threads
    assert len(d["onednn"]) == len(c.onednn)


def test_module_is_callable_and_exports():
    import rawconv.torch_choice as mod

    assert rawconv.torch_choice is mod and callable(mod)
    assert rawconv.torch_flags is mod.torch_flags and rawconv.TorchChoice is mod.TorchChoice
    x, w = torch.randn(1, 4, 5, 5), torch.randn(4, 4, 3, 3)
    assert mod(x, w).backend == mod.torch_choice(x, w).backend


# ---------------------------------------------------------------------------- the oneDNN trace
def test_trace_restores_stdout_and_passes_other_output_through(capfd):
    x, w = torch.randn(1, 16, 8, 8), torch.randn(16, 16, 3, 3)

    def fn():
        os.write(1, b"not onednn\n")
        return F.conv2d(x, w)

    with rawconv.torch_flags(threads=2):
        runs = tc.torch_onednn_trace(fn)
    os.write(1, b"after\n")
    out = capfd.readouterr().out
    assert "not onednn" in out and "after" in out and "onednn_verbose" not in out
    assert all({"kind", "impl", "formats"} <= set(r) for r in runs)


def test_trace_restores_stdout_when_the_call_raises(capfd):
    def fn():
        os.write(1, b"x")
        raise ValueError("inside")

    with pytest.raises(ValueError, match="inside"):
        tc.torch_onednn_trace(fn)
    os.write(1, b"still here\n")
    assert "still here" in capfd.readouterr().out


def test_trace_with_stdout_closed_in_a_child():
    code = textwrap.dedent("""
        import os, sys, torch
        from rawconv import torch_choice as tc
        torch.set_num_threads(2)
        x, w = torch.randn(1, 16, 8, 8), torch.randn(16, 16, 3, 3)
        os.close(1)
        runs = tc.torch_onednn_trace(lambda: torch.nn.functional.conv2d(x, w), records=True)
        try:
            os.fstat(1)
            closed = False
        except OSError:
            closed = True
        sys.stderr.write(f"closed={closed} convs={sum(r.kind == 'convolution' for r in runs)} "
                         f"backend={tc.select_backend(x, w)}\\n")
        sys.stdout = None
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(rawconv.__file__))]
                                                      + sys.path))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert "closed=True" in line
    backend = line.split("backend=")[1]
    assert ("convs=1" in line) == (backend == "Mkldnn"), line


def test_parse_onednn_verbose_both_versions():
    v312 = ("onednn_verbose,v1,primitive,exec,cpu,convolution,jit:avx512_core,forward_training,"
            "src:f32:a:blocked:aBcd16b::f0 wei:f32:a:blocked:ABcd16b16a::f0 bia:undef::undef::: "
            "dst:f32:a:blocked:aBcd16b::f0,attr-scratchpad:user,alg:convolution_direct,"
            "mb1_ic64oc64_ih56oh56kh3sh1dh0ph1_iw56ow56kw3sw1dw0pw1,8.9292")
    v32 = ("onednn_verbose,exec,cpu,convolution,brgconv:avx2,forward_training,src_f32::blocked:acdb:f0 "
           "wei_f32::blocked:Acdb16a:f0 bia_undef::undef::f0 dst_f32::blocked:acdb:f0,,alg:convolution_direct,"
           "mb2_ic64oc64_ih56oh56kh3sh1dh0ph1_iw56ow56kw3sw1dw0pw1,1.25")
    noise = "onednn_verbose,info,cpu,runtime:OpenMP\nhello\n"
    runs = tc.parse_onednn_verbose("\n".join([noise, v312, v32]))
    assert [r.impl for r in runs] == ["jit:avx512_core", "brgconv:avx2"]
    assert runs[0].format_tags() == {"src": "aBcd16b", "wei": "ABcd16b16a", "bia": "", "dst": "aBcd16b"}
    assert runs[1].format_tags()["src"] == "acdb" and runs[1].format_tags()["wei"] == "Acdb16a"
    assert runs[0].time_ms == pytest.approx(8.9292) and runs[1].time_ms == pytest.approx(1.25)
    assert runs[0].shape.startswith("mb1_ic64") and runs[0].alg == "alg:convolution_direct"
    assert tc.trace_detail([dataclass_dict(r) for r in runs]).startswith(
        "; torch's oneDNN ran jit:avx512_core (src aBcd16b, weights ABcd16b16a) + 0 reorder(s)")
    assert tc._normalize_impl("brg_conv_fwd:avx512_core") == "brgconv:avx512_core"
    assert tc._normalize_impl("jit_1x1:avx2") == "jit_1x1:avx2"


def dataclass_dict(r):
    import dataclasses

    return dataclasses.asdict(r)


# ---------------------------------------------------------------------------- kernel matching, cuDNN log (no GPU)
def test_match_kernels_by_set_then_main_kernel():
    K = tc.CandidateKernels
    helper = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>"
    cands = [K("cudnn_graph", "eng0", ("sm90_a", "nhwcToNchw")), K("cudnn_graph", "eng1{k2=1}", ("sm90_a",)),
             K("cudnn", "IMPLICIT_PRECOMP_GEMM@tensor_op", ("sm90_a", helper)),
             K("cudnn_graph", "eng9", (), error="NotSupportedError: no")]
    assert tc.match_kernels(["sm90_a", helper], cands) == ("same kernels", ("eng1{k2=1}",
                                                                           "IMPLICIT_PRECOMP_GEMM@tensor_op"))
    assert tc.match_kernels(["sm90_a", "other"], cands, main_kernel="sm90_a") == (
        "main kernel", ("eng0", "eng1{k2=1}", "IMPLICIT_PRECOMP_GEMM@tensor_op"))
    assert tc.match_kernels(["sm80_b"], cands, main_kernel="sm80_b") == ("none", ())
    assert tc.match_kernels([helper], cands) == ("", ())


def test_narrow_by_the_engine_or_algo_cudnn_logged():
    K = tc.CandidateKernels
    cands = [K("cudnn_graph", "eng0", ("a",), 0), K("cudnn_graph", "eng5{k2=1}", ("a",), 5),
             K("cudnn", "IMPLICIT_GEMM@fma", ("a",)), K("cudnn", "ALGO_1@fma", ("a",))]
    ms = ("eng0", "eng5{k2=1}", "IMPLICIT_GEMM@fma", "ALGO_1@fma")
    assert tc._narrow(ms, "same kernels", cands, {"engines": (5,)}) == (("eng5{k2=1}",), "same kernels, engine")
    assert tc._narrow(ms, "same kernels", cands, {"engines": (7,)}) == (ms, "same kernels")
    assert tc._narrow(ms, "x", cands, {"algos": ("ALGO_1",)}) == (("ALGO_1@fma",), "x, algo")


def test_split_segments_between_separators():
    ev = [(0, "spin_kernel(long)", 1), (1, "k1", 2), (2, "k2", 3), (3, "spin_kernel(long)", 1),
          (4, "spin_kernel(long)", 1), (5, "k3", 4), (6, "spin_kernel(long)", 1)]
    assert tc._split_segments(ev, 3) == [[("k1", 2), ("k2", 3)], [], [("k3", 4)]]
    assert tc._split_segments(ev, 2) is None
    assert tc._split_segments([(0, "k", 1)], 1) is None


def test_cuda_events_are_kernels_in_gpu_order():
    from types import SimpleNamespace as NS

    CUDA, CPU = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
    evs = [NS(device_type=CUDA, name="k2", time_range=NS(start=5.0, end=9.0)),
           NS(device_type=CPU, name="cudaLaunchKernel", time_range=NS(start=0.0, end=1.0)),
           NS(device_type=CUDA, name="k1", time_range=NS(start=2.0, end=3.5))]
    prof = NS(events=lambda: evs)
    assert tc._cuda_events(prof) == [(2.0, "k1", 1.5), (5.0, "k2", 4.0)]


def test_parse_cudnn_log_reads_engines_from_execute_only():
    execute = ["CuDNN (v91900 1) function cudnnBackendExecute() called:",
               "    handle: type=cudnnHandle_t; streamId=0x0;",
               "    executionPlan: type=CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:",
               "        engcfg: type=CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:",
               "            engine: type=CUDNN_BACKEND_ENGINE_DESCRIPTOR:",
               "                engine_id: type=int; val=42;",
               "Time: 2026-12-01T00:00:00 (0d+0h+0m+0s since start)"]
    setattr_ = ["CuDNN (v91900 1) function cudnnBackendSetAttribute() called:",
                "    descriptor: type=CUDNN_BACKEND_ENGINE_DESCRIPTOR:",
                "        engine_id: type=int; val=7;"]
    unset = ["CuDNN (v91900 1) function cudnnBackendExecute() called:", "        engine_id: type=int; val=-1;"]
    legacy = ["CuDNN (v91900 1) function cudnnConvolutionForward() called:",
              "    algo: type=cudnnConvolutionFwdAlgo_t; val=CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM (1);"]
    bwd = ["CuDNN (v91900 1) function cudnnConvolutionBackwardData() called:",
           "    algo: type=cudnnConvolutionBwdDataAlgo_t; val=CUDNN_CONVOLUTION_BWD_DATA_ALGO_1 (1);"]
    got = tc.parse_cudnn_log([setattr_, execute, unset, execute, legacy, bwd, []])
    assert got["functions"] == ("cudnnBackendSetAttribute", "cudnnBackendExecute", "cudnnConvolutionForward",
                                "cudnnConvolutionBackwardData")
    assert got["engines"] == (42,)
    assert got["algos"] == ("IMPLICIT_PRECOMP_GEMM", "ALGO_1")


def test_cudnn_api_log_reads_whole_messages(cudnn_lib):
    """cudnnSetCallback through rawconv's cffi: whole messages (NUL-separated lines), and the
    callback that was set before is back afterwards. Descriptor calls need no GPU."""
    from rawconv.cudnn import _ffi as _cudnn
    from rawconv.cudnn.graph import _backend_api as B

    import threading

    with tc.cudnn_api_log() as log:
        d = B.Descriptor("ENGINE")
        d.set("ENGINE_GLOBAL_INDEX", "INT64", 7)
        t = threading.Thread(target=lambda: B.Descriptor("ENGINE").set("ENGINE_GLOBAL_INDEX", "INT64", 8))
        t.start()
        t.join()
    assert log.available, log.error
    parsed = tc.parse_cudnn_log(log.messages)
    assert "cudnnBackendCreateDescriptor" in parsed["functions"]
    assert "cudnnBackendSetAttribute" in parsed["functions"]
    text = "\n".join("\n".join(m) for m in log.messages)
    assert "CUDNN_ATTR_ENGINE_GLOBAL_INDEX" in text and "val=7;" in text
    assert "val=8;" not in text                     # another thread's calls are not this call's
    assert all(len(m) > 1 for m in log.messages)     # more than the header line of each message
    ffi = _cudnn.ffi
    mask, udata, fptr = ffi.new("unsigned *"), ffi.new("void **"), ffi.new("cudnnCallback_t *")
    assert _cudnn.lib().cudnnGetCallback(mask, udata, fptr) == 0
    assert fptr[0] == ffi.NULL
    n = len(log.messages)
    B.Descriptor("ENGINE")
    assert len(log.messages) == n            # nothing recorded after the block


# ---------------------------------------------------------------------------- the report
def test_report_cli_on_cpu(tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = tc.main(["--report", "resnet50", "--batch", "1", "--threads", "2", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert text.splitlines()[-1].startswith(tuple(f"{n} of 23 layers" for n in range(24)))
    data = json.loads(out.read_text())
    assert len(data["layers"]) == 23 and data["device"] == "cpu"
    from rawconv import presets

    with rawconv.torch_flags(threads=2):
        for p, layer in zip(presets.resnet50(1), data["layers"]):
            x, w, _ = p.make_inputs()
            assert layer["choice"]["backend"] == tc.select_backend(x, w, None, p.stride, p.pad_before)
            assert layer["choice"]["flags"]["threads"] == 2
            has_conv = any(r["kind"] == "convolution" for r in layer["choice"]["onednn"])
            assert has_conv == (layer["choice"]["backend"] == "Mkldnn")


def test_compare_cpu_row_still_names_torchs_onednn():
    from rawconv import compare
    from rawconv.problem import ConvProblem

    p = ConvProblem(n=1, c=16, k=16, in_spatial=(10, 10), kernel=(3, 3), pad_before=(1, 1), pad_after=(1, 1))
    x, w, b = p.make_inputs()
    with rawconv.torch_flags(threads=2, mkldnn=True):
        backend = compare.torch_backend(p, x, w, b)
        rows = compare._torch_rows(p, x, w, b, p.reference(x, w), p.reference(x.abs(), w.abs()),
                                   lambda fn: compare.time_cpu(fn, iterations=2, warmup=1))
    assert rows[0].detail.startswith(backend)
    assert ("torch's oneDNN ran" in rows[0].detail) == (backend == "Mkldnn")
    assert rows[0].ok


# ---------------------------------------------------------------------------- GPU
def _layer(dtype=torch.float16, layout="nhwc"):
    from rawconv import presets

    p = [q for q in presets.resnet50(8, dtype={torch.float16: "float16", torch.float32: "float32"}[dtype],
                                     layout=layout) if q.name == "layer1.0.conv2"][0].with_(device="cuda")
    x, w, _ = p.make_inputs()
    return p, x, w


@pytest.mark.gpu
def test_gpu_torch_kernel_maps_to_a_candidate_that_runs_the_same_kernel():
    from rawconv import cudnn
    from rawconv.check import compare_to_reference

    p, x, w = _layer()
    c = rawconv.torch_choice(x, w, None, p.stride, p.pad_before)
    assert c.backend == "Cudnn", c
    assert c.kernels and c.main_kernel in c.kernels
    assert any(not k.error for k in c.candidates)
    assert c.match in ("same kernels", "same kernels, engine", "same kernels, algo", "main kernel",
                       "main kernel, engine", "main kernel, algo", "none")
    json.dumps(c.as_dict())
    if not c.matches:
        pytest.skip(f"torch's kernel maps to no listed config here: {c}")
    # pinning the matched candidate runs torch's kernel, and the result is right
    choice = c.matches[0]
    y = cudnn.forward(x, w, padding=p.pad_before, choice=choice)
    ks = tc._profile_each([lambda: cudnn.forward(x, w, padding=p.pad_before, choice=choice)])[0]
    assert c.main_kernel in {n for n, _ in ks}
    ref = p.reference(x.cpu(), w.cpu())
    assert compare_to_reference(p, y, ref, p.reference(x.cpu().abs(), w.cpu().abs())).ok


@pytest.mark.gpu
def test_gpu_cudnn_log_sees_torchs_calls():
    p, x, w = _layer()
    c = rawconv.torch_choice(x, w, None, p.stride, p.pad_before, candidates=False)
    assert c.cudnn_functions, c.notes
    assert {"cudnnBackendExecute", "cudnnConvolutionForward"} & set(c.cudnn_functions), c.cudnn_functions
    if "cudnnBackendExecute" in c.cudnn_functions:
        assert c.cudnn_engines and all(e >= 0 for e in c.cudnn_engines)


@pytest.mark.gpu
def test_gpu_flags_change_torchs_backend_and_kernel():
    p, x, w = _layer(torch.float32, "nchw")
    with rawconv.torch_flags(cudnn=False):
        off = rawconv.torch_choice(x, w, None, p.stride, p.pad_before)
        assert off.backend == tc.select_backend(x, w, None, p.stride, p.pad_before)
    assert off.backend != "Cudnn" and not off.matches
    with rawconv.torch_flags(benchmark=True, allow_tf32=False):
        on = rawconv.torch_choice(x, w, None, p.stride, p.pad_before)
    assert on.backend == "Cudnn" and on.flags.cudnn_benchmark and on.flags.cudnn_conv_tf32 is False


@pytest.mark.gpu
def test_gpu_transposed():
    x = torch.randn(4, 32, 14, 14, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    w = torch.randn(32, 16, 3, 3, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    c = rawconv.torch_choice(x, w, stride=2, padding=1, output_padding=1, transposed=True)
    assert c.backend == "CudnnTranspose" and c.kernels
    assert any(not k.error for k in c.candidates)


@pytest.mark.gpu
def test_gpu_compare_row_names_torchs_kernel():
    from rawconv import compare

    p, x, w = _layer()
    assert tc.compare_detail(p, x, w, None).startswith("; torch ran ")
    rows = compare.compare_problem(p.with_(n=2), iterations=2, warmup=1, budget_s=0.2, backends=("torch",))
    default = [r for r in rows if r.backend == "torch" and r.implementation == "default"]
    assert default and "; torch ran " in default[0].detail, [r.detail for r in rows]


def test_cuda_path_logic_with_fake_libraries(monkeypatch):
    """The CUDA route's bookkeeping (warm-up, profiled call under the API log, candidates built,
    profiled between separators, matched, narrowed to the logged engine, cached) on fakes: the
    profiler, the cuDNN plans and the API log are replaced; the real ones run in the gpu tests."""
    from types import SimpleNamespace as NS

    from rawconv import cudnn as cd
    from rawconv import cudnn_graph as cg

    launched: list = []
    kernels_of = {"IMPLICIT_PRECOMP_GEMM@tensor_op": ["sm90_a", "at::native::copy"], "ALGO_1@fma": ["sm80_b"],
                  "eng0": ["sm90_a"], "eng5{k2=1}": ["sm90_a"], "eng7": ["sm90_c"]}

    class FakeLegacy:
        freed = False

        def algorithms(self, mode, math):
            assert (mode, math) == ("heuristic", "all")
            return [NS(ok=True, choice="IMPLICIT_PRECOMP_GEMM@tensor_op"), NS(ok=False, choice="FFT@fma"),
                    NS(ok=True, choice="ALGO_1@fma")]

        def select(self, choice):
            self.cur = choice.choice

        def execute(self, x=None, w=None, grad_y=None):
            launched.extend(kernels_of[self.cur])

        def free(self):
            FakeLegacy.freed = True

    class FakeGraph:
        def engines(self, heuristic, limit=16, finalize=True):
            assert finalize is False
            if heuristic == "all":
                return [NS(name="eng0", engine=0, behavior_notes=()), NS(name="eng7", engine=7, behavior_notes=()),
                        NS(name="eng9", engine=9, behavior_notes=("RUNTIME_COMPILATION",))]
            return [NS(name="eng5{k2=1}", engine=5, behavior_notes=()), NS(name="eng0", engine=0, behavior_notes=())]

        def _select(self, ec, warn=True):
            assert ec.name != "eng9", "runtime-compiled default-knob engines are left out"
            self.cur = ec.name

        def execute(self, x=None, w=None, grad_y=None):
            launched.extend(kernels_of[self.cur])

        def free(self):
            pass

    def fake_profile(fns, *, separators=True):
        segs = []
        for fn in fns:
            launched.clear()
            fn()
            segs.append([(n, 10.0 if n.startswith("sm") else 1.0) for n in launched])
        return segs

    class FakeLog:
        available, error = True, ""

        def __init__(self):
            self.messages = []

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.messages.append(["CuDNN (v91900 1) function cudnnBackendExecute() called:",
                                  "                engine_id: type=int; val=5;"])
            return False

    monkeypatch.setattr(cd.Convolution, "from_problem", classmethod(lambda cls, p, **kw: FakeLegacy()))
    monkeypatch.setattr(cg.GraphConvolution, "from_problem", classmethod(lambda cls, p, **kw: FakeGraph()))
    monkeypatch.setattr(tc, "_profile_calls", fake_profile)
    monkeypatch.setattr(tc, "cudnn_api_log", FakeLog)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    tc._cand_cache.clear()

    x, w = torch.randn(2, 8, 6, 6), torch.randn(8, 8, 3, 3)
    c = tc._call_of(x, w, None, 1, 1, 1, 1, False, 0)
    c.run = lambda: launched.extend(["at::native::fill", "sm90_a"])
    notes: list = []
    ch = tc._cuda_choice(c, tc.TorchFlags.current(), "Cudnn", 2, True, 8, True, notes)
    assert ch.kernels == ("at::native::fill", "sm90_a") and ch.main_kernel == "sm90_a"
    assert ch.cudnn_functions == ("cudnnBackendExecute",) and ch.cudnn_engines == (5,)
    by_choice = {k.choice: k for k in ch.candidates}
    assert set(by_choice) == {"IMPLICIT_PRECOMP_GEMM@tensor_op", "ALGO_1@fma", "eng5{k2=1}", "eng0", "eng7"}
    assert by_choice["eng5{k2=1}"].kernels == ("sm90_a",) and by_choice["eng5{k2=1}"].engine == 5
    # same kernel set: the legacy row, eng5 and eng0; the log's engine 5 narrows it to eng5
    assert ch.match == "same kernels, engine" and ch.matches == ("eng5{k2=1}",)
    assert FakeLegacy.freed and notes == []
    assert "eng5{k2=1}" in str(ch) and "[engine 5]" in str(ch)
    json.dumps(ch.as_dict())
    # cached per problem: a second call profiles no candidate again
    monkeypatch.setattr(cd.Convolution, "from_problem", classmethod(lambda cls, p, **kw: 1 / 0))
    again = tc._cuda_choice(c, tc.TorchFlags.current(), "Cudnn", 2, True, 8, True, [])
    assert again.candidates == ch.candidates
    tc._cand_cache.clear()
