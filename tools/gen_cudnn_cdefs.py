"""Regenerate cdefs/cudnn_graph.h and cdefs/cudnn.h from the cuDNN 9 headers (maintainer tool, not shipped).

    python tools/gen_cudnn_cdefs.py <cudnn include dir> <out dir>
    # e.g. python tools/gen_cudnn_cdefs.py $VENV/lib/python3.11/site-packages/nvidia/cudnn/include cdefs

The headers are run through ``gcc -E -P -nostdinc`` with small stub headers for the CUDA types
they mention (``cudaStream_t``, ``cudaGraph_t``, ``cudaDataType``, ``libraryPropertyType``,
``stdint.h``, ``stddef.h``), parsed with pycparser, and written back with every enum value
evaluated and written out explicitly, so the text cffi parses states every value.

* ``cudnn_graph.h``: the whole of ``cudnn_graph.h`` (handle, status, versions, data and math
  types, and the complete backend-descriptor API: descriptor types, attribute names and types,
  heuristic modes, notes, knob types, ``cudnnBackend*`` functions).
* ``cudnn.h``: the curated legacy subset rawconv uses from ``cudnn_ops.h`` and ``cudnn_cnn.h``
  (lists below).
"""
from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
import tempfile

from pycparser import c_ast, c_generator, c_parser

STUBS = {
    "cuda_runtime_api.h": "typedef struct CUstream_st *cudaStream_t;\ntypedef struct CUgraph_st *cudaGraph_t;\n",
    "library_types.h": ("typedef enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_64F = 1, CUDA_R_16F = 2, "
                        "CUDA_R_8I = 3, CUDA_R_16BF = 14 } cudaDataType;\n"
                        "typedef enum libraryPropertyType_t { MAJOR_VERSION = 0, MINOR_VERSION = 1, "
                        "PATCH_LEVEL = 2 } libraryPropertyType;\n"),
    "stdint.h": ("typedef signed char int8_t; typedef short int16_t; typedef int int32_t; typedef long int64_t;\n"
                 "typedef unsigned char uint8_t; typedef unsigned short uint16_t; typedef unsigned int uint32_t;"
                 " typedef unsigned long uint64_t;\n"),
    "stddef.h": "typedef unsigned long size_t;\n",
}
STUB_NAMES = {"cudaStream_t", "cudaGraph_t", "cudaDataType", "libraryPropertyType", "size_t",
              "int8_t", "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t", "uint32_t", "uint64_t"}
# What cffi is given for the CUDA types (cffi knows the stdint types and size_t itself).
PRELUDE = STUBS["cuda_runtime_api.h"] + STUBS["library_types.h"]

