"""Sphinx configuration of rawconv's documentation site.

Pages are Markdown (MyST, through myst-nb), the API reference is autodoc over rawconv's public
module names (``rawconv.onednn``, ``rawconv.nn``, ...: whatever file defines them), and the notebook
``docs/notebooks/explore.ipynb`` (``examples/explore.ipynb`` with the outputs of one run, written by
``tools/execute_notebooks.py``) is rendered as stored: nothing runs at build time.
``tests/test_docs.py`` builds it with warnings as errors.

Build: ``.venv/bin/python -m sphinx -W --keep-going -b html docs docs/_build/html``
"""
from __future__ import annotations

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)      # document this checkout's rawconv, not another installed copy

project = "rawconv"
author = "the rawconv authors"
copyright = "2026, the rawconv authors"
release = "0.1.0"

extensions = ["myst_nb", "sphinx.ext.autodoc"]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "**.ipynb_checkpoints", "_screenshots"]

# MyST: heading anchors so that [text](page.md#a-heading) links resolve; ::: fences for directives
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

# myst-nb: render notebooks with the outputs they were saved with (tools/execute_notebooks.py runs
# examples/explore.ipynb once on the CPU and stores it, outputs included, as docs/notebooks/explore.ipynb),
# never execute them here: a build takes seconds and needs no kernel
nb_execution_mode = "off"
nb_merge_streams = True

html_theme = "alabaster"
html_title = "rawconv"
html_theme_options = {"description": "every convolution algorithm of oneDNN and cuDNN, on torch tensors",
                      "fixed_sidebar": True, "page_width": "1240px", "sidebar_width": "240px"}
# code blocks wrap their long lines (docs/_static/rawconv.css); wide outputs scroll with a visible bar
html_static_path = ["_static"]
html_css_files = ["rawconv.css"]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True   # signatures show `threads="auto"`, not a repr of a sentinel object
add_module_names = False

# -- docstrings: rawconv's own notation in RST ---------------------------------------------------
# rawconv's docstrings write shapes and bounds as they read in the code: ``(N, C, *spatial)``,
# ``|y - ref| <= eps*|ref|``. In reStructuredText a lone ``*`` opens emphasis and ``|x|`` is a
# substitution, so both would be build errors; outside literals they are escaped here, which
# renders them exactly as written. Literal blocks (after ``::``), directives, doctests and inline
# literals / roles are left as they are.

_INLINE = re.compile(r"(``.*?``|:[\w:.+-]+:`[^`]*`|`[^`]*`_{0,2})")
_STARS = re.compile(r"\*{1,2}")


def _escape_stars(text: str) -> str:
    """Escapes each ``*``/``**`` that would open emphasis (strong) but has no closing mark in
    ``text``; closed pairs (``*word*``, ``**Threads.**``) and stars that RST reads as text
    (``2*eps``, a ``* `` bullet) stay."""
    out, i = [], 0
    while True:
        m = _STARS.search(text, i)
        if m is None:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i:m.start()])
        mark, s, e = m.group(), m.start(), m.end()
        before = text[s - 1] if s else " "
        after = text[e] if e < len(text) else " "
        opens = (before.isspace() or before in "([{<'\"-/:") and not after.isspace()
        if not opens:
            out.append(mark)
            i = e
            continue
        close = re.compile(r"(?<=[^\s*])" + re.escape(mark) + r"(?![*\w])")
        c = close.search(text, e + 1)
        if c is None:
            out.append("\\*" * len(mark))
            i = e
        else:            # emphasis: copy it whole
            out.append(text[s:c.end()])
            i = c.end()


def _escape_plain(text: str) -> str:
    return _escape_stars(text.replace("|", "\\|"))


def _escape_line(line: str) -> str:
    parts = _INLINE.split(line)
    return "".join(p if k % 2 else _escape_plain(p) for k, p in enumerate(parts))


