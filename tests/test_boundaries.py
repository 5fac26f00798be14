"""The package's boundaries as measures (issue 35), each with an allow-list of today's exceptions
that may only shrink: a new exception fails, and so does an entry that is no longer needed (take it
out of the list, so that the count printed goes down and stays down).

* no private name (``_name``) of one subpackage used from another (``tools/boundaries.py``: ``from
  rawconv.X import _name``, ``X._name`` on a module of another subpackage);
* no import cycle, counting imports inside functions;
* no module over 1,000 lines.

``python tools/boundaries.py --list`` prints the measures and today's uses.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import boundaries  # noqa: E402

sys.path.pop(0)

# "using module -> owner module.private name" (subpackage-relative), as tools/boundaries.py prints them:
# none left (issue 35's measure met); a new one fails
PRIVATE_ALLOWED: set[str] = set()

# the import cycles of today (each a sorted tuple of subpackage-relative module names)
CYCLES_ALLOWED: set[tuple[str, ...]] = set()   # none left (issue 35's measure met); a new one fails

# module -> its line count today: may only shrink (and leave the list once under the limit)
LONG_ALLOWED: dict[str, int] = {}   # none left (issue 35's measure met); a new one fails



def test_no_new_private_names_across_subpackages():
    uses = set(boundaries.private_uses())
    print(f"private names used across subpackages: {len(uses)} (allowed: {len(PRIVATE_ALLOWED)})")
    new = sorted(uses - PRIVATE_ALLOWED)
    assert not new, ("private names newly used across subpackages (give the owner a public name, or move "
                     "the code):\n" + "\n".join(new))
    gone = sorted(PRIVATE_ALLOWED - uses)
    assert not gone, "no longer used: take these out of PRIVATE_ALLOWED:\n" + "\n".join(gone)


def test_no_new_import_cycles():
    found = {tuple(m.removeprefix("rawconv.") for m in c) for c in boundaries.cycles(boundaries.imports())}
    print(f"import cycles: {len(found)} ({sum(map(len, found))} modules; allowed: {len(CYCLES_ALLOWED)})")
    for c in found:
        # a cycle may only be one of today's, or part of one (a cycle that shrank)
        assert any(set(c) <= set(a) for a in CYCLES_ALLOWED), f"a new import cycle: {c}"
    gone = [a for a in CYCLES_ALLOWED if not any(set(c) == set(a) for c in found)]
    assert not gone, f"these cycles changed or went: update CYCLES_ALLOWED to what is left: {gone}"


def test_no_module_grows_past_the_limit():
    longs = boundaries.long_modules()
    print(f"modules over {boundaries.MAX_LINES} lines: {len(longs)} (allowed: {len(LONG_ALLOWED)})")
    for mod, n in sorted(longs.items()):
        assert mod in LONG_ALLOWED, f"{mod} has {n} lines (over {boundaries.MAX_LINES}): split it"
        assert n <= LONG_ALLOWED[mod], f"{mod} grew from {LONG_ALLOWED[mod]} to {n} lines: it may only shrink"
    gone = sorted(set(LONG_ALLOWED) - set(longs))
    assert not gone, f"under {boundaries.MAX_LINES} lines now: take these out of LONG_ALLOWED: {gone}"


def test_the_measures_see_what_they_claim(tmp_path):
    """The measures on a small package made here: one private use across subpackages, one cycle
    through an import inside a function, one long module."""
    pkg = tmp_path / "rawconv"
    for d in ("core", "pytorch"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "_aliases.py").write_text("ALIASES = {}\n")
    (pkg / "core" / "a.py").write_text("def _hidden():\n    from ..pytorch import b\n" + "x = 1\n" * 1001)
    (pkg / "pytorch" / "b.py").write_text("from ..core import a\nfrom ..core.a import _hidden\ny = a._hidden\n")
    assert boundaries.private_uses(pkg) == ["pytorch.b -> core.a._hidden"]
    assert boundaries.cycles(boundaries.imports(pkg)) == [("rawconv.core.a", "rawconv.pytorch.b")]
    assert boundaries.long_modules(pkg) == {"core.a": 1003}
