"""cuDNN graph (backend) API: descriptors built from Python values, every status checked.

No torch semantics here; names and terms follow the cuDNN backend API (``cdefs/cudnn_graph.h``,
parsed by :mod:`rawconv._cudnn`). Each function builds one kind of backend descriptor, so that the
convolution code in :mod:`rawconv.cudnn_graph` reads as the graph it builds::

    x = tensor(1, dims, strides, "float16")            # CUDNN_BACKEND_TENSOR_DESCRIPTOR
    conv = convolution(2, "float32", ...)               # CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR
    op = conv_forward(x, w, y, conv, "float32")         # CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR
    graph = operation_graph(handle, [op])               # CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR
    cfgs = heuristics(graph, "instant")                 # CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR -> ENGINECFGs
    cfg = engine_config(engine(graph, 28), {2: 3})      # ENGINE (global index) + KNOB_CHOICEs -> ENGINECFG
    plan = execution_plan(handle, cfg)                  # CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR
    vp = variant_pack([1, 2, 3], [px, pw, py], pws)     # CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR
    execute(handle, plan, vp)                           # cudnnBackendExecute

Every descriptor is a :class:`Descriptor` whose C object is destroyed by ``ffi.gc``
(``cudnnBackendDestroyDescriptor``); a descriptor keeps the descriptors it references alive.
Attribute getters ask cuDNN for the element count first (0 requested elements), then for the
elements. Enum values come from the declarations (``ffi.integer_const``), so bad input is
rejected with :class:`~rawconv.errors.ArgumentError` before any C call; a failing status raises
:class:`~rawconv.errors.NotSupportedError` (``CUDNN_STATUS_NOT_SUPPORTED*``) or
:class:`~rawconv.errors.LibraryError`.
"""
from __future__ import annotations

from typing import Iterable, Sequence

from .. import _ffi as _cudnn
from ...core.errors import ArgumentError, ArgumentTypeError

ffi = _cudnn.ffi

# cudnnBackendAttributeType_t (without CUDNN_TYPE_) -> the C element type of the attribute array
ELEMENT_TYPES = {
    "HANDLE": "cudnnHandle_t",
    "DATA_TYPE": "cudnnDataType_t",
    "BOOLEAN": "bool",
    "INT64": "int64_t",
    "FLOAT": "float",
    "DOUBLE": "double",
    "VOID_PTR": "void *",
    "CONVOLUTION_MODE": "cudnnConvolutionMode_t",
    "HEUR_MODE": "cudnnBackendHeurMode_t",
    "KNOB_TYPE": "cudnnBackendKnobType_t",
    "NUMERICAL_NOTE": "cudnnBackendNumericalNote_t",
    "LAYOUT_TYPE": "cudnnBackendLayoutType_t",
    "ATTRIB_NAME": "cudnnBackendAttributeName_t",
    "POINTWISE_MODE": "cudnnPointwiseMode_t",
    "NAN_PROPOGATION": "cudnnNanPropagation_t",   # (cuDNN's spelling)
    "BACKEND_DESCRIPTOR": "cudnnBackendDescriptor_t",
    "BEHAVIOR_NOTE": "cudnnBackendBehaviorNote_t",
    "INT32": "int32_t",
    "CHAR": "char",
}

DATA_TYPES = {"float32": "CUDNN_DATA_FLOAT", "float64": "CUDNN_DATA_DOUBLE", "float16": "CUDNN_DATA_HALF",
              "bfloat16": "CUDNN_DATA_BFLOAT16"}
DATA_TYPE_SIZES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}
HEUR_MODES = {"instant": "CUDNN_HEUR_MODE_INSTANT", "a": "CUDNN_HEUR_MODE_A", "b": "CUDNN_HEUR_MODE_B",
              "fallback": "CUDNN_HEUR_MODE_FALLBACK"}
POINTWISE_MODES = {"add": "CUDNN_POINTWISE_ADD", "mul": "CUDNN_POINTWISE_MUL",
                   "identity": "CUDNN_POINTWISE_IDENTITY", "relu": "CUDNN_POINTWISE_RELU_FWD",
                   "tanh": "CUDNN_POINTWISE_TANH_FWD", "sigmoid": "CUDNN_POINTWISE_SIGMOID_FWD",
                   "elu": "CUDNN_POINTWISE_ELU_FWD", "gelu": "CUDNN_POINTWISE_GELU_FWD",
                   "swish": "CUDNN_POINTWISE_SWISH_FWD", "silu": "CUDNN_POINTWISE_SWISH_FWD",
                   "gelu_tanh": "CUDNN_POINTWISE_GELU_APPROX_TANH_FWD", "relu6": "CUDNN_POINTWISE_RELU_FWD"}
