"""Every fenced ```python / ```bash block of README.md and docs/guides/*.md runs as pasted.

What a reader pastes is what runs here (no edited copy of the docs):

* **python** blocks: the blocks of one page run in order in one Python session (one namespace, as
  a reader pasting them one after another into one interpreter; a page's later block may use the
  names an earlier one made), in a fresh working directory per page. All pages run in ONE child
  process (``python tests/test_docs_blocks.py SPEC OUT``, this checkout's rawconv first on the
  path, matplotlib on Agg, no tuning cache file), each page in its own namespace; one test per block
  then reads that block's result.
* **bash** blocks: line by line; only the lines of :data:`SAFE_COMMANDS` run (``rawconv list``,
  ``rawconv info``: quick, no files written, nothing installed), as ``python -m rawconv ...`` on
  this interpreter; every other line is skipped, and the skip is listed with its reason.

A block's first line may carry a marker, visible in the docs, that says how it runs
(:data:`MARKERS`):

* ``# needs CUDA``: runs only where torch sees a GPU (skipped here otherwise, with that reason);
* ``# raises NotSupportedError`` (any exception class name): must raise that exception (the block
  shows an error on purpose; the rest of the page runs on);
* ``# takes minutes``: not run by this test (a whole-network sweep, a benchmark);
* ``# in each process of a torchrun job``: needs ``torchrun``'s environment (not run here).

:data:`EXPECT` adds what a block must print (a substring of its stdout). The test prints a summary
(ran, skipped and why, seconds) at the end of the module. The sizes in the guides are chosen so
that every block that runs here runs in seconds on two busy cores; the whole module stays under
about a minute (bash lines that repeat a command run once).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs" / "guides").glob("*.md"))

# first-line markers (the comment text after "# "), and what each means here
MARKERS = {
    "needs CUDA": "needs a CUDA GPU",
    "raises ": "must raise the named exception",
    "takes minutes": "long-running (a whole-network sweep or a benchmark): not run by this test",
    "in each process of a torchrun job": "needs torchrun's environment (a process group): not run here",
}

# bash lines that run (as `python -m rawconv ...`): quick, read-only commands
SAFE_COMMANDS = ("rawconv list ", "rawconv info")

# (page, a line of the block) -> a substring the block's stdout must contain
EXPECT = {
    ("README.md", "c = rawconv.torch_choice(x, w, padding=1)"): "-> rawconv ",   # torch's oneDNN implementation
                                                                                 # mapped to a rawconv name
    ("README.md", "from rawconv import onednn"): "x64:gemm:jit",   # listed: oneDNN 3.2 offers it on every x86-64 CPU
    ("docs/guides/threads.md", "print(conv.threads)"): "1",
}

_FENCE = re.compile(r"^( *)```(python|bash)[^\n]*\n(.*?)^\1```[ \t]*$", re.M | re.S)


def _blocks(page: Path) -> list[dict]:
    """The page's python and bash blocks, numbered from 1 in page order."""
    text = page.read_text(encoding="utf-8")
    out = []
    for n, m in enumerate(_FENCE.finditer(text), 1):
        indent, lang, body = m.group(1), m.group(2), m.group(3)
        code = "\n".join(line[len(indent):] if line.startswith(indent) else line for line in body.splitlines())
        first = code.lstrip().splitlines()[0] if code.strip() else ""
        marker = next((k for k in MARKERS if first.startswith("# " + k)), None)
        rel = page.relative_to(ROOT).as_posix()
        out.append({"page": rel, "n": n, "lang": lang, "code": code + "\n", "marker": marker,
                    "raises": first[len("# raises "):].split()[0].rstrip(":,.") if marker == "raises " else None,
                    "id": f"{rel}#{n}-{lang}", "line": text[:m.start()].count("\n") + 1})
    return out


ALL = [b for page in PAGES for b in _blocks(page)]


