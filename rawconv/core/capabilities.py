"""What a library offers on this machine, asked of the library: the object that
:func:`rawconv.onednn.capabilities` and :func:`rawconv.cudnn.capabilities` return.

Pure Python (no library, no torch needed): the backends fill it by creating primitive descriptors
(oneDNN) or asking the heuristic for algorithms (cuDNN) on a tiny problem; this module only
holds the answers and words them.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from .errors import ArgumentError, ArgumentTypeError

DIRECTIONS = ("forward", "backward_data", "backward_weights")
_DIRECTION_ALIASES = {"backward_filter": "backward_weights"}
_DTYPE_ALIASES = {"f32": "float32", "fp32": "float32", "float": "float32", "bf16": "bfloat16",
                  "f16": "float16", "fp16": "float16", "half": "float16", "f64": "float64",
                  "fp64": "float64", "double": "float64"}
SHORT = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "float64": "f64"}


def _direction(direction) -> str:
    if not isinstance(direction, str):
        raise ArgumentTypeError(f"direction must be a str, one of {list(DIRECTIONS)}, got {type(direction).__name__}")
    d = _DIRECTION_ALIASES.get(direction, direction)
    if d not in DIRECTIONS:
        raise ArgumentError(f"direction must be one of {list(DIRECTIONS)} (or 'backward_filter'), got {direction!r}")
    return d


def _dtype(dtype) -> str:
    """A dtype name from a str (``"bfloat16"``, ``"bf16"``) or a torch dtype (``torch.bfloat16``)."""
    if not isinstance(dtype, str):
        text = str(dtype)
        if not text.startswith("torch."):
            raise ArgumentTypeError(f"dtype must be a str or a torch dtype, got {type(dtype).__name__}")
        dtype = text[len("torch."):]
    return _DTYPE_ALIASES.get(dtype, dtype)


@dataclass(frozen=True)
class CapabilityRow:
    """One (direction, dtype, fpmath) probe.

    ``implementations``: the non-reference implementations the library listed, in its order,
    each name once; ``reference``: the reference ones (oneDNN's ``ref:any``; none for cuDNN);
    ``status``: ``"ok"``, or the library's status when it listed nothing (``"dnnl_unimplemented"``);
    ``setting``: how the precision was asked for, in the library's words (``"fpmath bf16"``,
    ``"math fma"``), or '' when there is nothing to say; ``down_converts``: for float32 with a
    reduced-precision mode, the implementations whose results showed inputs rounded to that
    precision (empty: all of them computed in float32), None where not probed.
    """

    direction: str
    dtype: str
    fpmath: str
    implementations: tuple = ()
    reference: tuple = ()
    status: str = "ok"
    setting: str = ""
    down_converts: tuple | None = None

    @property
    def offered(self) -> bool:
        """True when the library offers a non-reference implementation."""
        return bool(self.implementations)

    def __repr__(self) -> str:
        what = ", ".join(self.implementations) or ("reference only: " + ", ".join(self.reference)
                                                    if self.reference else self.status)
        mode = f" ({self.setting})" if self.setting else ""
        return f"<CapabilityRow {self.direction} {self.dtype} {self.fpmath}{mode}: {what}>"


@dataclass(frozen=True)
class Capabilities:
    """What ``library`` ``version`` offers on ``platform`` (oneDNN: the effective CPU ISA, e.g.
    ``"avx2"``; cuDNN: the GPU and its compute capability), per direction, dtype and precision
    mode, found on the tiny problem ``probe``.

    ``offered(direction, dtype, fpmath="strict")`` says whether a non-reference implementation
    exists; ``reason(...)`` words the answer in one line (for skips and errors);
    ``down_converts(direction, fpmath)`` says whether a float32 precision mode really rounds
    inputs; ``summary()`` gives one compact line per direction; ``as_dict()`` everything, for JSON.
    Directions: "forward", "backward_data", "backward_weights" ("backward_filter" is accepted);
    dtypes: names (``"bfloat16"``, ``"bf16"``) or torch dtypes. Asking for a combination that
    was not probed raises :class:`~rawconv.errors.ArgumentError`.
    """

    library: str
    version: str
    platform: str
    probe: str
    rows: tuple

    # ---------------------------------------------------------------- look-up
    def row(self, direction: str, dtype="float32", fpmath: str = "strict") -> CapabilityRow:
        """The probe row for ``(direction, dtype, fpmath)``."""
        d, dt = _direction(direction), _dtype(dtype)
        if not isinstance(fpmath, str):
            raise ArgumentTypeError(f"fpmath must be a str, got {type(fpmath).__name__}")
        for r in self.rows:
            if r.direction == d and r.dtype == dt and r.fpmath == fpmath:
                return r
        probed = sorted({(r.dtype, r.fpmath) for r in self.rows if r.direction == d})
        raise ArgumentError(f"{self.library} capabilities have no row for {dt} {d} with fpmath {fpmath!r}; "
                            f"probed (dtype, fpmath): {probed}")

    def offered(self, direction: str, dtype="float32", fpmath: str = "strict") -> bool:
        """Whether a non-reference implementation is offered for ``(direction, dtype, fpmath)``."""
        return self.row(direction, dtype, fpmath).offered

    def down_converts(self, direction: str, fpmath: str, dtype="float32") -> bool | None:
        """Whether any listed implementation rounds float32 inputs under ``fpmath`` (measured on
        the probe; None when not probed, e.g. for ``"strict"``)."""
        dc = self.row(direction, dtype, fpmath).down_converts
        return None if dc is None else bool(dc)

    def _what(self, r: CapabilityRow) -> str:
        return f"{r.dtype} {r.direction} convolution" + (f" with {r.setting}" if r.setting else "")

    def reason(self, direction: str, dtype="float32", fpmath: str = "strict") -> str:
        """One line saying what is offered, naming the library's version and the platform, e.g.
        ``"oneDNN 3.2.0 on avx2 offers no bfloat16 backward_weights convolution (dnnl_unimplemented)"``."""
        r = self.row(direction, dtype, fpmath)
        who = f"{self.library} {self.version} on {self.platform}"
        if r.offered:
            text = f"{who} offers {self._what(r)}: {', '.join(r.implementations)}"
            if r.down_converts is not None:
                if r.down_converts:
                    text += f"; inputs rounded to {r.fpmath} by {', '.join(r.down_converts)}"
                else:
                    text += f"; none of them rounds inputs to {r.fpmath} (float32 arithmetic)"
            return text
        if r.reference:
            return f"{who} offers only its reference implementation ({', '.join(r.reference)}) for {self._what(r)}"
        return f"{who} offers no {self._what(r)} ({r.status})"

    # ---------------------------------------------------------------- reports
    def summary(self) -> dict:
        """One compact line per direction: ``{"forward": "f32 yes, bf16 no, f16 no; fpmath
        down-converts: bf16 no, f16 no, tf32 no, any no", ...}`` ("ref only": only a reference
        implementation; a mode such as cuDNN's TF32 shows as its own name)."""
        out = {}
        for d in DIRECTIONS:
            rows = [r for r in self.rows if r.direction == d]
            if not rows:
                continue
            parts, modes = [], []
            for r in rows:
                word = "yes" if r.offered else ("ref only" if r.reference else "no")
                if r.fpmath == "strict":
                    parts.append(f"{SHORT.get(r.dtype, r.dtype)} {word}")
                elif r.down_converts is None:
                    parts.append(f"{r.fpmath} {word}")
                elif r.offered:
                    modes.append(f"{r.fpmath} {'yes' if r.down_converts else 'no'}")
            line = ", ".join(parts)
            if modes:
                line += "; fpmath down-converts: " + ", ".join(modes)
            out[d] = line
        return out

    def as_dict(self) -> dict:
        """Everything as plain JSON-ready values (rows as dicts with ``offered`` and ``reason``)."""
        rows = []
        for r in self.rows:
            d = asdict(r)
            d["implementations"] = list(r.implementations)
            d["reference"] = list(r.reference)
            d["down_converts"] = None if r.down_converts is None else list(r.down_converts)
            d["offered"] = r.offered
            d["reason"] = self.reason(r.direction, r.dtype, r.fpmath)
            rows.append(d)
        return {"library": self.library, "version": self.version, "platform": self.platform,
                "probe": self.probe, "rows": rows}

    def __str__(self) -> str:
        lines = [f"{self.library} {self.version} on {self.platform} (probe: {self.probe})"]
        lines += [f"  {d}: {s}" for d, s in self.summary().items()]
        return "\n".join(lines)

    __repr__ = __str__   # what a notebook shows: the summary, not the rows one by one