#: set CUDNN_PROPAGATE_NAN on the ReLU family's nodes (torch keeps NaN through relu); False leaves
#: cuDNN's default (which drops it), should an engine refuse the attribute
RELU_PROPAGATE_NAN = True
# the attributes a mode's descriptor is given besides mode and precision (name, type, value): NaN kept
# through the ReLU family (cuDNN's default drops it, as cudnn-frontend's builder's does), the upper
# clip of ReLU6, SiLU as swish with beta 1
POINTWISE_ATTRIBUTES = {
    "relu": (("POINTWISE_NAN_PROPAGATION", "NAN_PROPOGATION", "CUDNN_PROPAGATE_NAN"),
             ("POINTWISE_RELU_LOWER_CLIP", "DOUBLE", 0.0)),
    "relu6": (("POINTWISE_NAN_PROPAGATION", "NAN_PROPOGATION", "CUDNN_PROPAGATE_NAN"),
              ("POINTWISE_RELU_LOWER_CLIP", "DOUBLE", 0.0), ("POINTWISE_RELU_UPPER_CLIP", "DOUBLE", 6.0),
              ("POINTWISE_RELU_LOWER_CLIP_SLOPE", "DOUBLE", 0.0)),
    "swish": (("POINTWISE_SWISH_BETA", "DOUBLE", 1.0),),
    "silu": (("POINTWISE_SWISH_BETA", "DOUBLE", 1.0),),
}
MAX_DIMS = 8


def const(name: str) -> int:
    """The integer value of an enum constant from the declarations (no library needed).
    Raises :class:`ArgumentError` for a name the declarations do not have."""
    try:
        return _cudnn.ENUMS[name]
    except KeyError:
        raise ArgumentError(f"{name} is not in rawconv's cuDNN declarations (cdefs/cudnn_graph.h)") from None


def enum_name(ctype: str, value: int, prefix: str = "") -> str:
    """The declared name of ``value`` in enum ``ctype``, with ``prefix`` removed (``str(value)`` if unknown)."""
    s = ffi.string(ffi.cast(ctype, int(value)))
    if isinstance(s, bytes):
        s = s.decode()
    return s[len(prefix):] if prefix and s.startswith(prefix) else s


def knob_type_name(value: int) -> str:
    """``CUDNN_KNOB_TYPE_TILE_SIZE`` -> ``"TILE_SIZE"`` for a knob type value."""
    return enum_name("cudnnBackendKnobType_t", value, "CUDNN_KNOB_TYPE_")


# ---------------------------------------------------------------------------- descriptor
def _destroy(ptr, _lib=None):
    try:
        (_lib or _cudnn.lib()).cudnnBackendDestroyDescriptor(ptr)
    except Exception:  # interpreter shutdown
        pass


