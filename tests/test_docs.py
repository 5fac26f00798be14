"""The documentation: the site under docs/ builds with warnings as errors and its API reference holds
every public name."""
from __future__ import annotations

import inspect
import re
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

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
    """A docstring's role naming rawconv.cudnn_graph.GraphConvolution (rawconv.nn's) and a short
    :class:`ArgumentError` (resolved by docs/conf.py to rawconv.errors.ArgumentError) are links."""
    rc, output, out = site
    assert rc == 0, output[-3000:]
    pages = [p for p in (out / "api").glob("*.html") if p.name != "cudnn_graph.html"]
    assert any('href="cudnn_graph.html#rawconv.cudnn_graph.GraphConvolution' in p.read_text() for p in pages), \
        "no page links to rawconv.cudnn_graph.GraphConvolution"
    onednn = (out / "api" / "onednn.html").read_text()
    assert 'href="errors.html#rawconv.errors.ArgumentError"' in onednn
