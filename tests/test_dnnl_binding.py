"""The oneDNN declarations and loader: every declared function resolves, enum values match the
official 3.2 headers, the search order is what the docs say (run in subprocesses)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path


from rawconv.core import loader as _loader

ROOT = Path(__file__).resolve().parents[1]

# values copied by hand from oneDNN 3.2's include/oneapi/dnnl/dnnl_types.h and dnnl_common_types.h
HEADER_VALUES = {
    "dnnl_success": 0, "dnnl_out_of_memory": 1, "dnnl_invalid_arguments": 2, "dnnl_unimplemented": 3,
    "dnnl_f16": 1, "dnnl_bf16": 2, "dnnl_f32": 3, "dnnl_s32": 4, "dnnl_s8": 5, "dnnl_u8": 6, "dnnl_f64": 7,
    "dnnl_format_tag_any": 1, "dnnl_x": 2, "dnnl_nchw": 5, "dnnl_oihw": 5, "dnnl_goihw": 6, "dnnl_nhwc": 22,
    "dnnl_nwc": 15, "dnnl_ndhwc": 33,
    "dnnl_forward_training": 64, "dnnl_forward_inference": 96, "dnnl_backward_data": 160,
    "dnnl_backward_weights": 192,
    "dnnl_convolution_direct": 1, "dnnl_convolution_winograd": 2, "dnnl_convolution_auto": 3,
    "dnnl_eltwise_relu": 0x20,
    "dnnl_fpmath_mode_strict": 0, "dnnl_fpmath_mode_bf16": 1, "dnnl_fpmath_mode_f16": 2,
    "dnnl_fpmath_mode_any": 3, "dnnl_fpmath_mode_tf32": 4,
    "dnnl_scratchpad_mode_library": 0, "dnnl_scratchpad_mode_user": 1,
    "dnnl_query_impl_info_str": 8, "dnnl_query_src_md": 129, "dnnl_query_weights_md": 131,
    "dnnl_query_dst_md": 133, "dnnl_query_scratchpad_md": 136,
    "dnnl_cpu": 1, "dnnl_blocked": 2,
    "DNNL_ARG_SRC": 1, "DNNL_ARG_DST": 17, "DNNL_ARG_WEIGHTS": 33, "DNNL_ARG_BIAS": 41,
    "DNNL_ARG_SCRATCHPAD": 80, "DNNL_ARG_DIFF_SRC": 129, "DNNL_ARG_DIFF_DST": 145,
    "DNNL_ARG_DIFF_WEIGHTS": 161, "DNNL_ARG_DIFF_BIAS": 169,
}


def declared_functions(text: str) -> list[str]:
    return re.findall(r"\b(dnnl_\w+)\s*\([^;]*\);", text)


def test_cdefs_are_version_stamped_and_every_function_resolves(dnnl):
    text = _loader.cdefs_text("dnnl.h")
    assert re.search(r"oneDNN 3\.2\.0", text)
    funcs = declared_functions(text)
    assert len(funcs) >= 60
    missing = []
    for name in funcs:
        try:
            getattr(dnnl.lib, name)
        except AttributeError:
            missing.append(name)
    assert not missing, f"declared but not exported by {dnnl.path}: {missing}"


def test_enum_values_match_the_headers(dnnl):
    wrong = {k: (getattr(dnnl.lib, k), v) for k, v in HEADER_VALUES.items() if getattr(dnnl.lib, k) != v}
    assert not wrong


def _run(code: str, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    full = dict(os.environ)
    full.update(env)
    full["PYTHONPATH"] = str(ROOT) + os.pathsep + full.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", code], env=full, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_env_var_wins_and_is_recorded(dnnl, tmp_path):
    code = "import json; from rawconv.onednn import _ffi as _dnnl; l = _dnnl.load(); print(json.dumps([l.found_via, l.path]))"
    r = _run(code, {"RAWCONV_DNNL_LIBRARY": dnnl.path}, tmp_path)
    assert r.returncode == 0, r.stderr
    how, path = json.loads(r.stdout.strip().splitlines()[-1])
    assert how == "$RAWCONV_DNNL_LIBRARY" and os.path.samefile(path, dnnl.path)


def test_bad_env_var_is_an_error_not_a_fall_back(tmp_path):
    fake = tmp_path / "libdnnl.so.3"
    fake.write_bytes(b"not an ELF file")
    code = ("from rawconv.onednn import _ffi as _dnnl\n"
            "try:\n    l = _dnnl.load(); print('LOADED', l.found_via)\n"
            "except Exception as e:\n    print(type(e).__name__, [a[0] for a in e.attempts])")
    r = _run(code, {"RAWCONV_DNNL_LIBRARY": str(fake)}, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"LibraryNotFoundError ['$RAWCONV_DNNL_LIBRARY: {fake}']"   # more in test_loader.py


def test_nothing_found_lists_every_attempt(tmp_path):
    code = ("from rawconv.onednn import _ffi as _dnnl\nfrom rawconv.core import loader as _loader\n"
            "_dnnl.candidates = lambda: [('$RAWCONV_DNNL_LIBRARY', '/nonexistent/libdnnl.so.3'),"
            " ('system loader', 'libdnnl-does-not-exist.so.3')]\n"
            "try:\n    _dnnl.load()\nexcept Exception as e:\n    print(type(e).__name__); print(e)\n")
    r = _run(code, {}, tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "LibraryNotFoundError" in out and "/nonexistent/libdnnl.so.3: no such file" in out
    assert "libdnnl-does-not-exist.so.3" in out


def test_import_needs_no_native_library(tmp_path):
    code = ("import sys, rawconv\n"
            "assert 'rawconv.onednn._ffi' not in sys.modules and 'rawconv.cudnn._ffi' not in sys.modules\n"
            "p = rawconv.ConvProblem.from_benchdnn('mb1ic3ih8oc4oh8kh3ph1'); print(p.y_shape)")
    r = _run(code, {"RAWCONV_DNNL_LIBRARY": "/nonexistent.so"}, tmp_path)
    assert r.returncode == 0, r.stderr
    assert "(1, 4, 8, 8)" in r.stdout


def test_search_order_is_documented_order(monkeypatch):
    from rawconv.onednn import _ffi as _dnnl

    monkeypatch.setenv("RAWCONV_DNNL_LIBRARY", "/explicit/libdnnl.so.3")
    assert _dnnl.candidates() == [("$RAWCONV_DNNL_LIBRARY", "/explicit/libdnnl.so.3")]   # the only one
    monkeypatch.delenv("RAWCONV_DNNL_LIBRARY")
    c = _dnnl.candidates()
    assert c[0][1] == str(Path(sys.prefix) / "lib" / "libdnnl.so.3")
    assert c[-1] == ("system loader", "libdnnl.so.3")
    assert all("wheel" in how for how, _ in c[:-1])


# the enum types whose value -> name oneDNN's own *2str functions give (dnnl_debug.h), with the prefix
# their strings drop; run against whatever libdnnl is loaded (RAWCONV_DNNL_LIBRARY may name a newer
# 3.x build): a renumbered value in that build reads as another name here
_2STR = {"dnnl_status_t": ("dnnl_status2str", "dnnl_"), "dnnl_data_type_t": ("dnnl_dt2str", "dnnl_"),
         "dnnl_format_tag_t": ("dnnl_fmt_tag2str", "dnnl_"), "dnnl_prop_kind_t": ("dnnl_prop_kind2str", "dnnl_"),
         "dnnl_alg_kind_t": ("dnnl_alg_kind2str", "dnnl_"), "dnnl_format_kind_t": ("dnnl_fmt_kind2str", "dnnl_"),
         "dnnl_cpu_isa_t": ("dnnl_cpu_isa2str", "dnnl_")}
# names whose string is not the declared name in any 3.x: markers (undef, any, last, max), format kinds
# the debug function does not name, and the ISAs oneDNN 3.5+ prints under their AVX10.1 names
_NOT_NAMED = re.compile(r"_(undef|any|last|max)$|^dnnl_format_kind_(opaque|sparse)$")
_ISA_ALIASES = {"cpu_isa_avx512_core_fp16": "cpu_isa_avx10_1_512", "cpu_isa_avx512_core_amx": "cpu_isa_avx10_1_512_amx",
                "cpu_isa_avx512_core_amx_fp16": "cpu_isa_avx10_1_512_amx_fp16"}


def test_enum_values_name_the_same_thing_in_the_loaded_library(dnnl):
    from rawconv.onednn._ffi import ffi

    checked, wrong = 0, []
    for typ, (fn, pre) in _2STR.items():
        for name, value in ffi.typeof(typ).relements.items():
            if _NOT_NAMED.search(name):
                continue
            got = ffi.string(getattr(dnnl.lib, fn)(value)).decode()
            want = name[len(pre):]
            names = {want, _ISA_ALIASES.get(want, want)}
            # aliases share a value (dnnl_nchw = dnnl_abcd): any declared name of that value will do
            names |= {n[len(pre):] for n, v in ffi.typeof(typ).relements.items() if v == value}
            checked += 1
            if got not in names:
                wrong.append((name, value, got))
    assert checked > 300 and not wrong, f"{dnnl.path}: {wrong[:20]}"


def test_build_names_resolve_to_their_files(monkeypatch, tmp_path):
    from rawconv.onednn import _ffi as _dnnl

    site = tmp_path / "site-packages"
    (site / "paddle" / "libs").mkdir(parents=True)
    lib = site / "paddle" / "libs" / "libdnnl.so.3"
    lib.write_bytes(b"x")
    monkeypatch.setattr(_dnnl._loader, "site_dirs", lambda: [site])
    monkeypatch.setattr(_dnnl._loader, "prefixes", lambda: [tmp_path / "prefix"])
    monkeypatch.setenv("RAWCONV_DNNL_LIBRARY", "paddlepaddle")
    c = _dnnl.candidates()
    assert [p for _, p in c] == [str(lib.resolve())] and c[0][0].startswith("$RAWCONV_DNNL_LIBRARY=paddlepaddle")
    # a DPC++ onednn wheel's versioned file, newest first; never the 3.2 wheel's libdnnl.so.3.2
    (tmp_path / "prefix" / "lib").mkdir(parents=True)
    for v in ("3.2", "3.6", "3.13"):
        (tmp_path / "prefix" / "lib" / f"libdnnl.so.{v}").write_bytes(b"x")
    monkeypatch.setenv("RAWCONV_DNNL_LIBRARY", "onednn")
    assert [Path(p).name for _, p in _dnnl.candidates()] == ["libdnnl.so.3.13", "libdnnl.so.3.6"]
    assert {b["name"] for b in _dnnl.builds()} == set(_dnnl.BUILDS)
    # a name that is not installed: the places looked at, and loading fails naming them (no fall-back)
    monkeypatch.setattr(_dnnl._loader, "site_dirs", lambda: [tmp_path / "empty"])
    monkeypatch.setenv("RAWCONV_DNNL_LIBRARY", "paddlepaddle")
    assert [p for _, p in _dnnl.candidates()] == [str(tmp_path / "empty" / "paddle" / "libs" / "libdnnl.so.3")]


def test_a_build_name_loads_in_a_process(tmp_path):
    """RAWCONV_DNNL_LIBRARY=onednn-cpu-gomp (the default's own name) loads the same library."""
    code = ("import json; from rawconv.onednn import _ffi as _dnnl; l = _dnnl.load(); "
            "print(json.dumps([l.found_via, _dnnl.version()['version']]))")
    r = _run(code, {"RAWCONV_DNNL_LIBRARY": "onednn-cpu-gomp"}, tmp_path)
    assert r.returncode == 0, r.stderr
    how, ver = json.loads(r.stdout.strip().splitlines()[-1])
    assert how.startswith("$RAWCONV_DNNL_LIBRARY=onednn-cpu-gomp") and ver.startswith("3.")


def test_dpcpp_runtime_preload_only_for_a_folder_with_sycl(tmp_path, monkeypatch):
    from rawconv.onednn import _ffi as _dnnl

    (tmp_path / "libdnnl.so.3").write_bytes(b"x")
    monkeypatch.delenv("OCL_ICD_FILENAMES", raising=False)
    assert _dnnl._preload_runtime(str(tmp_path / "libdnnl.so.3")) == []
    assert "OCL_ICD_FILENAMES" not in os.environ