class Descriptor:
    """One cuDNN backend descriptor (``cudnnBackendDescriptor_t``) of kind ``kind``
    (``"TENSOR"`` for ``CUDNN_BACKEND_TENSOR_DESCRIPTOR``...).

    Created by ``cudnnBackendCreateDescriptor``; destroyed (``cudnnBackendDestroyDescriptor``)
    when garbage-collected. ``set`` / ``finalize`` / ``get*`` check every status.
    """

    __slots__ = ("kind", "ptr", "finalized", "_refs", "__weakref__")

    def __init__(self, kind: str):
        value = const(f"CUDNN_BACKEND_{kind}_DESCRIPTOR")
        L = _cudnn.lib()
        p = ffi.new("cudnnBackendDescriptor_t *")
        _cudnn.check(L.cudnnBackendCreateDescriptor(value, p), "cudnnBackendCreateDescriptor", kind)
        self.kind = kind
        self.ptr = ffi.gc(p[0], lambda d, _L=L, _f=_destroy: _f(d, _L))   # no module globals at exit
        self.finalized = False
        self._refs: list = []

    def __repr__(self) -> str:
        return f"<cuDNN {self.kind} descriptor{' (finalized)' if self.finalized else ''}>"

    def set(self, attr: str, attr_type: str, values) -> "Descriptor":
        """Set attribute ``CUDNN_ATTR_<attr>`` of type ``CUDNN_TYPE_<attr_type>`` to ``values``
        (one value or a sequence). Wraps ``cudnnBackendSetAttribute``."""
        name, typ, arr, n = _attribute_array(attr, attr_type, values)
        if attr_type == "BACKEND_DESCRIPTOR":
            self._refs.extend(values if isinstance(values, (list, tuple)) else [values])
        _cudnn.check(_cudnn.lib().cudnnBackendSetAttribute(self.ptr, name, typ, n, arr),
                     "cudnnBackendSetAttribute", f"{self.kind}: CUDNN_ATTR_{attr}")
        return self

    def finalize(self) -> "Descriptor":
        """Wraps ``cudnnBackendFinalize``."""
        _cudnn.check(_cudnn.lib().cudnnBackendFinalize(self.ptr), "cudnnBackendFinalize", self.kind)
        self.finalized = True
        return self

    def count(self, attr: str, attr_type: str) -> int:
        """Number of elements attribute ``CUDNN_ATTR_<attr>`` holds (asks with 0 requested
        elements). Wraps ``cudnnBackendGetAttribute``."""
        n = ffi.new("int64_t *")
        _cudnn.check(_cudnn.lib().cudnnBackendGetAttribute(
            self.ptr, const("CUDNN_ATTR_" + attr), const("CUDNN_TYPE_" + attr_type), 0, n, ffi.NULL),
            "cudnnBackendGetAttribute", f"{self.kind}: count of CUDNN_ATTR_{attr}")
        return int(n[0])

    def get(self, attr: str, attr_type: str, count: int | None = None) -> list:
        """The values of attribute ``CUDNN_ATTR_<attr>`` (ints, floats; for ``CHAR`` one str).
        Asks for the count first unless ``count`` is given. Wraps ``cudnnBackendGetAttribute``."""
        if attr_type == "BACKEND_DESCRIPTOR":
            raise ArgumentError("use get_descriptors() for descriptor-valued attributes")
        n = self.count(attr, attr_type) if count is None else int(count)
        if n <= 0:
            return "" if attr_type == "CHAR" else []
        arr = ffi.new(f"{ELEMENT_TYPES[attr_type]}[{n}]")
        got = ffi.new("int64_t *")
        _cudnn.check(_cudnn.lib().cudnnBackendGetAttribute(
            self.ptr, const("CUDNN_ATTR_" + attr), const("CUDNN_TYPE_" + attr_type), n, got, arr),
            "cudnnBackendGetAttribute", f"{self.kind}: CUDNN_ATTR_{attr}")
        m = min(int(got[0]), n)
        if attr_type == "CHAR":
            return ffi.string(arr, m).decode(errors="replace")
        return [arr[i] for i in range(m)]

    def get_one(self, attr: str, attr_type: str):
        """The single value of a one-element attribute (``count`` is not asked)."""
        vals = self.get(attr, attr_type, 1)
        if not vals:
            raise ArgumentError(f"{self.kind}: CUDNN_ATTR_{attr} holds no value")
        return vals[0]

    def get_descriptors(self, attr: str, kind: str, count: int | None = None) -> list["Descriptor"]:
        """Descriptor-valued attribute ``CUDNN_ATTR_<attr>``: cuDNN fills descriptors of ``kind``
        that rawconv creates and passes in (count asked first unless given).
        Wraps ``cudnnBackendGetAttribute``."""
        n = self.count(attr, "BACKEND_DESCRIPTOR") if count is None else int(count)
        if n <= 0:
            return []
        descs = [Descriptor(kind) for _ in range(n)]
        arr = ffi.new(f"cudnnBackendDescriptor_t[{n}]", [d.ptr for d in descs])
        got = ffi.new("int64_t *")
        _cudnn.check(_cudnn.lib().cudnnBackendGetAttribute(
            self.ptr, const("CUDNN_ATTR_" + attr), const("CUDNN_TYPE_BACKEND_DESCRIPTOR"), n, got, arr),
            "cudnnBackendGetAttribute", f"{self.kind}: CUDNN_ATTR_{attr}")
        for d in descs:
            d.finalized = True  # cuDNN hands back finalized descriptors
        return descs[: min(int(got[0]), n)]