def _skip_reason(block: dict) -> str | None:
    marker = block["marker"]
    if marker == "needs CUDA":
        import torch

        return None if torch.cuda.is_available() else "marked '# needs CUDA' (torch.cuda.is_available() is False)"
    if marker in ("takes minutes", "in each process of a torchrun job"):
        return f"marked '# {marker}': {MARKERS[marker]}"
    return None


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "RAWCONV_TUNING_CACHE"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                       if p])
    env["MPLBACKEND"] = "Agg"
    return env


_SUMMARY: list = []   # (id, status, seconds, why)


@pytest.fixture(scope="module")
def python_results(tmp_path_factory):
    """Runs every python block that is not skipped (per page, in order, one namespace per page) in
    one child process. Returns {block id: result dict} (status "ok" / "raised", stdout, error)."""
    todo = [b for b in ALL if b["lang"] == "python" and _skip_reason(b) is None]
    pages: dict = {}
    for b in todo:
        pages.setdefault(b["page"], []).append({k: b[k] for k in ("id", "code", "raises")})
    work = tmp_path_factory.mktemp("blocks")
    spec, out = work / "spec.json", work / "out.json"
    spec.write_text(json.dumps([{"page": p, "blocks": bl} for p, bl in pages.items()]))
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, __file__, str(spec), str(out), str(work)], capture_output=True, text=True,
                       env=_env(), timeout=900)
    print(f"python blocks of {len(pages)} pages in one process: rc {r.returncode}, {time.perf_counter() - t0:.1f} s")
    if not out.exists():
        pytest.fail(f"the block runner ended without results (rc {r.returncode}):\n{r.stdout[-3000:]}\n"
                    f"{r.stderr[-5000:]}")
    return json.loads(out.read_text())


@pytest.mark.parametrize("block", [b for b in ALL if b["lang"] == "python"], ids=lambda b: b["id"])
def test_python_block_runs_as_pasted(block, python_results):
    why = _skip_reason(block)
    if why:
        _SUMMARY.append((block["id"], "skipped", 0.0, why))
        pytest.skip(why)
    res = python_results.get(block["id"])
    assert res is not None, f"{block['id']}: not run (an earlier block of the page stopped the session?)"
    where = f"{block['page']} line {block['line']} (block {block['n']})"
    if block["raises"]:
        assert res["status"] == "raised" and block["raises"] in res["exc_classes"], (
            f"{where} is marked '# raises {block['raises']}' but {res['status']}: {res['error'][-3000:]}")
    else:
        assert res["status"] == "ok", f"{where} failed as pasted:\n{res['error'][-4000:]}\nstdout:\n{res['stdout'][-1500:]}"
    for (page, line), want in EXPECT.items():
        if page == block["page"] and line in block["code"]:
            assert want in res["stdout"], f"{where}: expected {want!r} in its output:\n{res['stdout'][-3000:]}"
    _SUMMARY.append((block["id"], res["status"], res["seconds"], ""))


def _bash_lines(block: dict) -> list[tuple[str, str | None]]:
    """(command, skip reason or None) per command line of a bash block (comments cut off)."""
    out = []
    for line in block["code"].splitlines():
        cmd = line.split(" #")[0].strip() if not line.lstrip().startswith("#") else ""
        if not cmd:
            continue
        if block["marker"] and _skip_reason(block):
            out.append((cmd, _skip_reason(block)))
        elif cmd.startswith(SAFE_COMMANDS):
            out.append((cmd, None))
        else:
            out.append((cmd, f"not one of the read-only commands this test runs ({', '.join(SAFE_COMMANDS)})"))
    return out


_CLI_CACHE: dict = {}


def _run_cli(cmd: str, cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    if cmd not in _CLI_CACHE:
        args = shlex.split(cmd)
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "rawconv", *args[1:]], capture_output=True, text=True, cwd=cwd,
                           env=_env(), timeout=600)
        _CLI_CACHE[cmd] = (r, time.perf_counter() - t0)
    return _CLI_CACHE[cmd]


