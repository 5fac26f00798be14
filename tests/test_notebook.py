"""examples/explore.ipynb runs headless (nbclient, a kernel on this interpreter) at a small size, and
its cells show what people look at: HTML tables and PNG figures, no error."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

import rawconv

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "examples" / "explore.ipynb"

nbformat = pytest.importorskip("nbformat", reason="the notebook test needs nbformat (pip install '.[test]')")
nbclient = pytest.importorskip("nbclient", reason="the notebook test needs nbclient (pip install '.[test]')")
pytest.importorskip("ipykernel", reason="the notebook test needs ipykernel (pip install '.[test]')")


def _mime_types(cell) -> list[str]:
    out = []
    for o in cell.get("outputs", []):
        if o["output_type"] in ("execute_result", "display_data"):
            out += sorted(o["data"])
        elif o["output_type"] == "stream":
            out.append(f"stream:{o['name']}")
        elif o["output_type"] == "error":
            out.append(f"error:{o['ename']}")
    return out


def _source(cell) -> str:
    return cell["source"].strip().splitlines()[-1] if cell["source"].strip() else ""


@pytest.fixture
def kernel_on_this_interpreter(tmp_path, monkeypatch):
    """A kernelspec that starts ipykernel on ``sys.executable``, with this checkout's rawconv first
    on the path (not a system-wide "python3" kernel, not another install of rawconv)."""
    spec = tmp_path / "kernels" / "rawconv-test"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "rawconv test", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    pkg_root = str(Path(rawconv.__file__).resolve().parents[1])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([pkg_root] + [p for p in os.environ.get("PYTHONPATH", "")
                                                                     .split(os.pathsep) if p]))
    monkeypatch.setenv("RAWCONV_EXPLORE_SMALL", "1")
    monkeypatch.delenv("RAWCONV_TUNING_CACHE", raising=False)
    return "rawconv-test"


def test_explore_notebook_shows_tables_and_figures(tmp_path, kernel_on_this_interpreter):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    t0 = time.perf_counter()
    client = nbclient.NotebookClient(nb, kernel_name=kernel_on_this_interpreter, timeout=240,
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()   # raises CellExecutionError (with the traceback) when a cell fails
    seconds = time.perf_counter() - t0
    code = [c for c in nb.cells if c.cell_type == "code"]
    table = "\n".join(f"  cell {i}: {_source(c)[:60]!r}: {', '.join(_mime_types(c)) or '-'}"
                      for i, c in enumerate(code))
    report = f"output MIME types per code cell ({seconds:.1f} s):\n{table}"
    print(report)
    kinds = [set(_mime_types(c)) for c in code]
    assert not any(k for m in kinds for k in m if k.startswith("error")), report
    # no progress bar redrawn into the cells (tqdm's text bar on stderr: pink blocks in the HTML
    # export, one line per redraw); this kernel has no ipywidgets, so no bar at all (issue 25)
    stderr = "".join(o.get("text", "") for c in code for o in c.get("outputs", [])
                     if o["output_type"] == "stream" and o["name"] == "stderr")
    assert "%|" not in stderr and "layer/s" not in stderr and "impl/s" not in stderr, stderr[:2000]
    html = [i for i, m in enumerate(kinds) if "text/html" in m]
    png = [i for i, m in enumerate(kinds) if "image/png" in m]
    # the listing, the autotune table, compare's table, the record, replay's table, the DataFrame
    assert len(html) >= 6, report
    # autotune's bars, compare's bars, the sweep's heat map
    assert len(png) >= 3, report
    # the tables are rawconv's own HTML (highlighted winner), not a repr dump
    autotune = next(c for c in code if _source(c) == "table")
    page = next(o["data"]["text/html"] for o in autotune.outputs if "text/html" in o.get("data", {}))
    assert "rawconv-results" in page and "fastest correct" in page, report
    assert "Implementation(" not in page and "TimedImplementation(" not in page
    # the record the notebook saved is a schema-1 tuning record that names its choice
    saved = json.loads((tmp_path / "explore-choice.json").read_text())
    assert saved["schema"] == 1 and saved["backend"] == "onednn" and "@" in saved["choice"], saved