def _attribute_array(attr: str, attr_type: str, values):
    """(attribute enum, type enum, C array, element count) for ``set``; validates before any C call."""
    if attr_type not in ELEMENT_TYPES:
        raise ArgumentError(f"unknown attribute type {attr_type!r}; known: {sorted(ELEMENT_TYPES)}")
    name = const("CUDNN_ATTR_" + attr)
    typ = const("CUDNN_TYPE_" + attr_type)
    vals = list(values) if isinstance(values, (list, tuple)) else [values]
    if not vals:
        return name, typ, ffi.NULL, 0
    if attr_type == "BACKEND_DESCRIPTOR":
        for v in vals:
            if not isinstance(v, Descriptor):
                raise ArgumentTypeError(f"CUDNN_ATTR_{attr} takes Descriptor values, got {type(v).__name__}")
        return name, typ, ffi.new(f"cudnnBackendDescriptor_t[{len(vals)}]", [v.ptr for v in vals]), len(vals)
    if attr_type in ("VOID_PTR", "HANDLE"):
        ctype = ELEMENT_TYPES[attr_type]
        cvals = [v if isinstance(v, ffi.CData) else ffi.cast(ctype, int(v)) for v in vals]
        return name, typ, ffi.new(f"{ctype}[{len(cvals)}]", cvals), len(cvals)
    if attr_type in ("FLOAT", "DOUBLE"):
        for v in vals:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ArgumentTypeError(f"CUDNN_ATTR_{attr} takes numbers, got {v!r}")
    elif attr_type == "BOOLEAN":
        vals = [bool(v) for v in vals]
    else:
        for v in vals:
            if isinstance(v, bool) or not isinstance(v, int):
                raise ArgumentTypeError(f"CUDNN_ATTR_{attr} ({attr_type}) takes ints, got {v!r}")
        if attr_type == "INT64":
            for v in vals:
                if not -2 ** 63 <= v < 2 ** 63:
                    raise ArgumentError(f"CUDNN_ATTR_{attr}: {v} does not fit in int64")
    return name, typ, ffi.new(f"{ELEMENT_TYPES[attr_type]}[{len(vals)}]", vals), len(vals)


# ---------------------------------------------------------------------------- graph pieces
def data_type(name: str) -> int:
    """``cudnnDataType_t`` value for ``"float32"``, ``"float16"``, ``"bfloat16"``, ``"float64"``."""
    if name not in DATA_TYPES:
        raise ArgumentError(f"cuDNN graph data type must be one of {list(DATA_TYPES)}, got {name!r}")
    return const(DATA_TYPES[name])


def _ints(values, what: str, n: int | None = None, minimum: int | None = None) -> list[int]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ArgumentTypeError(f"{what} must be a sequence of ints, got {values!r}")
    out = list(values)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in out):
        raise ArgumentTypeError(f"{what} must be ints, got {out!r}")
    if n is not None and len(out) != n:
        raise ArgumentError(f"{what} must have {n} elements, got {len(out)}: {out}")
    if minimum is not None and any(v < minimum for v in out):
        raise ArgumentError(f"{what} must be >= {minimum}, got {out}")
    return out


def tensor(uid: int, dims: Sequence[int], strides: Sequence[int], dtype: str, *, alignment: int = 16,
           virtual: bool = False) -> Descriptor:
    """A finalized ``CUDNN_BACKEND_TENSOR_DESCRIPTOR``.

    ``uid``: the unique id the variant pack uses (int >= 0); ``dims``/``strides``: in elements,
    (N, C, *spatial) order, 3 to 8 dims; ``dtype``: a :data:`DATA_TYPES` key; ``alignment``: the
    byte alignment every data pointer bound to it will have (a multiple of the element size);
    ``virtual``: an intermediate of the graph (no data pointer). Raises :class:`ArgumentError`
    before any C call for bad values. Wraps ``cudnnBackendSetAttribute`` / ``cudnnBackendFinalize``.
    """
    if isinstance(uid, bool) or not isinstance(uid, int) or uid < 0:
        raise ArgumentError(f"tensor unique id must be a non-negative int, got {uid!r}")
    dims = _ints(dims, "tensor dims", minimum=1)
    strides = _ints(strides, "tensor strides", len(dims), minimum=0)
    if not 3 <= len(dims) <= MAX_DIMS:
        raise ArgumentError(f"tensor must have 3 to {MAX_DIMS} dims, got {len(dims)}")
    dt = data_type(dtype)
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment <= 0 or \
            alignment % DATA_TYPE_SIZES[dtype]:
        raise ArgumentError(f"alignment must be a positive multiple of the element size "
                            f"({DATA_TYPE_SIZES[dtype]} bytes for {dtype}), got {alignment!r}")
    d = Descriptor("TENSOR")
    d.set("TENSOR_UNIQUE_ID", "INT64", uid)
    d.set("TENSOR_DATA_TYPE", "DATA_TYPE", dt)
    d.set("TENSOR_BYTE_ALIGNMENT", "INT64", alignment)
    d.set("TENSOR_DIMENSIONS", "INT64", dims)
    d.set("TENSOR_STRIDES", "INT64", strides)
    if virtual:
        d.set("TENSOR_IS_VIRTUAL", "BOOLEAN", True)
    return d.finalize()


