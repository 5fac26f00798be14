"""The documentation: the site under docs/ builds with warnings as errors, its API reference holds
every public name, and README.md stays short, keeps the two set-up commands and its first-screen
answer runs as written (on the CPU)."""
from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

pytest.importorskip("sphinx", reason="the docs build needs sphinx (pip install '.[test]')")
pytest.importorskip("myst_nb", reason="the docs build needs myst-nb (pip install '.[test]')")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """One build of docs/ (HTML, ``-W --keep-going``) into a temporary folder: (returncode, output, folder)."""
    out = tmp_path_factory.mktemp("site")
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", str(ROOT / "docs"),
                        str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    print(f"sphinx-build -W --keep-going -b html docs: rc {r.returncode}, {time.perf_counter() - t0:.1f} s")
    return r.returncode, r.stdout + r.stderr, out


def test_docs_build_with_warnings_as_errors(site):
    rc, output, out = site
    assert rc == 0, "sphinx-build -W failed; the end of its output:\n" + output[-6000:]
    for page in ("index.html", "guides/force-torch.html", "api/onednn.html", "notebooks/explore.html"):
        assert (out / page).is_file(), page


def _inventory(folder: Path) -> dict[str, str]:
    """Sphinx's objects.inv (a 4-line header, then zlib text: ``name domain:role prio uri dispname``)
    as {name: 'domain:role'}."""
    data = (folder / "objects.inv").read_bytes()
    body = zlib.decompress(data.split(b"\n", 4)[4]).decode()
    return {m.group(1): m.group(2) for m in re.finditer(r"^(\S+) (\S+:\S+) ", body, re.M)}


PUBLIC_MODULES = ["onednn", "cudnn", "cudnn_graph", "nn", "ops", "tuning", "check", "results", "compare"]


def test_api_reference_documents_every_public_class_and_function(site):
    """autodoc documents a module's ``__all__`` without a word when the names move to other files
    (only undocumented constants are skipped): every public class and function must be in the
    reference under its public name, so that a restructure cannot empty a page silently."""
    import importlib

    rc, output, out = site
    assert rc == 0, output[-3000:]
    inv = _inventory(out)
    missing = []
    for name in PUBLIC_MODULES:
        mod = importlib.import_module(f"rawconv.{name}")
        for attr in mod.__all__:
            obj = getattr(mod, attr)
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and f"rawconv.{name}.{attr}" not in inv:
                missing.append(f"rawconv.{name}.{attr}")
    import rawconv.errors
    for attr in dir(rawconv.errors):
        obj = getattr(rawconv.errors, attr)
        if inspect.isclass(obj) and issubclass(obj, (rawconv.errors.RawconvError, Warning)) \
                and obj.__module__ == rawconv.errors.__name__ and f"rawconv.errors.{attr}" not in inv:
            missing.append(f"rawconv.errors.{attr}")
    for name in ("rawconv.ConvProblem", "rawconv.Options", "rawconv.info", "rawconv.torch_flags"):
        if name not in inv:
            missing.append(name)
    assert not missing, f"not in the API reference (docs/api/): {missing}"


def test_docstring_roles_become_links(site):
    """Roles in docstrings link across the reference (:mod:`rawconv.cudnn_graph` or one of its classes
    from another module's page), a short :class:`ArgumentError` resolves (docs/conf.py) to
    rawconv.errors.ArgumentError, and the guides' roles reach the reference too."""
    rc, output, out = site
    assert rc == 0, output[-3000:]
    pages = [p for p in (out / "api").glob("*.html") if p.name != "cudnn_graph.html"]
    assert any('href="cudnn_graph.html#' in p.read_text() for p in pages), "no page links into rawconv.cudnn_graph"
    assert 'href="errors.html#rawconv.errors.ArgumentError"' in (out / "api" / "onednn.html").read_text()
    glossary = (out / "guides" / "glossary.html").read_text()
    assert 'href="../api/cudnn_graph.html#rawconv.cudnn_graph.GraphConvolution"' in glossary


# -- README.md -------------------------------------------------------------------------------------

def _readme() -> str:
    return README.read_text(encoding="utf-8")


def test_readme_is_at_most_12_kb():
    size = README.stat().st_size
    assert size <= 12 * 1024, f"README.md is {size} bytes: move text to docs/ (at most 12 KiB)"


def test_readme_keeps_the_two_setup_commands():
    lines = _readme().splitlines()
    # .ci/run runs the first line that matches this, exactly as written
    tests = [ln for ln in lines if re.match(r"^python3 -m venv .* pytest", ln)]
    assert tests and tests[0].startswith("python3 -m venv --clear .venv && .venv/bin/pip install '.[test]' && "), tests
    assert ".venv/bin/python -m pytest -q tests" in tests[0]
    main_job = [ln for ln in lines if ln.startswith("python3 -m venv ") and "rawconv compare" in ln]
    assert main_job == ["python3 -m venv --clear .venv && .venv/bin/pip install '.[test]' && "
                        ".venv/bin/rawconv compare resnet50"], main_job


def test_readme_answers_the_first_question_on_its_first_screen():
    lines = _readme().splitlines()
    heading = next(i for i, ln in enumerate(lines) if ln.startswith("## How do I force PyTorch's convolution method"))
    assert heading < 15
    screen = "\n".join(lines[:50])
    for words in ("rawconv.torch_flags(", "rawconv.torch_choice(", "choice=", "torch.ops.rawconv.conv_forward"):
        assert words in screen, words


def test_readme_links_point_at_files_that_exist():
    prose = re.sub(r"```.*?```|`[^`\n]*`", "", _readme(), flags=re.S)    # links, not code
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", prose):
        if "://" not in target:
            assert (ROOT / target).exists(), target


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.S)


def _run_snippet(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RAWCONV_TUNING_CACHE"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=600)


def test_readme_first_answer_runs_as_written_on_the_cpu(tmp_path):
    """The first-screen snippet: torch's flags, torch_choice, then that candidate pinned through the
    operator, its function form, a module and convert()."""
    code = _python_blocks(_readme())[0]
    assert "torch.ops.rawconv.conv_forward" in code
    r = _run_snippet(code, tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "-> rawconv " in r.stdout, r.stdout     # torch's oneDNN implementation mapped to a rawconv name


def test_readme_cpu_quickstart_runs_as_written(tmp_path):
    blocks = _python_blocks(_readme())
    code = next(b for b in blocks if "from rawconv import onednn" in b)
    r = _run_snippet(code, tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "x64:gemm:jit" in r.stdout, r.stdout     # listed: oneDNN 3.2 offers it on every x86-64 CPU