@pytest.mark.parametrize("block", [b for b in ALL if b["lang"] == "bash"], ids=lambda b: b["id"])
def test_bash_block_safe_lines_run(block, tmp_path):
    lines = _bash_lines(block)
    ran = 0
    for cmd, why in lines:
        if why:
            _SUMMARY.append((f"{block['id']}: {cmd[:60]}", "skipped", 0.0, why))
            continue
        r, seconds = _run_cli(cmd, tmp_path)
        assert r.returncode == 0, f"{block['page']} line {block['line']}: `{cmd}` exited {r.returncode}:\n" \
                                  f"{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
        assert r.stdout.strip(), f"`{cmd}` printed nothing"
        _SUMMARY.append((f"{block['id']}: {cmd[:60]}", "ok", seconds, ""))
        ran += 1
    if not ran:
        pytest.skip("no line of this block is one this test runs: " + "; ".join(f"`{c[:50]}`: {w}" for c, w in lines))


def test_expected_outputs_name_blocks_that_exist():
    for page, line in EXPECT:
        assert any(b["page"] == page and line in b["code"] for b in ALL), (page, line)


def test_markers_are_known_and_blocks_were_found():
    """The extraction sees the blocks (a changed fence style would silently run nothing), and a
    comment that looks like a marker but is not one of :data:`MARKERS` is reported."""
    assert sum(b["lang"] == "python" for b in ALL) >= 15 and sum(b["lang"] == "bash" for b in ALL) >= 5, len(ALL)
    odd = [b["id"] for b in ALL if b["marker"] is None and re.match(r"# (needs|raises|takes|in each)\b",
                                                                      b["code"].lstrip())]
    assert not odd, f"first-line comments that look like markers but are not in MARKERS: {odd}"
    for b in ALL:
        if b["marker"] == "raises ":
            assert re.fullmatch(r"[A-Z]\w*(Error|Exception|Warning)", b["raises"] or ""), b["id"]


def teardown_module(module):
    if _SUMMARY:
        ran = [s for s in _SUMMARY if s[1] != "skipped"]
        print(f"\ndocs blocks: {len(ran)} ran ({sum(s[2] for s in ran):.1f} s), "
              f"{len(_SUMMARY) - len(ran)} skipped:")
        for bid, status, seconds, why in _SUMMARY:
            print(f"  {status:8s} {seconds:6.1f} s  {bid}" + (f"  ({why})" if why else ""))


# ---------------------------------------------------------------------------- the child process
def _drive(spec_path: str, out_path: str, work: str) -> None:
    """Runs the pages of ``spec_path`` (their blocks in order, one namespace per page, each page in
    its own directory under ``work``) and writes {block id: result} to ``out_path``."""
    import contextlib
    import io
    import traceback

    results = {}
    for page in json.loads(Path(spec_path).read_text()):
        d = Path(work) / re.sub(r"\W", "_", page["page"])
        d.mkdir(parents=True, exist_ok=True)
        os.chdir(d)
        ns: dict = {"__name__": "__main__"}
        for b in page["blocks"]:
            buf = io.StringIO()
            t0, c0 = time.perf_counter(), time.process_time()
            status, error, classes = "ok", "", []
            try:
                with contextlib.redirect_stdout(buf):
                    exec(compile(b["code"], b["id"], "exec"), ns)   # noqa: S102  (the docs' own code)
            except BaseException as exc:   # noqa: BLE001  (a block's failure is its result)
                status = "raised"
                classes = [c.__name__ for c in type(exc).__mro__]
                error = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            results[b["id"]] = {"status": status, "error": error, "exc_classes": classes, "stdout": buf.getvalue(),
                                "seconds": round(time.perf_counter() - t0, 2),
                                "cpu_seconds": round(time.process_time() - c0, 2)}
            sys.__stdout__.write(f"{b['id']}: {status} {results[b['id']]['seconds']} s "
                                 f"({results[b['id']]['cpu_seconds']} s CPU)\n")
            Path(out_path).write_text(json.dumps(results))   # after each block: a crash keeps what ran
            if status == "raised" and not b["raises"]:
                break   # the page's session stops here, as a pasted script would


if __name__ == "__main__":
    _drive(*sys.argv[1:4])