def convolution(spatial_dims: int, compute: str, *, dilations: Sequence[int], strides: Sequence[int],
                pre_paddings: Sequence[int], post_paddings: Sequence[int]) -> Descriptor:
    """A finalized ``CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR`` in cross-correlation mode (what torch
    and every deep-learning framework call convolution).

    ``spatial_dims``: 2 or 3 (1-D problems are described as 2-D with a unit height);
    ``compute``: the compute (accumulation) data type; ``dilations``: torch's (1 = none);
    ``strides``, ``pre_paddings``, ``post_paddings``: one per spatial dim. Wraps
    ``cudnnBackendSetAttribute`` / ``cudnnBackendFinalize``.
    """
    if spatial_dims not in (1, 2, 3) or isinstance(spatial_dims, bool):
        raise ArgumentError(f"spatial_dims must be 1, 2 or 3, got {spatial_dims!r}")
    dil = _ints(dilations, "dilations", spatial_dims, 1)
    st = _ints(strides, "strides", spatial_dims, 1)
    pre = _ints(pre_paddings, "pre_paddings", spatial_dims, 0)
    post = _ints(post_paddings, "post_paddings", spatial_dims, 0)
    d = Descriptor("CONVOLUTION")
    d.set("CONVOLUTION_COMP_TYPE", "DATA_TYPE", data_type(compute))
    d.set("CONVOLUTION_CONV_MODE", "CONVOLUTION_MODE", const("CUDNN_CROSS_CORRELATION"))
    d.set("CONVOLUTION_SPATIAL_DIMS", "INT64", spatial_dims)
    d.set("CONVOLUTION_DILATIONS", "INT64", dil)
    d.set("CONVOLUTION_FILTER_STRIDES", "INT64", st)
    d.set("CONVOLUTION_PRE_PADDINGS", "INT64", pre)
    d.set("CONVOLUTION_POST_PADDINGS", "INT64", post)
    return d.finalize()


def _scale_type(compute: str) -> str:
    return "DOUBLE" if compute == "float64" else "FLOAT"


_CONV_OPS = {
    # direction: (descriptor kind, attribute prefix, (attr, tensor role) x3)
    "forward": ("OPERATION_CONVOLUTION_FORWARD", "OPERATION_CONVOLUTION_FORWARD_", ("X", "W", "Y")),
    "backward_data": ("OPERATION_CONVOLUTION_BACKWARD_DATA", "OPERATION_CONVOLUTION_BWD_DATA_", ("DX", "W", "DY")),
    "backward_filter": ("OPERATION_CONVOLUTION_BACKWARD_FILTER", "OPERATION_CONVOLUTION_BWD_FILTER_",
                        ("X", "DW", "DY")),
}


def conv_operation(direction: str, tensors: dict, conv: Descriptor, compute: str, *, alpha: float = 1.0,
                   beta: float = 0.0) -> Descriptor:
    """A finalized convolution operation node.

    ``direction``: ``"forward"`` (tensors ``X``, ``W``, ``Y``), ``"backward_data"`` (``DX``,
    ``W``, ``DY``) or ``"backward_filter"`` (``X``, ``DW``, ``DY``); ``tensors`` maps those
    names to tensor descriptors; ``conv``: a convolution descriptor; ``alpha``/``beta``: the
    blend factors (``out = alpha * conv + beta * out``), float (double for float64 compute).
    Wraps ``cudnnBackendSetAttribute`` / ``cudnnBackendFinalize`` on
    ``CUDNN_BACKEND_OPERATION_CONVOLUTION_{FORWARD,BACKWARD_DATA,BACKWARD_FILTER}_DESCRIPTOR``.
    """
    if direction not in _CONV_OPS:
        raise ArgumentError(f"direction must be one of {list(_CONV_OPS)}, got {direction!r}")
    kind, prefix, roles = _CONV_OPS[direction]
    missing = [r for r in roles if r not in tensors]
    if missing:
        raise ArgumentError(f"{direction} convolution needs tensors {list(roles)}; missing {missing}")
    d = Descriptor(kind)
    for role in roles:
        d.set(prefix + role, "BACKEND_DESCRIPTOR", tensors[role])
    d.set(prefix + "CONV_DESC", "BACKEND_DESCRIPTOR", conv)
    st = _scale_type(compute)
    d.set(prefix + "ALPHA", st, float(alpha))
    d.set(prefix + "BETA", st, float(beta))
    return d.finalize()


def pointwise(mode: str, compute: str = "float32") -> Descriptor:
    """A finalized ``CUDNN_BACKEND_POINTWISE_DESCRIPTOR`` of ``mode`` (a :data:`POINTWISE_MODES`
    key: ``"add"``, ``"relu"``, ...) computing in ``compute``, with the mode's
    :data:`POINTWISE_ATTRIBUTES` (NaN propagation, clips, swish beta). Wraps
    ``cudnnBackendSetAttribute`` and ``cudnnBackendFinalize``."""
    if mode not in POINTWISE_MODES:
        raise ArgumentError(f"pointwise mode must be one of {list(POINTWISE_MODES)}, got {mode!r}")
    d = Descriptor("POINTWISE")
    d.set("POINTWISE_MODE", "POINTWISE_MODE", const(POINTWISE_MODES[mode]))
    d.set("POINTWISE_MATH_PREC", "DATA_TYPE", data_type(compute))
    for attr, typ, value in POINTWISE_ATTRIBUTES.get(mode, ()):
        if attr == "POINTWISE_NAN_PROPAGATION" and not RELU_PROPAGATE_NAN:
            continue
        d.set(attr, typ, const(value) if isinstance(value, str) else value)
    return d.finalize()