# ---------------------------------------------------------------- the curated legacy subset
LEGACY_TYPEDEFS = [
    "cudnnTensorDescriptor_t", "cudnnFilterDescriptor_t", "cudnnActivationDescriptor_t",
    "cudnnConvolutionDescriptor_t",
    "cudnnTensorFormat_t", "cudnnDeterminism_t", "cudnnNanPropagation_t", "cudnnActivationMode_t", "cudnnConvolutionMode_t", "cudnnReorderType_t",
    "cudnnConvolutionFwdAlgoPerf_t", "cudnnConvolutionBwdDataAlgoPerf_t", "cudnnConvolutionBwdFilterAlgoPerf_t",
]
LEGACY_FUNCTIONS = [
    # tensors
    "cudnnCreateTensorDescriptor", "cudnnSetTensor4dDescriptor", "cudnnSetTensor4dDescriptorEx",
    "cudnnSetTensorNdDescriptor", "cudnnSetTensorNdDescriptorEx", "cudnnGetTensorNdDescriptor",
    "cudnnGetTensorSizeInBytes", "cudnnDestroyTensorDescriptor", "cudnnAddTensor", "cudnnSetTensor",
    "cudnnTransformTensor",
    # filters
    "cudnnCreateFilterDescriptor", "cudnnSetFilter4dDescriptor", "cudnnSetFilterNdDescriptor",
    "cudnnGetFilterNdDescriptor", "cudnnGetFilterSizeInBytes", "cudnnDestroyFilterDescriptor",
    # activations
    "cudnnCreateActivationDescriptor", "cudnnSetActivationDescriptor", "cudnnGetActivationDescriptor",
    "cudnnDestroyActivationDescriptor", "cudnnActivationForward",
    # convolution descriptors
    "cudnnCreateConvolutionDescriptor", "cudnnDestroyConvolutionDescriptor",
    "cudnnSetConvolutionMathType", "cudnnGetConvolutionMathType",
    "cudnnSetConvolutionGroupCount", "cudnnGetConvolutionGroupCount",
    "cudnnSetConvolutionReorderType", "cudnnGetConvolutionReorderType",
    "cudnnSetConvolution2dDescriptor", "cudnnGetConvolution2dDescriptor",
    "cudnnSetConvolutionNdDescriptor", "cudnnGetConvolutionNdDescriptor",
    "cudnnGetConvolution2dForwardOutputDim", "cudnnGetConvolutionNdForwardOutputDim",
    # forward
    "cudnnGetConvolutionForwardAlgorithmMaxCount", "cudnnGetConvolutionForwardAlgorithm_v7",
    "cudnnFindConvolutionForwardAlgorithm", "cudnnFindConvolutionForwardAlgorithmEx",
    "cudnnGetConvolutionForwardWorkspaceSize", "cudnnConvolutionForward",
    "cudnnConvolutionBiasActivationForward",
    # backward data
    "cudnnGetConvolutionBackwardDataAlgorithmMaxCount", "cudnnGetConvolutionBackwardDataAlgorithm_v7",
    "cudnnFindConvolutionBackwardDataAlgorithm", "cudnnFindConvolutionBackwardDataAlgorithmEx",
    "cudnnGetConvolutionBackwardDataWorkspaceSize", "cudnnConvolutionBackwardData",
    # backward filter
    "cudnnGetConvolutionBackwardFilterAlgorithmMaxCount", "cudnnGetConvolutionBackwardFilterAlgorithm_v7",
    "cudnnFindConvolutionBackwardFilterAlgorithm", "cudnnFindConvolutionBackwardFilterAlgorithmEx",
    "cudnnGetConvolutionBackwardFilterWorkspaceSize", "cudnnConvolutionBackwardFilter",
    "cudnnConvolutionBackwardBias",
    # version checks of the sub-libraries
    "cudnnOpsVersionCheck", "cudnnCnnVersionCheck",
]
# enums defined inside cudnn_ops.h / cudnn_cnn.h that the list above needs (by typedef name)
LEGACY_ENUMS_EXTRA = ["cudnnConvolutionFwdAlgo_t", "cudnnConvolutionBwdDataAlgo_t", "cudnnConvolutionBwdFilterAlgo_t"]


def preprocess(include: str, headers: list[str]) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in STUBS.items():
            with open(os.path.join(tmp, name), "w") as f:
                f.write(text)
        src = os.path.join(tmp, "all.c")
        with open(src, "w") as f:
            f.write('#include "stddef.h"\n' + "".join(f'#include "{h}"\n' for h in headers))
        return subprocess.run(["gcc", "-E", "-P", "-nostdinc", "-I" + tmp, "-I" + include, src],
                              check=True, capture_output=True, text=True).stdout


def version(include: str) -> str:
    text = open(os.path.join(include, "cudnn_version.h")).read()
    get = lambda k: re.search(r"#define CUDNN_%s\s+(\d+)" % k, text).group(1)  # noqa: E731
    return f"{get('MAJOR')}.{get('MINOR')}.{get('PATCHLEVEL')}"


def wheel_of(include: str) -> str:
    site = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(include))))
    for d in sorted(os.listdir(site)) if os.path.isdir(site) else []:
        m = re.match(r"(nvidia_cudnn_cu\d+)-([\d.]+)\.dist-info", d)
        if m:
            return f"{m.group(1).replace('_', '-')} {m.group(2)}"
    return "unknown wheel"


class _Enums:
    def __init__(self):
        self.vals: dict[str, int] = {}

    def ev(self, e) -> int:
        if isinstance(e, c_ast.Constant):
            return int(e.value.rstrip("uUlL"), 0)
        if isinstance(e, c_ast.ID):
            return self.vals[e.name]
        if isinstance(e, c_ast.UnaryOp):
            v = self.ev(e.expr)
            return {"-": -v, "~": ~v, "+": v}[e.op]
        if isinstance(e, c_ast.BinaryOp):
            a, b = self.ev(e.left), self.ev(e.right)
            return {"+": a + b, "-": a - b, "|": a | b, "<<": a << b, "*": a * b, "&": a & b}[e.op]
        if isinstance(e, c_ast.Cast):
            return self.ev(e.expr)
        raise TypeError(type(e))

    def explicit(self, enum: c_ast.Enum) -> None:
        """Evaluate every enumerator of ``enum`` and write its value out as a constant."""
        cur = -1
        for en in enum.values.enumerators:
            cur = self.ev(en.value) if en.value is not None else cur + 1
            self.vals[en.name] = cur
            en.value = c_ast.Constant("int", str(cur))


