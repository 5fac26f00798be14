"""The documentation: the site under docs/ builds with warnings as errors, with the README's own
command; its API reference holds every public name; the notebook page shows the stored run's
tables and figures; README.md stays short and keeps the two set-up commands. (Every code block of
the README and the guides runs as pasted in tests/test_docs_blocks.py.)"""
from __future__ import annotations

import inspect
import json
import re
import shlex
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


def _readme_docs_command() -> list[str]:
    """The README's docs-build command, split: ``.venv/bin/python -m sphinx ... docs <out>``."""
    found = re.findall(r"`(\.venv/bin/python -m sphinx [^`]+)`", _readme())
    assert len(found) == 1, f"README.md should give one docs-build command, found {found}"
    return shlex.split(found[0])


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """One build of docs/ with the README's own command (``.venv/bin/python`` being this
    interpreter, the output folder a temporary one): (returncode, output, folder)."""
    out = tmp_path_factory.mktemp("site")
    cmd = _readme_docs_command()
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable] + cmd[1:-1] + [str(out)], cwd=ROOT, capture_output=True, text=True,
                       timeout=900)
    print(f"{' '.join(cmd[1:-1])} <tmp>: rc {r.returncode}, {time.perf_counter() - t0:.1f} s")
    return r.returncode, r.stdout + r.stderr, out


def test_readme_docs_command_is_the_venvs_like_the_others():
    """``.venv/bin/python -m sphinx -W -b html docs docs/_build/html``: the venv of the set-up
    commands (a bare ``python`` has no sphinx), warnings as errors, the docs folder."""
    cmd = _readme_docs_command()
    assert cmd[:3] == [".venv/bin/python", "-m", "sphinx"] and "-W" in cmd and cmd[-2:] == ["docs", "docs/_build/html"]


def test_notebook_page_shows_the_stored_runs_tables_and_figures(site):
    """The rendered notebook shows outputs: figures (PNG images) and tables (HTML), not code only."""
    rc, output, out = site
    assert rc == 0, output[-3000:]
    html = (out / "notebooks" / "explore.html").read_text()
    # each cell's output: from its cell_output div to the next cell
    outputs = [part.split('<div class="cell docutils container">')[0] for part in html.split('class="cell_output')[1:]]
    images = [src for o in outputs for src in re.findall(r'<img [^>]*src="([^"]+)"', o)]
    assert len(images) >= 3, f"{len(images)} figures in the notebook page's outputs (autotune, compare, heat map)"
    for src in images:
        assert src.startswith("data:image/png") or (out / "notebooks" / src).resolve().is_file(), src
    tables = sum("<table" in o for o in outputs)
    assert tables >= 4, f"{tables} of the notebook page's {len(outputs)} cell outputs hold a table"
    assert '_static/rawconv.css' in html   # code blocks wrap (docs/_static/rawconv.css)


def test_rendered_notebook_holds_the_examples_code():
    """docs/notebooks/explore.ipynb is examples/explore.ipynb with the outputs of one run
    (tools/execute_notebooks.py): the same code cells, every code cell executed, no error output."""
    src = json.loads((ROOT / "examples" / "explore.ipynb").read_text())
    page = json.loads((ROOT / "docs" / "notebooks" / "explore.ipynb").read_text())

    def code(nb):
        return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    assert code(page) == code(src), "docs/notebooks/explore.ipynb is out of date: run tools/execute_notebooks.py"
    cells = [c for c in page["cells"] if c["cell_type"] == "code"]
    assert all(c.get("execution_count") for c in cells), "a code cell of the stored page was not executed"
    assert not any(o["output_type"] == "error" for c in cells for o in c.get("outputs", []))
    assert not any(c.get("outputs") for c in src["cells"] if c["cell_type"] == "code"), \
        "examples/explore.ipynb is kept without outputs (what a user opens and runs)"


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