def _rst_notation(app, what, name, obj, options, lines: list[str]) -> None:
    literal_indent = None          # indent of the line that opened a literal block / directive
    in_literal = False             # inside an inline ``literal`` that runs over the line's end
    for k, line in enumerate(lines):
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if literal_indent is not None:
            if not stripped or indent > literal_indent:
                continue
            literal_indent = None
        if not in_literal and stripped.startswith((">>>", "... ")):
            continue
        if not in_literal and stripped.startswith(".. "):
            literal_indent = indent
            continue
        head, rest = "", line
        if in_literal:
            end = rest.find("``")
            if end < 0:
                continue
            head, rest = rest[:end + 2], rest[end + 2:]
            in_literal = False
        tail = ""
        if rest.count("``") % 2:      # a literal opens here and closes on a later line
            cut = rest.rindex("``")
            rest, tail = rest[:cut], rest[cut:]
            in_literal = True
        lines[k] = head + _escape_line(rest) + tail
        if stripped.endswith("::") and not in_literal:
            literal_indent = indent


# -- cross-references: short names in docstrings -------------------------------------------------
# Docstrings name rawconv's objects the way their module sees them (:class:`ArgumentError` in
# rawconv.onednn, :class:`~rawconv.problem.ConvProblem`). Where the Python domain finds no object of
# that exact name, a documented object of the role's kind (a module for :mod:, a class for :class:)
# whose dotted name ends with it is taken: the one in the referring module if there is one, else the
# only one. Ambiguous or unknown names stay plain text (the build does not run nitpicky).

def _resolve_short_names(app, env, node, contnode):
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "").lstrip("~.")
    if not target:
        return None
    from sphinx.util.nodes import make_refnode

    domain = env.get_domain("py")
    kinds = set(domain.objtypes_for_role(node.get("reftype", "obj")) or ())
    objects = {n: e for n, e in domain.objects.items() if e.objtype in kinds}
    here = node.get("py:module") or ""
    parts = target.split(".")
    for k in range(len(parts)):
        suffix = ".".join(parts[k:])
        found = [n for n in objects if n == suffix or n.endswith("." + suffix)]
        if not found:
            continue
        # one object can hold several names (autodoc's canonical name beside the public one)
        targets = {(objects[n].docname, objects[n].node_id) for n in found}
        local = [n for n in found if here and n.startswith(here + ".")]
        pick = local if len(local) == 1 else found if len(targets) == 1 else None
        if pick is None:
            return None
        entry = objects[pick[0]]
        return make_refnode(app.builder, node["refdoc"], entry.docname, entry.node_id, contnode, pick[0])
    return None


def setup(app):
    app.connect("autodoc-process-docstring", _rst_notation)
    app.connect("missing-reference", _resolve_short_names)
    return {"parallel_read_safe": True}


# -- the environment-variables page, generated from rawconv.core.env.KNOBS -------------------------
def _write_environment_page() -> None:
    """docs/_generated/environment.md from :func:`rawconv.core.env.table` (the one place every
    ``RAWCONV_*`` variable is declared), rewritten at every build so it cannot go stale."""
    from rawconv.core import env

    def cell(v) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["# Environment variables", "",
             "Every `RAWCONV_*` variable rawconv or its tests read, generated from "
             "{py:data}`rawconv.core.env.KNOBS` when these pages are built (no other module reads "
             "`os.environ` for a `RAWCONV_` name: `tests/test_env.py` checks it). Types: `path` (a file "
             "path; unset or empty = none), `switch` (on unless `0`, `false`, `no`, `off`), `text` (the "
             "string as set).", ""]
    for scope, title in (("rawconv", "Read by the package"), ("tests", "Read by the tests, tools and the notebook")):
        rows = env.table(scope)
        if not rows:
            continue
        lines += [f"## {title}", "", "| variable | type | unset means | meaning | read by |", "|---|---|---|---|---|"]
        lines += [f"| `{r['name']}` | {r['type']} | {cell(r['default'])} | {cell(r['meaning'])} | `{r['read_by']}` |"
                  for r in rows]
        lines.append("")
    out = os.path.join(ROOT, "docs", "_generated")
    os.makedirs(out, exist_ok=True)
    text = "\n".join(lines)
    path = os.path.join(out, "environment.md")
    if not os.path.exists(path) or open(path).read() != text:   # unchanged: keep its mtime (no rebuild)
        with open(path, "w") as f:
            f.write(text)


_write_environment_page()
