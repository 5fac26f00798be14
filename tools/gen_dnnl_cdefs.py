"""Regenerate cdefs/dnnl.h from the oneDNN 3.2 headers (maintainer tool, not shipped).

    pip download --no-deps onednn-devel-cpu-gomp==2023.2.0 && unzip it
    gcc -E -P -nostdinc -Istub -I<include> (#include oneapi/dnnl/dnnl.h, dnnl_debug.h) > pp.c
    python tools/gen_dnnl_cdefs.py pp.c > cdefs/dnnl.h

The curated part is the lists below: which typedefs, enums and functions rawconv uses.
Enum values are evaluated from the headers and written out explicitly, so the text that cffi
parses states every value.
"""
import re
import sys

from pycparser import c_ast, c_parser

ENUMS = [
    "dnnl_status_t", "dnnl_data_type_t", "dnnl_fpmath_mode_t", "dnnl_engine_kind_t",
    "dnnl_stream_flags_t", "dnnl_format_kind_t", "dnnl_format_tag_t", "dnnl_prop_kind_t",
    "dnnl_primitive_kind_t", "dnnl_alg_kind_t", "dnnl_scratchpad_mode_t", "dnnl_query_t",
    "dnnl_cpu_isa_t",
]
FUNCTIONS = [
    # version, global settings, verbose
    "dnnl_version", "dnnl_set_verbose", "dnnl_get_effective_cpu_isa", "dnnl_set_max_cpu_isa",
    "dnnl_get_primitive_cache_capacity", "dnnl_set_primitive_cache_capacity",
    "dnnl_status2str", "dnnl_dt2str", "dnnl_fmt_tag2str", "dnnl_fmt_kind2str",
    "dnnl_prop_kind2str", "dnnl_alg_kind2str", "dnnl_cpu_isa2str",
    # engine and stream
    "dnnl_engine_get_count", "dnnl_engine_create", "dnnl_engine_destroy",
    "dnnl_stream_create", "dnnl_stream_wait", "dnnl_stream_destroy",
    # memory descriptors and memory
    "dnnl_memory_desc_create_with_tag", "dnnl_memory_desc_create_with_strides",
    "dnnl_memory_desc_clone", "dnnl_memory_desc_destroy", "dnnl_memory_desc_query",
    "dnnl_memory_desc_get_size", "dnnl_memory_desc_equal",
    "dnnl_memory_create", "dnnl_memory_get_memory_desc", "dnnl_memory_get_data_handle",
    "dnnl_memory_set_data_handle", "dnnl_memory_destroy",
    # primitive descriptors and primitives
    "dnnl_primitive_desc_next_impl", "dnnl_primitive_desc_clone", "dnnl_primitive_desc_get_attr",
    "dnnl_primitive_desc_destroy", "dnnl_primitive_desc_query", "dnnl_primitive_desc_query_md",
    "dnnl_primitive_desc_query_s32",
    "dnnl_primitive_create", "dnnl_primitive_execute", "dnnl_primitive_get_primitive_desc",
    "dnnl_primitive_destroy",
    # convolution and reorder
    "dnnl_convolution_forward_primitive_desc_create",
    "dnnl_convolution_backward_data_primitive_desc_create",
    "dnnl_convolution_backward_weights_primitive_desc_create",
    "dnnl_reorder_primitive_desc_create",
    # attributes and post-ops
    "dnnl_primitive_attr_create", "dnnl_primitive_attr_clone", "dnnl_primitive_attr_destroy",
    "dnnl_primitive_attr_get_scratchpad_mode", "dnnl_primitive_attr_set_scratchpad_mode",
    "dnnl_primitive_attr_get_fpmath_mode", "dnnl_primitive_attr_set_fpmath_mode",
    "dnnl_primitive_attr_get_post_ops", "dnnl_primitive_attr_set_post_ops",
    "dnnl_post_ops_create", "dnnl_post_ops_destroy", "dnnl_post_ops_len",
    "dnnl_post_ops_append_eltwise", "dnnl_post_ops_append_sum",
]
TYPEDEFS = """\
typedef int64_t dnnl_dim_t;
typedef dnnl_dim_t dnnl_dims_t[12];
typedef struct {
    int major;
    int minor;
    int patch;
    const char *hash;
    unsigned cpu_runtime;
    unsigned gpu_runtime;
} dnnl_version_t;
struct dnnl_memory_desc;
typedef struct dnnl_memory_desc *dnnl_memory_desc_t;
typedef const struct dnnl_memory_desc *const_dnnl_memory_desc_t;
struct dnnl_engine;
typedef struct dnnl_engine *dnnl_engine_t;
struct dnnl_stream;
typedef struct dnnl_stream *dnnl_stream_t;
typedef const struct dnnl_stream *const_dnnl_stream_t;
struct dnnl_memory;
typedef struct dnnl_memory *dnnl_memory_t;
typedef const struct dnnl_memory *const_dnnl_memory_t;
struct dnnl_primitive_desc;
typedef struct dnnl_primitive_desc *dnnl_primitive_desc_t;
typedef const struct dnnl_primitive_desc *const_dnnl_primitive_desc_t;
struct dnnl_primitive_attr;
typedef struct dnnl_primitive_attr *dnnl_primitive_attr_t;
typedef const struct dnnl_primitive_attr *const_dnnl_primitive_attr_t;
struct dnnl_post_ops;
typedef struct dnnl_post_ops *dnnl_post_ops_t;
typedef const struct dnnl_post_ops *const_dnnl_post_ops_t;
struct dnnl_primitive;
typedef struct dnnl_primitive *dnnl_primitive_t;
typedef const struct dnnl_primitive *const_dnnl_primitive_t;
typedef struct {
    int arg;
    dnnl_memory_t memory;
} dnnl_exec_arg_t;
"""
DEFINES = """\
#define DNNL_MAX_NDIMS 12
#define DNNL_ARG_SRC 1
#define DNNL_ARG_FROM 1
#define DNNL_ARG_DST 17
#define DNNL_ARG_TO 17
#define DNNL_ARG_WEIGHTS 33
#define DNNL_ARG_BIAS 41
#define DNNL_ARG_SCRATCHPAD 80
#define DNNL_ARG_DIFF_SRC 129
#define DNNL_ARG_DIFF_DST 145
#define DNNL_ARG_DIFF_WEIGHTS 161
#define DNNL_ARG_DIFF_BIAS 169
"""


