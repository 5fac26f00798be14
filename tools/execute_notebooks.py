"""Execute ``examples/explore.ipynb`` once on the CPU and store it, outputs included, as the page
the documentation renders (``docs/notebooks/explore.ipynb``).

    .venv/bin/python tools/execute_notebooks.py            # small sizes (RAWCONV_EXPLORE_SMALL=1), a minute or two
    .venv/bin/python tools/execute_notebooks.py --full     # the notebook's full sizes (batch 8, 23-layer sweep)
    .venv/bin/python tools/execute_notebooks.py --check    # exit 1 if the stored page's code differs from examples/

The docs build renders notebooks as stored (``nb_execution_mode = "off"`` in docs/conf.py: a build
takes seconds, needs no kernel and cannot fail on a busy machine's timings), so the tables and plots
on the site are those of the run this script made: rerun it after changing the notebook
(``tests/test_docs.py`` checks that the stored page holds the same code cells as ``examples/``).
``examples/explore.ipynb`` itself stays without outputs (what a user opens and runs).

The kernel is ipykernel on this interpreter with this checkout's rawconv first on the path (not a
system-wide "python3" kernel, not another install of rawconv), run in a temporary directory (the
notebook writes a tuning record there), no tuning cache file. Volatile metadata (execution
timestamps) is dropped so that a rerun changes only what the run itself changed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "examples" / "explore.ipynb"
TARGET = ROOT / "docs" / "notebooks" / "explore.ipynb"


def code_cells(nb: dict) -> list[str]:
    """The sources of a notebook's code cells (what the stored page must share with the source)."""
    return ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for c in nb["cells"] if c["cell_type"] == "code"]


def _strip_volatile(nb) -> None:
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    nb.metadata.pop("widgets", None)


def execute(source: Path, full: bool, timeout: int) -> "object":
    """``source`` executed headless (nbclient); returns the executed notebook node. Raises
    ``nbclient.exceptions.CellExecutionError`` (with the cell's traceback) when a cell fails."""
    import nbclient
    import nbformat

    nb = nbformat.read(source, as_version=4)
    with tempfile.TemporaryDirectory(prefix="rawconv-nb-") as tmp:
        spec = Path(tmp) / "kernels" / "rawconv-docs"
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "rawconv docs", "language": "python"}))
        env = dict(os.environ)
        env["JUPYTER_PATH"] = tmp
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        env.pop("RAWCONV_TUNING_CACHE", None)
        if full:
            env.pop("RAWCONV_EXPLORE_SMALL", None)
        else:
            env["RAWCONV_EXPLORE_SMALL"] = "1"
        old = dict(os.environ)
        os.environ.clear()
        os.environ.update(env)   # the kernel inherits this process's environment
        try:
            run = Path(tmp) / "run"
            run.mkdir()
            client = nbclient.NotebookClient(nb, kernel_name="rawconv-docs", timeout=timeout,
                                             resources={"metadata": {"path": str(run)}})
            client.execute()
        finally:
            os.environ.clear()
            os.environ.update(old)
    _strip_volatile(nb)
    return nb


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--full", action="store_true", help="the notebook's full sizes (default: RAWCONV_EXPLORE_SMALL=1)")
    ap.add_argument("--check", action="store_true", help="only compare the stored page's code cells with examples/")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per cell (default 600)")
    ap.add_argument("--output", type=Path, default=TARGET, help=f"where to write (default {TARGET.relative_to(ROOT)})")
    args = ap.parse_args(argv)

    if args.check:
        same = code_cells(json.loads(SOURCE.read_text())) == code_cells(json.loads(args.output.read_text()))
        print(f"{args.output}: {'the same code cells as' if same else 'OUT OF DATE against'} {SOURCE}")
        return 0 if same else 1
    import nbformat

    t0 = time.perf_counter()
    nb = execute(SOURCE, args.full, args.timeout)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    kinds = sorted({k for o in outputs for k in o.get("data", {})})
    if args.output.is_symlink():   # (once a link to examples/: never write the outputs through it)
        args.output.unlink()
    nbformat.write(nb, args.output)
    print(f"executed {SOURCE.relative_to(ROOT)} ({'full' if args.full else 'small'} sizes) in "
          f"{time.perf_counter() - t0:.0f} s: {len(outputs)} outputs ({', '.join(kinds)}) -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
