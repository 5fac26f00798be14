"""``convert(autotune=...)`` on the CPU: each searched layer's pinned oneDNN call against torch's own
call, and torch's own pick as a candidate (:func:`versus_torch_cpu`).

torch runs its own, newer oneDNN (3.12 in torch 2.14); rawconv names what it ran
(:func:`rawconv.torch_choice`: oneDNN's verbose trace of torch's call) and looks the implementation up
by name in rawconv's oneDNN. The layer's call on rawconv's pinned choice and torch's own call are
timed in interleaved rounds (:func:`rawconv.core.bench.time_rounds`, ratios taken within a round);
the policy is the one CUDA's layers run too (:func:`rawconv.core.autotune.versus_torch`): when
rawconv's call measured more than 3% slower and rawconv's oneDNN offers torch's implementation under
another choice, that choice is timed the same way and kept if it measured faster. The layer's report
then says what rawconv runs, what torch runs, both times and the ratio, as on CUDA."""
from __future__ import annotations

from typing import Any, Callable

from ..core import autotune as _autotune, bench
from ..core.autotune import SLOWER

__all__ = ["versus_torch_cpu", "SLOWER"]


def _ratio(peer: Callable[[], Any], ours: Callable[[], Any], rounds: int) -> tuple[float, float, float]:
    """(torch ms, rawconv ms, torch / rawconv) from ``rounds`` interleaved rounds."""
    t = bench.time_rounds({"torch": peer, "rawconv": ours}, rounds=rounds, calls=2)
    r = bench.ratio(t["torch"], t["rawconv"])
    t_ms, r_ms = t["torch"].stats().median_ms, t["rawconv"].stats().median_ms
    return t_ms, r_ms, (r.value if r is not None else t_ms / r_ms)


def versus_torch_cpu(peer: Callable[[], Any], ours_for: Callable[[str], Callable[[], Any]], choice: str,
                     torch_call: dict, *, rounds: int = 5) -> tuple[str, dict]:
    """``(the choice to pin, what the layer's report gets)`` for one searched oneDNN layer: the
    policy is :func:`rawconv.core.autotune.versus_torch` (as on CUDA), the measurement
    :func:`_ratio` (``rounds`` interleaved rounds).

    ``peer``: torch's own call of the layer (``F.conv*d`` and torch's epilogue ops); ``ours_for(c)``:
    a callable running the layer's plan on choice ``c``; ``choice``: the search's winner;
    ``torch_call``: ``x``, ``w``, ``bias``, ``stride``, ``padding``, ``dilation``, ``groups`` of the
    convolution (for :func:`rawconv.torch_choice`). The report's keys: ``torch_engine`` (torch's
    oneDNN implementation, e.g. ``brgconv:avx512_core``), ``torch_ms``, ``rawconv_ms``, ``vs_torch``
    (torch / rawconv: above 1, rawconv faster), ``torch_pick`` (rawconv's choices that run torch's
    implementation) and, when torch's pick was tried, ``vs_torch_note``."""
    from .torch_choice import torch_choice

    out: dict = {}
    tc = torch_choice(**torch_call)
    convs = [r for r in tc.onednn if r.kind == "convolution"]
    out["torch_engine"] = convs[0].impl if convs else tc.backend   # (e.g. "Slow2d": torch ran no oneDNN)
    out["torch_pick"] = list(tc.matches)
    # torch's implementation under another name than the winner's (oneDNN's names repeat across layouts)
    alts = [c for c in tc.matches if c != choice and c.split("@")[0] != choice.split("@")[0]]
    pick, measured = _autotune.versus_torch(lambda c: _ratio(peer, ours_for(c), rounds), choice, alts,
                                            word="implementation")
    out.update(measured)
    return pick, out