def pointwise_operation(pw: Descriptor, x: Descriptor, y: Descriptor, b: Descriptor | None = None) -> Descriptor:
    """A finalized ``CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR``: ``y = pw(x[, b])``."""
    d = Descriptor("OPERATION_POINTWISE")
    d.set("OPERATION_POINTWISE_PW_DESCRIPTOR", "BACKEND_DESCRIPTOR", pw)
    d.set("OPERATION_POINTWISE_XDESC", "BACKEND_DESCRIPTOR", x)
    if b is not None:
        d.set("OPERATION_POINTWISE_BDESC", "BACKEND_DESCRIPTOR", b)
    d.set("OPERATION_POINTWISE_YDESC", "BACKEND_DESCRIPTOR", y)
    return d.finalize()


def operation_graph(handle, ops: Sequence[Descriptor]) -> Descriptor:
    """A finalized ``CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR`` of ``ops`` on ``handle`` (a
    ``cudnnHandle_t``: needs a GPU). Raises :class:`~rawconv.errors.NotSupportedError` when
    cuDNN does not support the combination of operations."""
    if not ops:
        raise ArgumentError("an operation graph needs at least one operation")
    d = Descriptor("OPERATIONGRAPH")
    d.set("OPERATIONGRAPH_HANDLE", "HANDLE", handle)
    d.set("OPERATIONGRAPH_OPS", "BACKEND_DESCRIPTOR", list(ops))
    return d.finalize()


def engine_global_count(graph: Descriptor) -> int:
    """``CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT``: engines are global indices 0..count-1."""
    return int(graph.get_one("OPERATIONGRAPH_ENGINE_GLOBAL_COUNT", "INT64"))


def heuristics(graph: Descriptor, mode: str) -> list[Descriptor]:
    """The engine configs (``CUDNN_BACKEND_ENGINECFG_DESCRIPTOR``) heuristic ``mode``
    (``"instant"``, ``"a"``, ``"b"``, ``"fallback"``) returns for ``graph``, best first.
    Wraps ``cudnnBackendFinalize`` on a ``CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR`` and
    ``cudnnBackendGetAttribute(CUDNN_ATTR_ENGINEHEUR_RESULTS)``."""
    if mode not in HEUR_MODES:
        raise ArgumentError(f"heuristic mode must be one of {list(HEUR_MODES)}, got {mode!r}")
    h = Descriptor("ENGINEHEUR")
    h.set("ENGINEHEUR_OPERATION_GRAPH", "BACKEND_DESCRIPTOR", graph)
    h.set("ENGINEHEUR_MODE", "HEUR_MODE", const(HEUR_MODES[mode]))
    h.finalize()
    return h.get_descriptors("ENGINEHEUR_RESULTS", "ENGINECFG")


def engine(graph: Descriptor, index: int) -> Descriptor:
    """A finalized ``CUDNN_BACKEND_ENGINE_DESCRIPTOR``: engine ``index`` (global index) for
    ``graph``. Raises :class:`~rawconv.errors.NotSupportedError` when that engine does not
    support the graph."""
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ArgumentError(f"engine global index must be a non-negative int, got {index!r}")
    d = Descriptor("ENGINE")
    d.set("ENGINE_OPERATION_GRAPH", "BACKEND_DESCRIPTOR", graph)
    d.set("ENGINE_GLOBAL_INDEX", "INT64", index)
    return d.finalize()


def knob_info(eng: Descriptor) -> list[tuple[int, int, int, int]]:
    """The knobs of engine ``eng``: ``(knob type, minimum, maximum, stride)`` each, in cuDNN's
    order. Valid values of a knob are ``minimum, minimum + stride, ..., maximum``.
    Wraps ``cudnnBackendGetAttribute(CUDNN_ATTR_ENGINE_KNOB_INFO)``."""
    out = []
    for k in eng.get_descriptors("ENGINE_KNOB_INFO", "KNOB_INFO"):
        out.append((int(k.get_one("KNOB_INFO_TYPE", "KNOB_TYPE")),
                    int(k.get_one("KNOB_INFO_MINIMUM_VALUE", "INT64")),
                    int(k.get_one("KNOB_INFO_MAXIMUM_VALUE", "INT64")),
                    int(k.get_one("KNOB_INFO_STRIDE", "INT64"))))
    return out