def _enum_of(ext):
    t = getattr(ext, "type", None)
    while t is not None and not isinstance(t, c_ast.Enum):
        t = getattr(t, "type", None)
    return t if isinstance(t, c_ast.Enum) and t.values is not None else None


def _name(ext) -> str | None:
    return getattr(ext, "name", None)


def generate(include: str) -> tuple[str, str]:
    gen = c_generator.CGenerator()
    enums = _Enums()
    ver, wheel = version(include), wheel_of(include)
    head = ("/* cdefs/{file}: {what}, for cffi's cdef (ABI mode).\n"
            " * Taken from cuDNN {ver} ({wheel}), include/{src}.\n"
            " * Generated by tools/gen_cudnn_cdefs.py (gcc -E -P with stub CUDA headers, then pycparser);\n"
            " * enum values are written out as the headers define them. Do not edit by hand.\n"
            " * CUDNN_VERSION {ver} */\n")
    # ---- cudnn_graph.h: everything
    graph_src = preprocess(include, ["cudnn_graph.h"])
    graph_ast = c_parser.CParser().parse(graph_src)
    out = [head.format(file="cudnn_graph.h", what="the cuDNN 9 base and backend (graph) API", ver=ver,
                       wheel=wheel, src="cudnn_graph.h"),
           "/* CUDA types cuDNN mentions (stubs: opaque stream/graph; the data types rawconv needs) */",
           PRELUDE]
    for ext in graph_ast.ext:
        if _name(ext) in STUB_NAMES or (isinstance(ext, c_ast.Decl) and isinstance(ext.type, c_ast.Enum)
                                        and ext.type.name in ("cudaDataType_t", "libraryPropertyType_t")):
            continue
        en = _enum_of(ext)
        if en is not None:
            enums.explicit(en)
        out.append(gen.visit(ext) + ";")
    graph_text = "\n".join(out) + "\n"
    graph_names = {_name(e) for e in graph_ast.ext}

    # ---- cudnn.h: the curated legacy subset
    all_src = preprocess(include, ["cudnn_graph.h", "cudnn_ops.h", "cudnn_cnn.h"])
    all_ast = c_parser.CParser().parse(all_src)
    by_name: dict[str, list] = {}
    for ext in all_ast.ext:
        if _name(ext) and _name(ext) not in graph_names:
            by_name.setdefault(_name(ext), []).append(ext)
        en = _enum_of(ext)
        if en is not None:
            enums.explicit(en)
    out = [head.format(file="cudnn.h", what="the legacy cuDNN 9 convolution API rawconv uses", ver=ver,
                       wheel=wheel, src="cudnn_ops.h, cudnn_cnn.h (curated subset)"),
           "/* parse after cudnn_graph.h (handle, status, data and math types come from there) */"]
    want_types = [n for n in LEGACY_TYPEDEFS + LEGACY_ENUMS_EXTRA if n not in graph_names]
    for name in want_types:
        if name not in by_name:
            sys.exit("typedef not found: " + name)
    # typedefs in header order (struct perf types use the algo enums)
    order = {id(e): i for i, e in enumerate(all_ast.ext)}
    exts = sorted((e for n in want_types for e in by_name[n]), key=lambda e: order[id(e)])
    for ext in exts:
        out.append(gen.visit(ext) + ";")
    out.append("\n/* functions */")
    for name in LEGACY_FUNCTIONS:
        if name not in by_name:
            sys.exit("function not found: " + name)
        d = copy.deepcopy(by_name[name][0])
        out.append(gen.visit(d) + ";")
    return graph_text, "\n".join(out) + "\n"


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__)
    include, outdir = argv[1], argv[2]
    graph, legacy = generate(include)
    with open(os.path.join(outdir, "cudnn_graph.h"), "w") as f:
        f.write(graph)
    with open(os.path.join(outdir, "cudnn.h"), "w") as f:
        f.write(legacy)


if __name__ == "__main__":
    main(sys.argv)
