/* commlib._kernels: the Python entry points of the elementwise kernels.
 *
 * Buffers come in through the buffer protocol (no numpy C API). commlib/kernels.py checks dtypes and
 * shapes and passes the element type as a ck_dtype number; this file re-checks everything that memory
 * safety depends on (C-contiguity, writability, alignment, equal element counts, no partial overlap),
 * picks the SIMD or the portable loop, and runs it with the GIL released.
 *
 * Dispatch: the CPU is probed once, when the module is imported, and kept in the module state. Each
 * call takes a `portable` flag that forces the portable loops (tests use it to check that both paths
 * agree); there is no global switch.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "kernels.h"

/* Loops shorter than this (in elements) keep the GIL: releasing and re-taking it costs more than they
 * take (numpy uses a similar threshold). */
#define CK_GIL_RELEASE_MIN 4096

typedef struct {
    int f16c;
    int avx2;
    int avx512f;
    int simd; /* AVX2 and F16C both usable: the kernels_x86.c loops may run */
} ck_state;


static ck_state *get_state(PyObject *module) { return (ck_state *)PyModule_GetState(module); }

/* ---- argument parsing ---- */

static int parse_dtype(PyObject *obj, ck_dtype *out)
{
    long v = PyLong_AsLong(obj);
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (v < 0 || v >= CK_NUM_DTYPES) {
        PyErr_Format(PyExc_ValueError, "unknown kernel dtype code %ld", v);
        return -1;
    }
    *out = (ck_dtype)v;
    return 0;
}

static int parse_half(PyObject *obj, ck_dtype *out)
{
    if (parse_dtype(obj, out) < 0) {
        return -1;
    }
    if (*out != CK_FLOAT16 && *out != CK_BFLOAT16) {
        PyErr_Format(PyExc_TypeError, "expected a float16 or bfloat16 buffer, got %s", ck_dtype_names[*out]);
        return -1;
    }
    return 0;
}

static int parse_op(PyObject *obj, ck_op *out)
{
    long v = PyLong_AsLong(obj);
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (v != CK_SUM && v != CK_MIN && v != CK_MAX && v != CK_PRODUCT) {
        PyErr_Format(PyExc_ValueError, "unknown kernel op %ld (Sum=0, Min=2, Max=3, Product=4)", v);
        return -1;
    }
    *out = (ck_op)v;
    return 0;
}

static int check_nargs(const char *fname, Py_ssize_t nargs, Py_ssize_t expected)
{
    if (nargs != expected) {
        PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", fname, expected, nargs);
        return -1;
    }
    return 0;
}

/* ---- buffers ---- */