def main(path):
    src = open(path).read()
    ast = c_parser.CParser().parse(src)
    vals, enums, funcs = {}, {}, {}

    def ev(e):
        if isinstance(e, c_ast.Constant):
            return int(e.value.rstrip("uUlL"), 0)
        if isinstance(e, c_ast.ID):
            return vals[e.name]
        if isinstance(e, c_ast.UnaryOp):
            v = ev(e.expr)
            return {"-": -v, "~": ~v, "+": v}[e.op]
        if isinstance(e, c_ast.BinaryOp):
            a, b = ev(e.left), ev(e.right)
            return {"+": a + b, "-": a - b, "|": a | b, "<<": a << b, "*": a * b, "&": a & b}[e.op]
        raise TypeError(type(e))

    for ext in ast.ext:
        if isinstance(ext, c_ast.Typedef) and isinstance(ext.type.type, c_ast.Enum):
            cur, items = -1, []
            for en in ext.type.type.values.enumerators:
                cur = ev(en.value) if en.value is not None else cur + 1
                vals[en.name] = cur
                items.append((en.name, cur))
            enums[ext.name] = items
    # function declarations: take their text from the preprocessed source
    flat = re.sub(r"\s+", " ", src)
    for name in FUNCTIONS:
        m = re.search(r"(?:^|[;}] )([A-Za-z_][\w ]*?\**\s*\b%s\s*\([^;]*\);)" % name, flat)
        if not m:
            sys.exit("function not found: " + name)
        funcs[name] = m.group(1).strip()
    out = ["/* cdefs/dnnl.h: the oneDNN C API that rawconv calls, for cffi's cdef (ABI mode).",
           " * Taken from oneDNN 3.2.0 (onednn-devel-cpu-gomp 2023.2.0, commit 40112196),",
           " * include/oneapi/dnnl/dnnl.h, dnnl_types.h, dnnl_common*.h, dnnl_debug.h.",
           " * Generated by tools/gen_dnnl_cdefs.py; enum values are written out as the headers define them.",
           " * DNNL_VERSION 3.2.0 */", "", TYPEDEFS, DEFINES]
    for e in ENUMS:
        out.append("typedef enum {")
        out.extend("    %s = %d," % kv for kv in enums[e])
        out.append("} %s;" % e)
        out.append("")
    out.append("/* functions */")
    out.extend(funcs[f] for f in FUNCTIONS)
    print("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1])
