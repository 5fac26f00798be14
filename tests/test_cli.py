"""The command line, run as a user runs it (a subprocess), on small problems."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def rawconv(*args, cwd=None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "rawconv", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=600)


def test_compare_benchdnn_problem_writes_json(tmp_path):
    out = tmp_path / "r.json"
    r = rawconv("compare", "mb2ic8ih12oc8oh12kh3ph1", "--iterations", "2", "--json", str(out), "--width", "120",
                cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "summary: 1 problem(s)" in r.stdout
    lines = r.stdout.splitlines()
    assert max(map(len, lines)) <= 120
    for row in json.loads(out.read_text())["rows"]:   # at 120 columns names do not wrap
        assert any(ln.startswith(row["backend"]) and row["implementation"] in ln for ln in lines), row
    data = json.loads(out.read_text())
    rows = data["rows"]
    backends = {row["backend"] for row in rows}
    assert backends == {"torch", "onednn"}
    impls = [row["implementation"] for row in rows if row["backend"] == "onednn"]
    assert any("ref:any" in i for i in impls) and len(impls) >= 3
    assert all(row["ok"] for row in rows), [row for row in rows if not row["ok"]]
    assert all(row["median_ms"] > 0 for row in rows)
    torch_default = next(row for row in rows if row["implementation"] == "default")
    assert torch_default["detail"]   # which backend torch picked
    assert data["summary"]["within_tolerance"] == len(rows)
    assert data["meta"]["info"]["onednn"]["version"].startswith("3.")
    assert data["problems"][0]["benchdnn"].startswith("mb2ic8ih12iw12oc8") and data["meta"]["threads"] >= 1
    assert all(row["extra"]["problem"] == data["problems"][0]["describe"] for row in rows)


def test_compare_flags_and_preset_layer_with_photo(tmp_path):
    out = tmp_path / "p.json"
    r = rawconv("compare", "--input", "1x4x9x9", "--weight", "6x4x3x3", "--padding", "0:1,1:0", "--stride", "2",
                "--iterations", "1", "--no-ref", "--json", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(out.read_text())["summary"]["problems"] == 1
    r = rawconv("compare", "resnet50", "--layers", "conv1", "--iterations", "1", "--budget", "0.05", "--no-ref",
                "--layout", "nhwc", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "input is matplotlib's sample photo" in r.stdout and "conv1" in r.stdout


def test_info_json():
    r = rawconv("info", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["onednn"]["path"].endswith("libdnnl.so.3") and data["onednn"]["found_via"]
    assert "version" in data["torch"] and "cudnn" in data


def test_list_implementations():
    r = rawconv("list", "mb1ic16ih10oc16oh10kh3ph1", "--direction", "backward_data")
    assert r.returncode == 0, r.stderr
    assert "ref:any" in r.stdout and "backward_data" in r.stdout


@pytest.mark.parametrize("args, words", [
    (["compare", "mb2ic8ih12oc8oh12kh3ph1zz"], "cannot parse"),
    (["compare", "--input", "2x4x8x8", "--weight", "4x3x3x3"], "input channels"),
    (["compare", "--input", "2x4x8x8"], "--input and --weight"),
    (["compare", "resnet50", "--layers", "nosuchlayer"], "matches none"),
    (["list", "mb1ic16ih10oc16oh10kh3ph1", "--direction", "sideways"], "expected forward, backward_data"),
])
def test_bad_cli_input_is_a_message_not_a_traceback(args, words):
    r = rawconv(*args)
    assert r.returncode == 2
    assert words in r.stderr and "Traceback" not in r.stderr


def _run(*args, env_extra=None):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("COLUMNS", None)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "rawconv", *args], capture_output=True, text=True, env=env,
                          timeout=600)


@pytest.mark.parametrize("cmd", [["compare", "mb1ic4ih6oc4oh6kh3ph1"], ["list", "mb1ic4ih6oc4oh6kh3ph1"], ["info"]])
@pytest.mark.parametrize("width", ["59", "0", "-80", "wide"])
def test_width_below_the_minimum_is_a_usage_error(cmd, width, capsys):
    from rawconv.cli import build_parser

    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args([*cmd, "--width", width])
    assert exc.value.code == 2 and "--width" in capsys.readouterr().err
    assert build_parser().parse_args([*cmd, "--width", "60"]).width == 60


@pytest.mark.parametrize("how", ["--width", "COLUMNS"])
def test_every_subcommand_fits_80_columns_through_a_pipe(tmp_path, how):
    """compare and info with --width 80, list with COLUMNS=80 or --width 80: every line fits, and
    every number of the JSON's rows appears whole on its row's line."""
    tiny = ["mb1ic8ih10oc8oh10kh3ph1"]
    width = ["--width", "80"] if how == "--width" else []
    env = {"COLUMNS": "80"} if how == "COLUMNS" else None
    if how == "--width":
        out = tmp_path / "r.json"
        r = _run("compare", *tiny, "--iterations", "2", "--warmup", "0", "--budget", "0.05", "--json", str(out),
                 *width)
        assert r.returncode == 0, r.stdout + r.stderr
        lines = r.stdout.splitlines()
        assert max(map(len, lines)) <= 80, r.stdout
        from rawconv.cli import _fmt_err, fmt_ms, _fmt_spread

        rows = json.loads(out.read_text())["rows"]
        table = lines[: next(i for i, ln in enumerate(lines) if ln.startswith("summary:"))]
        firsts = [ln for ln in table if ln.startswith(("torch ", "onednn "))]   # each row's first line, in order
        assert len(firsts) == len(rows), r.stdout
        for row, line in zip(rows, firsts):
            # the name (a candidate's one name, "brgconv:avx512_core@any") whole, or its part before a wrap
            name = row["implementation"].split()[0]
            assert line.startswith(row["backend"]) and any(len(t) >= 3 and name.startswith(t)
                                                          for t in line.split()[1:]), (row, line)
            if row["status"] in ("ok", "wrong"):
                toks = line.split()
                assert fmt_ms(row["median_ms"]) in toks and fmt_ms(row["min_ms"]) in toks, line
                assert _fmt_err(row["max_rel"]) in toks, line
                if row["spread"] is not None:
                    assert _fmt_spread(row["spread"]) in toks, line
        r = _run("info", *width)
        assert r.returncode == 0 and max(map(len, r.stdout.splitlines())) <= 80, r.stdout
    r = _run("list", *tiny, *width, env_extra=env)
    assert r.returncode == 0 and max(map(len, r.stdout.splitlines())) <= 80, r.stdout
    assert "ref:any" in r.stdout


def test_help_documents_exit_codes_threads_and_width(capsys):
    from rawconv.cli import build_parser
    from rawconv.compare import EXIT_CODES

    with pytest.raises(SystemExit):
        build_parser().parse_args(["compare", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "exit status (when several apply" in text
    for code, meaning in EXIT_CODES.items():
        assert f"{code} {meaning}" in text
    assert "affinity" in text and "--ref-limit" in text and "at least 60" in text


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float64"])
def test_a_dtype_onednn_cannot_run_here_is_refused_up_front(tmp_path, dtype):
    # ONEDNN_MAX_CPU_ISA=AVX2: oneDNN 3.2 then offers no bf16 / f16 convolution (as on a real AVX2
    # CPU), and no float64 anywhere: compare refuses before timing anything (it ran torch's rows
    # and listed every oneDNN row "not supported", exit 3), in the words of onednn.capabilities()
    out = tmp_path / "r.json"
    r = _run("compare", "mb1ic8ih10oc8oh10kh3ph1", "--dtype", dtype, "--iterations", "1", "--warmup", "0",
             "--width", "80", "--json", str(out), "--device", "cpu", env_extra={"ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout == "" and f"rawconv: error: --dtype {dtype}: " in r.stderr, r.stderr
    assert ("offers no" in r.stderr and "dnnl_unimplemented" in r.stderr) if dtype != "float64" \
        else "float32, bfloat16, float16 only" in r.stderr
    assert not out.exists() or not out.read_text()    # nothing written


def test_bf16_where_onednn_has_none_is_not_supported_through_the_api():
    # the Python API still runs it and says, row by row, what the library does not offer
    from rawconv import compare

    code = ("import json, sys; from rawconv import ConvProblem, compare; "
            "p = ConvProblem.from_benchdnn('mb1ic8ih10oc8oh10kh3ph1', dtype='bfloat16'); "
            "t = compare.compare([p], iterations=1, warmup=0, progress=False, include_ref=True); "
            "print(json.dumps([[r.backend, r.status, r.error] for r in t]))")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               ONEDNN_MAX_CPU_ISA="AVX2")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout.splitlines()[-1])
    onednn_rows = [row for row in rows if row[0] == "onednn"]
    assert onednn_rows and all(row[1] == "not supported" and "dnnl_unimplemented" in row[2] for row in onednn_rows)
    s = compare.summary([compare.Row("p", b, "x", status=st, error=e) for b, st, e in rows])
    assert s["geomean_torch_over_best"] is None and compare.exit_code(s) == 3


def test_onednn_that_does_not_load_is_exit_3(tmp_path):
    missing = str(tmp_path / "nowhere" / "libdnnl.so.3")
    r = _run("compare", "mb1ic4ih6oc4oh6kh3ph1", "--iterations", "1", "--warmup", "0", "--width", "80",
             env_extra={"RAWCONV_DNNL_LIBRARY": missing})
    assert r.returncode == 3, r.stdout + r.stderr
    assert "library not loaded" in r.stdout and missing in r.stdout.replace("\n", "")
    assert "Traceback" not in r.stderr