/* Get a C-contiguous (and, for dst, writable) buffer of `itemsize`-byte elements, aligned to them. */
static int get_buffer(PyObject *obj, Py_buffer *view, int writable, const char *name, size_t itemsize)
{
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_Format(PyExc_ValueError, "%s: need a %sC-contiguous buffer: %S", name,
                     writable ? "writable " : "", value ? value : Py_None);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return -1;
    }
    if ((size_t)view->len % itemsize != 0 || (uintptr_t)view->buf % itemsize != 0) {
        PyErr_Format(PyExc_ValueError,
                     "%s: buffer of %zd bytes at %p is not made of aligned %zu-byte elements; "
                     "pass an aligned copy (np.require(x, requirements='CA'))",
                     name, view->len, view->buf, itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* The two buffers must have the same element count and be either the same memory or disjoint. */
static int check_pair(const Py_buffer *dst, size_t dst_item, const Py_buffer *src, size_t src_item)
{
    size_t nd = (size_t)dst->len / dst_item, ns = (size_t)src->len / src_item;
    if (nd != ns) {
        PyErr_Format(PyExc_ValueError, "dst has %zu elements but src has %zu; they must match", nd, ns);
        return -1;
    }
    uintptr_t d0 = (uintptr_t)dst->buf, d1 = d0 + (uintptr_t)dst->len;
    uintptr_t s0 = (uintptr_t)src->buf, s1 = s0 + (uintptr_t)src->len;
    int same = d0 == s0 && d1 == s1;
    if (!same && d0 < s1 && s0 < d1) {
        PyErr_SetString(PyExc_ValueError,
                        "dst and src overlap partially; pass the same array, or disjoint ones");
        return -1;
    }
    return 0;
}

/* Acquire `first` (writable) and `second` (writable if `second_writable`) with their element sizes and
 * check them as a pair; on failure neither is held and an exception is set. */
static int get_pair(PyObject *first_obj, const char *first_name, size_t first_item, Py_buffer *first,
                    PyObject *second_obj, const char *second_name, size_t second_item, int second_writable,
                    Py_buffer *second)
{
    if (get_buffer(first_obj, first, 1, first_name, first_item) < 0) {
        return -1;
    }
    if (get_buffer(second_obj, second, second_writable, second_name, second_item) < 0) {
        PyBuffer_Release(first);
        return -1;
    }
    if (check_pair(first, first_item, second, second_item) < 0) {
        PyBuffer_Release(second);
        PyBuffer_Release(first);
        return -1;
    }
    return 0;
}

/* ---- entry points ---- */

PyDoc_STRVAR(reduce_doc, "reduce(dst, src, dtype, op, portable)\n--\n\n"
                         "dst = dst op src in place; dtype is the kernel dtype code of both buffers.");

static PyObject *ck_py_reduce(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    ck_dtype dt;
    ck_op op;
    int portable;
    if (check_nargs("reduce", nargs, 5) < 0 || parse_dtype(args[2], &dt) < 0 || parse_op(args[3], &op) < 0
        || (portable = PyObject_IsTrue(args[4])) < 0) {
        return NULL;
    }
    size_t item = ck_itemsizes[dt];
    Py_buffer dst, src;
    if (get_pair(args[0], "dst", item, &dst, args[1], "src", item, 0, &src) < 0) {
        return NULL;
    }
    size_t n = (size_t)dst.len / item;
    int simd = !portable && get_state(module)->simd;
    PyThreadState *ts = n >= CK_GIL_RELEASE_MIN ? PyEval_SaveThread() : NULL;
    ck_reduce(simd, dt, op, dst.buf, src.buf, n);
    if (ts) {
        PyEval_RestoreThread(ts);
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(reduce_widened_doc,
             "reduce_widened(dst_f32, src_half, half_dtype, op, portable, dst_scale=1.0)\n--\n\n"
             "dst = (dst * float32(dst_scale)) op float32(src) in place, for a float32 dst and a half src.");

static PyObject *ck_py_reduce_widened(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    ck_dtype half;
    ck_op op;
    int portable;
    double dst_scale = 1.0;
    if (nargs != 5 && check_nargs("reduce_widened", nargs, 6) < 0) {
        return NULL;
    }
    if (parse_half(args[2], &half) < 0 || parse_op(args[3], &op) < 0
        || (portable = PyObject_IsTrue(args[4])) < 0) {
        return NULL;
    }
    if (nargs == 6 && (dst_scale = PyFloat_AsDouble(args[5])) == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    float ds = (float)dst_scale;
    Py_buffer dst, src;
    if (get_pair(args[0], "dst", 4, &dst, args[1], "src", 2, 0, &src) < 0) {
        return NULL;
    }
    size_t n = (size_t)dst.len / 4;
    int simd = !portable && get_state(module)->simd;
    PyThreadState *ts = n >= CK_GIL_RELEASE_MIN ? PyEval_SaveThread() : NULL;
    ck_reduce_widened(simd, half, op, (float *)dst.buf, src.buf, ds, n);
    if (ts) {
        PyEval_RestoreThread(ts);
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(scale_doc, "scale(buf, dtype, factor, portable)\n--\n\n"
                        "buf *= factor in place, for a numeric buffer (integers: the product in float64,\n"
                        "truncated toward zero, as Horovod's CPU scaling).");

static PyObject *ck_py_scale(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    ck_dtype dt;
    int portable;
    if (check_nargs("scale", nargs, 4) < 0 || parse_dtype(args[1], &dt) < 0) {
        return NULL;
    }
    double factor = PyFloat_AsDouble(args[2]);
    if ((factor == -1.0 && PyErr_Occurred()) || (portable = PyObject_IsTrue(args[3])) < 0) {
        return NULL;
    }
    if (dt == CK_BOOL) {
        PyErr_Format(PyExc_TypeError, "scale takes a numeric buffer, not %s", ck_dtype_names[dt]);
        return NULL;
    }
    size_t item = ck_itemsizes[dt];
    Py_buffer buf;
    if (get_buffer(args[0], &buf, 1, "buf", item) < 0) {
        return NULL;
    }
    size_t n = (size_t)buf.len / item;
    int simd = !portable && get_state(module)->simd;
    PyThreadState *ts = n >= CK_GIL_RELEASE_MIN ? PyEval_SaveThread() : NULL;
    ck_scale(simd, dt, buf.buf, factor, n);
    if (ts) {
        PyEval_RestoreThread(ts);
    }
    PyBuffer_Release(&buf);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(to_half_doc, "to_half(src_f32, dst_half, half_dtype, scale, portable) -> int\n--\n\n"
                          "dst = half(src * float32(scale)), round to nearest even; returns how many\n"
                          "finite products became inf.");

static PyObject *ck_py_to_half(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    ck_dtype half;
    int portable;
    if (check_nargs("to_half", nargs, 5) < 0 || parse_half(args[2], &half) < 0) {
        return NULL;
    }
    double scale = PyFloat_AsDouble(args[3]);
    if ((scale == -1.0 && PyErr_Occurred()) || (portable = PyObject_IsTrue(args[4])) < 0) {
        return NULL;
    }
    Py_buffer src, dst;
    if (get_pair(args[1], "dst", 2, &dst, args[0], "src", 4, 0, &src) < 0) {
        return NULL;
    }
    size_t n = (size_t)dst.len / 2, overflow = 0;
    int simd = !portable && get_state(module)->simd;
    PyThreadState *ts = n >= CK_GIL_RELEASE_MIN ? PyEval_SaveThread() : NULL;
    overflow = ck_to_half(simd, half, (const float *)src.buf, dst.buf, (float)scale, n);
    if (ts) {
        PyEval_RestoreThread(ts);
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return PyLong_FromSize_t(overflow);
}

PyDoc_STRVAR(from_half_doc, "from_half(src_half, dst_f32, half_dtype, scale, portable)\n--\n\n"
                            "dst = float32(src) * float32(scale).");

static PyObject *ck_py_from_half(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    ck_dtype half;
    int portable;
    if (check_nargs("from_half", nargs, 5) < 0 || parse_half(args[2], &half) < 0) {
        return NULL;
    }
    double scale = PyFloat_AsDouble(args[3]);
    if ((scale == -1.0 && PyErr_Occurred()) || (portable = PyObject_IsTrue(args[4])) < 0) {
        return NULL;
    }
    Py_buffer src, dst;
    if (get_pair(args[1], "dst", 4, &dst, args[0], "src", 2, 0, &src) < 0) {
        return NULL;
    }
    size_t n = (size_t)dst.len / 4;
    int simd = !portable && get_state(module)->simd;
    PyThreadState *ts = n >= CK_GIL_RELEASE_MIN ? PyEval_SaveThread() : NULL;
    ck_from_half(simd, half, src.buf, (float *)dst.buf, (float)scale, n);
    if (ts) {
        PyEval_RestoreThread(ts);
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(round_trip_doc, "round_trip(buf_f32, wire_half, half_dtype, scale, post, portable) -> int\n--\n\n"
                             "wire = half(buf * float32(scale)); buf = float32(wire) * float32(post), in one\n"
                             "pass; returns how many finite products became inf.");

static PyObject *ck_py_round_trip(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    ck_dtype half;
    int portable;
    if (check_nargs("round_trip", nargs, 6) < 0 || parse_half(args[2], &half) < 0) {
        return NULL;
    }
    double scale = PyFloat_AsDouble(args[3]);
    if (scale == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    double post = PyFloat_AsDouble(args[4]);
    if ((post == -1.0 && PyErr_Occurred()) || (portable = PyObject_IsTrue(args[5])) < 0) {
        return NULL;
    }
    Py_buffer buf, wire;
    if (get_pair(args[0], "buf", 4, &buf, args[1], "wire", 2, 1, &wire) < 0) {
        return NULL;
    }
    size_t n = (size_t)buf.len / 4, overflow = 0;
    int simd = !portable && get_state(module)->simd;
    PyThreadState *ts = n >= CK_GIL_RELEASE_MIN ? PyEval_SaveThread() : NULL;
    overflow = ck_round_trip(simd, half, (float *)buf.buf, wire.buf, (float)scale, (float)post, n);
    if (ts) {
        PyEval_RestoreThread(ts);
    }
    PyBuffer_Release(&wire);
    PyBuffer_Release(&buf);
    return PyLong_FromSize_t(overflow);
}

PyDoc_STRVAR(reduce_round_trip_doc,
             "reduce_round_trip(dst_f32, src_half, wire_half, half_dtype, op, dst_scale, post, round_dst, portable)"
             " -> int\n--\n\n"
             "dst = (dst * float32(dst_scale)) op float32(src); wire = half(dst); dst = float32(wire) *\n"
             "float32(post), in one pass; with round_dst, dst * dst_scale is first rounded through the half\n"
             "dtype too. Returns how many finite values became inf.");

static PyObject *ck_py_reduce_round_trip(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    ck_dtype half;
    ck_op op;
    int round_dst, portable;
    if (check_nargs("reduce_round_trip", nargs, 9) < 0 || parse_half(args[3], &half) < 0
        || parse_op(args[4], &op) < 0) {
        return NULL;
    }
    double dst_scale = PyFloat_AsDouble(args[5]);
    if (dst_scale == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    double post = PyFloat_AsDouble(args[6]);
    if ((post == -1.0 && PyErr_Occurred()) || (round_dst = PyObject_IsTrue(args[7])) < 0
        || (portable = PyObject_IsTrue(args[8])) < 0) {
        return NULL;
    }
    Py_buffer dst, src, wire;
    if (get_buffer(args[0], &dst, 1, "dst", 4) < 0) {
        return NULL;
    }
    if (get_buffer(args[1], &src, 0, "src", 2) < 0) {
        PyBuffer_Release(&dst);
        return NULL;
    }
    if (get_buffer(args[2], &wire, 1, "wire", 2) < 0) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&dst);
        return NULL;
    }
    /* src may be wire itself (the half values are read before the result is stored, element by element
     * within each block of 16), but neither may overlap dst */
    if (check_pair(&dst, 4, &src, 2) < 0 || check_pair(&dst, 4, &wire, 2) < 0 || check_pair(&wire, 2, &src, 2) < 0) {
        PyBuffer_Release(&wire);
        PyBuffer_Release(&src);
        PyBuffer_Release(&dst);
        return NULL;
    }
    size_t n = (size_t)dst.len / 4, overflow = 0;
    int simd = !portable && get_state(module)->simd;
    PyThreadState *ts = n >= CK_GIL_RELEASE_MIN ? PyEval_SaveThread() : NULL;
    overflow = ck_reduce_round_trip(simd, half, op, (float *)dst.buf, src.buf, wire.buf, (float)dst_scale,
                                    (float)post, round_dst, n);
    if (ts) {
        PyEval_RestoreThread(ts);
    }
    PyBuffer_Release(&wire);
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return PyLong_FromSize_t(overflow);
}

PyDoc_STRVAR(cpu_features_doc, "cpu_features() -> dict\n--\n\n"
                               "What the CPU offers ('f16c', 'avx2', 'avx512f') and whether the SIMD\n"
                               "loops run ('simd': AVX2 and F16C, on x86-64 builds).");

static PyObject *ck_py_cpu_features(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    ck_state *st = get_state(module);
    return Py_BuildValue("{s:O,s:O,s:O,s:O}", "f16c", st->f16c ? Py_True : Py_False, "avx2",
                         st->avx2 ? Py_True : Py_False, "avx512f", st->avx512f ? Py_True : Py_False, "simd",
                         st->simd ? Py_True : Py_False);
}

static PyMethodDef ck_methods[] = {
    {"reduce", (PyCFunction)(void (*)(void))ck_py_reduce, METH_FASTCALL, reduce_doc},
    {"reduce_widened", (PyCFunction)(void (*)(void))ck_py_reduce_widened, METH_FASTCALL, reduce_widened_doc},
    {"scale", (PyCFunction)(void (*)(void))ck_py_scale, METH_FASTCALL, scale_doc},
    {"to_half", (PyCFunction)(void (*)(void))ck_py_to_half, METH_FASTCALL, to_half_doc},
    {"from_half", (PyCFunction)(void (*)(void))ck_py_from_half, METH_FASTCALL, from_half_doc},
    {"round_trip", (PyCFunction)(void (*)(void))ck_py_round_trip, METH_FASTCALL, round_trip_doc},
    {"reduce_round_trip", (PyCFunction)(void (*)(void))ck_py_reduce_round_trip, METH_FASTCALL,
     reduce_round_trip_doc},
    {"cpu_features", ck_py_cpu_features, METH_NOARGS, cpu_features_doc},
    {NULL, NULL, 0, NULL},
};

static int ck_exec(PyObject *module)
{
    ck_state *st = get_state(module);
    st->f16c = st->avx2 = st->avx512f = st->simd = 0;
#if defined(CK_HAVE_X86)
    __builtin_cpu_init();
    st->f16c = __builtin_cpu_supports("f16c") != 0;
    st->avx2 = __builtin_cpu_supports("avx2") != 0;
    st->avx512f = __builtin_cpu_supports("avx512f") != 0;
    st->simd = st->f16c && st->avx2;
#endif
    static const struct {
        const char *name;
        int code;
    } codes[] = {
        {"FLOAT16", CK_FLOAT16}, {"BFLOAT16", CK_BFLOAT16}, {"FLOAT32", CK_FLOAT32}, {"FLOAT64", CK_FLOAT64},
        {"INT8", CK_INT8},       {"UINT8", CK_UINT8},       {"INT32", CK_INT32},     {"INT64", CK_INT64},
        {"INT16", CK_INT16},     {"BOOL", CK_BOOL},
    };
    for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++) {
        if (PyModule_AddIntConstant(module, codes[i].name, codes[i].code) < 0) {
            return -1;
        }
    }
    return 0;
}

static PyModuleDef_Slot ck_slots[] = {
    {Py_mod_exec, (void *)ck_exec},
    {0, NULL},
};

static struct PyModuleDef ck_module = {
    PyModuleDef_HEAD_INIT,
    "commlib._kernels",
    "Elementwise kernels of commlib (see commlib/kernels.py for the checked, documented API).",
    sizeof(ck_state),
    ck_methods,
    ck_slots,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModuleDef_Init(&ck_module); }