def knob_choice(knob_type: int, value: int) -> Descriptor:
    """A finalized ``CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR`` (knob type value, knob value)."""
    if isinstance(knob_type, bool) or not isinstance(knob_type, int) or knob_type < 0:
        raise ArgumentError(f"knob type must be a non-negative int, got {knob_type!r}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentError(f"knob value must be an int, got {value!r}")
    d = Descriptor("KNOB_CHOICE")
    d.set("KNOB_CHOICE_KNOB_TYPE", "KNOB_TYPE", knob_type)
    d.set("KNOB_CHOICE_KNOB_VALUE", "INT64", value)
    return d.finalize()


def engine_config(eng: Descriptor, knobs: dict | Sequence = ()) -> Descriptor:
    """A finalized ``CUDNN_BACKEND_ENGINECFG_DESCRIPTOR``: engine ``eng`` with knob choices
    ``knobs`` (``{knob type: value}`` or ``(type, value)`` pairs; none = the engine's defaults)."""
    items = sorted(knobs.items()) if isinstance(knobs, dict) else list(knobs)
    d = Descriptor("ENGINECFG")
    d.set("ENGINECFG_ENGINE", "BACKEND_DESCRIPTOR", eng)
    if items:
        d.set("ENGINECFG_KNOB_CHOICES", "BACKEND_DESCRIPTOR", [knob_choice(t, v) for t, v in items])
    return d.finalize()


def describe_config(cfg: Descriptor) -> dict:
    """What an engine config holds: ``engine`` (global index), ``knobs`` (``{type: value}``),
    ``numerical_notes`` and ``behavior_notes`` (names without their C prefix), and
    ``workspace`` (``CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE`` when cuDNN reports it, else None)."""
    eng = cfg.get_descriptors("ENGINECFG_ENGINE", "ENGINE", 1)[0]
    index = int(eng.get_one("ENGINE_GLOBAL_INDEX", "INT64"))
    knobs = {}
    # asked with room for every knob type: a count query (0 elements) answers 0 for this attribute
    for kc in cfg.get_descriptors("ENGINECFG_KNOB_CHOICES", "KNOB_CHOICE", const("CUDNN_KNOB_TYPE_COUNTS")):
        knobs[int(kc.get_one("KNOB_CHOICE_KNOB_TYPE", "KNOB_TYPE"))] = int(kc.get_one("KNOB_CHOICE_KNOB_VALUE", "INT64"))
    info = engine_notes(eng)
    try:
        ws = int(cfg.get_one("ENGINECFG_WORKSPACE_SIZE", "INT64"))
    except Exception:  # older cuDNN: not reported on the config
        ws = None
    return {"engine": index, "knobs": knobs, "workspace": ws, **info}


def engine_notes(eng: Descriptor) -> dict:
    """``numerical_notes`` and ``behavior_notes`` of a finalized engine, as name tuples
    (``"TENSOR_CORE"``, ``"RUNTIME_COMPILATION"``...)."""
    num = tuple(enum_name("cudnnBackendNumericalNote_t", v, "CUDNN_NUMERICAL_NOTE_")
                for v in eng.get("ENGINE_NUMERICAL_NOTE", "NUMERICAL_NOTE", const("CUDNN_NUMERICAL_NOTE_TYPE_COUNT")))
    beh = tuple(enum_name("cudnnBackendBehaviorNote_t", v, "CUDNN_BEHAVIOR_NOTE_")
                for v in eng.get("ENGINE_BEHAVIOR_NOTE", "BEHAVIOR_NOTE", const("CUDNN_BEHAVIOR_NOTE_TYPE_COUNT")))
    return {"numerical_notes": num, "behavior_notes": beh}


def execution_plan(handle, cfg: Descriptor) -> Descriptor:
    """A finalized ``CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR`` for engine config ``cfg`` on
    ``handle``. Raises :class:`~rawconv.errors.NotSupportedError` when the config does not
    finalize for this graph and GPU. Engines with the ``RUNTIME_COMPILATION`` behavior note
    compile their kernel here (NVRTC; may take a second)."""
    d = Descriptor("EXECUTION_PLAN")
    d.set("EXECUTION_PLAN_HANDLE", "HANDLE", handle)
    d.set("EXECUTION_PLAN_ENGINE_CONFIG", "BACKEND_DESCRIPTOR", cfg)
    return d.finalize()


def plan_workspace(plan: Descriptor) -> int:
    """Workspace the plan needs, in bytes (``CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE``)."""
    return int(plan.get_one("EXECUTION_PLAN_WORKSPACE_SIZE", "INT64"))


def plan_config(plan: Descriptor) -> dict:
    """The engine config a finalized plan runs, read back from cuDNN
    (``CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG``): see :func:`describe_config`."""
    cfg = plan.get_descriptors("EXECUTION_PLAN_ENGINE_CONFIG", "ENGINECFG", 1)[0]
    return describe_config(cfg)


def plan_json(plan: Descriptor) -> str:
    """cuDNN's JSON serialization of a finalized plan (``CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION``)."""
    return plan.get("EXECUTION_PLAN_JSON_REPRESENTATION", "CHAR")


def variant_pack(uids: Sequence[int], pointers: Sequence[int], workspace: int) -> Descriptor:
    """A finalized ``CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR`` binding device addresses (ints) to
    tensor unique ids, plus the workspace address (0 when the plan needs none)."""
    uids = _ints(uids, "variant pack unique ids")
    ptrs = _ints(pointers, "variant pack data pointers", len(uids), 0)
    d = Descriptor("VARIANT_PACK")
    d.set("VARIANT_PACK_UNIQUE_IDS", "INT64", uids)
    d.set("VARIANT_PACK_DATA_POINTERS", "VOID_PTR", ptrs)
    d.set("VARIANT_PACK_WORKSPACE", "VOID_PTR", int(workspace))
    return d.finalize()


class VariantPacker:
    """:func:`variant_pack` for one graph's unique ids, made once, for the hot path (a new pack per
    new set of data pointers): the ids' C array, the enum values and the library functions are
    looked up here, not per pack. ``packer(pointers, workspace)`` returns the finalized
    :class:`Descriptor`; ``pointers`` must be ints, one per unique id, in the ids' order (the hot
    path's: their count is checked, their values are the callers'). Raises
    :class:`ArgumentError` for a wrong count; a failing status is re-raised by :func:`variant_pack`'s
    checked calls. Wraps ``cudnnBackendCreateDescriptor``,
    ``cudnnBackendSetAttribute``, ``cudnnBackendFinalize``."""

    __slots__ = ("_uids", "_n", "_lib", "_consts")

    def __init__(self, uids: Sequence[int]):
        uids = _ints(uids, "variant pack unique ids")
        self._uids = ffi.new("int64_t[]", uids)
        self._n = len(uids)
        self._lib = _cudnn.lib()
        self._consts = (const("CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR"), const("CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS"),
                        const("CUDNN_TYPE_INT64"), const("CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS"),
                        const("CUDNN_ATTR_VARIANT_PACK_WORKSPACE"), const("CUDNN_TYPE_VOID_PTR"))

    def __call__(self, pointers: Sequence[int], workspace: int) -> Descriptor:
        if len(pointers) != self._n:
            raise ArgumentError(f"variant pack data pointers: {self._n} expected (one per unique id), got "
                                f"{len(pointers)}")
        L = self._lib
        kind, a_uids, t_int64, a_ptrs, a_ws, t_ptr = self._consts
        p = ffi.new("cudnnBackendDescriptor_t *")
        _cudnn.check(L.cudnnBackendCreateDescriptor(kind, p), "cudnnBackendCreateDescriptor", "VARIANT_PACK")
        d = Descriptor.__new__(Descriptor)
        d.kind, d.finalized, d._refs = "VARIANT_PACK", False, []
        d.ptr = ffi.gc(p[0], lambda h, _L=L, _f=_destroy: _f(h, _L))
        # (void * elements given as a uintptr_t array: the same 8 bytes each on every platform cuDNN runs on)
        ptrs = ffi.new("uintptr_t[]", pointers)
        ws = ffi.new("uintptr_t *", workspace)
        status = (L.cudnnBackendSetAttribute(d.ptr, a_uids, t_int64, self._n, self._uids)
                  or L.cudnnBackendSetAttribute(d.ptr, a_ptrs, t_ptr, self._n, ptrs)
                  or L.cudnnBackendSetAttribute(d.ptr, a_ws, t_ptr, 1, ws)
                  or L.cudnnBackendFinalize(d.ptr))
        if status:   # the checked builder says which call failed, and why
            return variant_pack([self._uids[i] for i in range(self._n)], pointers, workspace)
        d.finalized = True
        return d


def execute(handle, plan: Descriptor, vp: Descriptor, detail: str = "") -> None:
    """Run ``plan`` on the tensors of variant pack ``vp`` on ``handle``'s stream (asynchronous).
    Wraps ``cudnnBackendExecute``."""
    _cudnn.check(_cudnn.lib().cudnnBackendExecute(handle, plan.ptr, vp.ptr), "cudnnBackendExecute", detail)
