/* commlib._compression: the loops behind sparse gradient exchange.
 *
 *   topk(x, k, idx)              idx = the positions of the k largest |x| (float32 x), in ascending order
 *   scatter_add(dst, idx, val)   dst[idx[i]] += val[i] for i in order (float32 dst/val, int32 idx)
 *   momentum_accumulate(u, v, g, m)   u = m*u + g; v += u (DGC's momentum correction, one pass)
 *
 * Determinism is the point of both: every rank must select and decode identically. topk breaks ties
 * between equal magnitudes by position (lower positions first) and treats NaN as larger than any number,
 * so its result depends only on the values; scatter_add adds in the order given (the allgather's rank
 * order), so every rank computes the same float32 sums bit for bit.
 *
 * topk: for k much smaller than n, one pass keeps the positions above a threshold guessed from a strided
 * sample and the exact k-th key is selected among them (quickselect); otherwise (or when the guess was
 * too high) radix selection on the keys (three histogram passes) finds it. A last pass collects. Buffers come in through the buffer protocol;
 * commlib/compression/kernels.py checks dtypes and shapes, this file re-checks what memory safety needs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CC_GIL_RELEASE_MIN 4096

/* A value's magnitude as an ordered integer: the float's bits without the sign. For non-negative floats
 * the integer order is the numeric order, and every NaN (exponent all ones, mantissa non-zero) comes
 * above infinity, so NaN counts as the largest magnitude. Integer keys keep the passes branch-free and
 * vectorizable. */
static inline uint32_t key_of(const float *x, Py_ssize_t i)
{
    uint32_t bits;
    memcpy(&bits, x + i, sizeof bits);
    return bits & 0x7fffffffu;
}

static inline void swapu(uint32_t *a, uint32_t *b)
{
    uint32_t t = *a;
    *a = *b;
    *b = t;
}

/* The value that would sit at position kth (0-based) if a[0..n) were sorted in descending order. */
static uint32_t select_desc(uint32_t *a, Py_ssize_t n, Py_ssize_t kth)
{
    Py_ssize_t lo = 0, hi = n - 1;
    while (hi > lo) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        /* median of three, ordered descending: a[lo] >= a[mid] >= a[hi] */
        if (a[mid] > a[lo]) swapu(&a[mid], &a[lo]);
        if (a[hi] > a[lo]) swapu(&a[hi], &a[lo]);
        if (a[hi] > a[mid]) swapu(&a[hi], &a[mid]);
        uint32_t pivot = a[mid];
        Py_ssize_t i = lo, j = hi;
        while (i <= j) {
            while (a[i] > pivot) i++;
            while (a[j] < pivot) j--;
            if (i <= j) {
                swapu(&a[i], &a[j]);
                i++;
                j--;
            }
        }
        if (kth <= j) {
            hi = j;
        } else if (kth >= i) {
            lo = i;
        } else {
            return a[kth];
        }
    }
    return a[lo];
}

/* From the ascending positions pos[0..m) (all of x when pos is NULL), write to idx the k whose keys are
 * largest: those above the k-th largest key, then ties at it in position order. */
static void collect(const float *x, const int32_t *pos, Py_ssize_t m, uint32_t threshold, Py_ssize_t k,
                    int32_t *idx)
{
    Py_ssize_t above = 0;
    for (Py_ssize_t t = 0; t < m; t++) above += key_of(x, pos ? pos[t] : t) > threshold;
    Py_ssize_t ties = k - above, j = 0;
    for (Py_ssize_t t = 0; t < m && j < k; t++) {
        Py_ssize_t i = pos ? pos[t] : t;
        uint32_t v = key_of(x, i);
        if (v > threshold || (v == threshold && ties-- > 0)) idx[j++] = (int32_t)i;
    }
}

/* Radix selection of the k-th largest key: three histogram passes over the keys' bits 30..20, 19..9 and
 * 8..0, each restricted to the keys that share the bits found so far. Returns the key and, through
 * *ties, how many keys equal to it belong to the top k. No comparisons that depend on the data's order,
 * so its time does not depend on k or on the values. */
static uint32_t radix_select(const float *x, Py_ssize_t n, Py_ssize_t k, Py_ssize_t *ties)
{
    static const int shift[3] = {20, 9, 0};
    static const uint32_t width[3] = {2048, 2048, 512};
    Py_ssize_t hist[2048];
    uint32_t prefix = 0;         /* the bits found so far, in place */
    uint32_t mask = 0;           /* which bits of a key prefix covers */
    Py_ssize_t need = k;         /* how many of the keys matching prefix still belong to the top k */
    for (int level = 0; level < 3; level++) {
        memset(hist, 0, sizeof hist);
        uint32_t bins = width[level] - 1;
        for (Py_ssize_t i = 0; i < n; i++) {
            uint32_t key = key_of(x, i);
            if ((key & mask) == prefix) hist[(key >> shift[level]) & bins]++;
        }
        Py_ssize_t above = 0;
        uint32_t b = bins;
        for (;; b--) {
            if (above + hist[b] >= need || b == 0) break;
            above += hist[b];
        }
        need -= above;
        prefix |= b << shift[level];
        mask |= bins << shift[level];
    }
    *ties = need;
    return prefix;
}

/* Positions of the k largest magnitudes of x[0..n), ascending; returns 0, or -1 when out of memory.
 *
 * For k much smaller than n, a strided sample's key of rank 2k (scaled to the sample) is a guess above
 * which all of the k largest most likely lie: one pass keeps the positions at or above it (about 2k),
 * the exact threshold is selected among those, and only they are scanned again. When the guess leaves
 * fewer than k candidates (or k is not small) radix selection runs instead. */
static int topk_indices(const float *x, Py_ssize_t n, Py_ssize_t k, int32_t *idx)
{
    if (k <= 0) return 0;
    /* A sample of m = n / stride keys; its key of rank want = 2k / stride is expected to have about 2k
     * of all n keys at or above it. */
    Py_ssize_t stride = k / 8 < 64 ? k / 8 : 64;
    if (n >= 65536 && k * 16 <= n && stride >= 2) {
        Py_ssize_t m = n / stride;
        Py_ssize_t want = 2 * k / stride;
        {
            uint32_t *s = malloc((size_t)m * sizeof(uint32_t));
            if (s == NULL) return -1;
            for (Py_ssize_t i = 0; i < m; i++) s[i] = key_of(x, i * stride);
            uint32_t guess = select_desc(s, m, want - 1);
            free(s);
            Py_ssize_t cap = 4 * k + 1024, count = 0;
            int32_t *pos = malloc((size_t)cap * sizeof(int32_t));
            if (pos == NULL) return -1;
            for (Py_ssize_t i = 0; i < n; i++) {
                if (key_of(x, i) >= guess) {
                    if (count == cap) {
                        cap *= 2;
                        int32_t *grown = realloc(pos, (size_t)cap * sizeof(int32_t));
                        if (grown == NULL) {
                            free(pos);
                            return -1;
                        }
                        pos = grown;
                    }
                    pos[count++] = (int32_t)i;
                }
            }
            if (count >= k) {
                uint32_t *keys = malloc((size_t)count * sizeof(uint32_t));
                if (keys == NULL) {
                    free(pos);
                    return -1;
                }
                for (Py_ssize_t t = 0; t < count; t++) keys[t] = key_of(x, pos[t]);
                uint32_t threshold = select_desc(keys, count, k - 1);
                free(keys);
                collect(x, pos, count, threshold, k, idx);
                free(pos);
                return 0;
            }
            free(pos);
        }
    }
    Py_ssize_t ties;
    uint32_t threshold = radix_select(x, n, k, &ties);
    Py_ssize_t j = 0;
    for (Py_ssize_t i = 0; i < n && j < k; i++) {
        uint32_t v = key_of(x, i);
        if (v > threshold || (v == threshold && ties-- > 0)) idx[j++] = (int32_t)i;
    }
    return 0;
}

/* ---- buffers ---- */

static int get_buffer(PyObject *obj, Py_buffer *view, int writable, const char *what, Py_ssize_t itemsize)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0) {
        return -1;
    }
    if (view->itemsize != itemsize || view->len % itemsize) {
        PyErr_Format(PyExc_TypeError, "%s: expected %zd-byte elements, got %zd", what, itemsize, view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    if (((uintptr_t)view->buf) % (uintptr_t)itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: buffer is not aligned to its %zd-byte elements", what, itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static void release_buffers(Py_buffer *views, int count)
{
    while (count-- > 0) PyBuffer_Release(&views[count]);
}

/* Views of args[0..count) as 4-byte elements, writable where bit i of `writable` is set (`what[i]` names
 * each in errors); on failure the views already taken are released. */
static int get_buffers(PyObject *const *args, Py_buffer *views, int count, unsigned writable,
                       const char *const *what)
{
    for (int i = 0; i < count; i++) {
        if (get_buffer(args[i], &views[i], (int)((writable >> i) & 1u), what[i], 4) < 0) {
            release_buffers(views, i);
            return -1;
        }
    }
    return 0;
}

PyDoc_STRVAR(topk_doc, "topk(x, k, idx): idx[:k] = positions of the k largest |x| (float32), ascending.");

static PyObject *cc_topk(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "topk(x, k, idx) takes 3 arguments");
        return NULL;
    }
    Py_ssize_t k = PyLong_AsSsize_t(args[1]);
    if (k == -1 && PyErr_Occurred()) return NULL;
    Py_buffer x, idx;
    if (get_buffer(args[0], &x, 0, "topk x", 4) < 0) return NULL;
    if (get_buffer(args[2], &idx, 1, "topk idx", 4) < 0) {
        PyBuffer_Release(&x);
        return NULL;
    }
    Py_ssize_t n = x.len / 4;
    int rc = 0;
    if (k < 0 || k > n || idx.len / 4 < k || n > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "topk: need 0 <= k <= n <= 2**31-1 and room for k indices "
                     "(k=%zd, n=%zd, room=%zd)", k, n, idx.len / 4);
        rc = -2;
    } else if (n >= CC_GIL_RELEASE_MIN) {
        Py_BEGIN_ALLOW_THREADS
        rc = topk_indices((const float *)x.buf, n, k, (int32_t *)idx.buf);
        Py_END_ALLOW_THREADS
    } else {
        rc = topk_indices((const float *)x.buf, n, k, (int32_t *)idx.buf);
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&idx);
    if (rc == -1) return PyErr_NoMemory();
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(scatter_add_doc, "scatter_add(dst, idx, val): dst[idx[i]] += val[i] in order (float32, int32).");

static PyObject *cc_scatter_add(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "scatter_add(dst, idx, val) takes 3 arguments");
        return NULL;
    }
    static const char *const what[] = {"scatter_add dst", "scatter_add idx", "scatter_add val"};
    Py_buffer views[3];
    if (get_buffers(args, views, 3, 1u, what) < 0) return NULL;
    const Py_buffer *dst = &views[0], *idx = &views[1], *val = &views[2];
    Py_ssize_t n = dst->len / 4, m = idx->len / 4;
    Py_ssize_t bad = -1;
    if (val->len / 4 != m) {
        PyErr_Format(PyExc_ValueError, "scatter_add: %zd indices but %zd values", m, val->len / 4);
    } else {
        float *d = (float *)dst->buf;
        const int32_t *ix = (const int32_t *)idx->buf;
        const float *v = (const float *)val->buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < m; i++) {
            if (ix[i] < 0 || ix[i] >= n) {
                bad = i;
                break;
            }
            d[ix[i]] += v[i];
        }
        Py_END_ALLOW_THREADS
        if (bad >= 0) {
            PyErr_Format(PyExc_IndexError, "scatter_add: index %d at position %zd is outside 0..%zd",
                         (int)ix[bad], bad, n - 1);
        }
    }
    int failed = PyErr_Occurred() != NULL;
    release_buffers(views, 3);
    if (failed) return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(momentum_accumulate_doc,
             "momentum_accumulate(u, v, g, m): u = m*u + g; v += u, in one pass (float32, equal sizes).");

/* DGC's momentum correction, fused: one pass over u, v and g instead of three numpy passes. */
static PyObject *cc_momentum_accumulate(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "momentum_accumulate(u, v, g, m) takes 4 arguments");
        return NULL;
    }
    float m = (float)PyFloat_AsDouble(args[3]);
    if (m == -1.0f && PyErr_Occurred()) return NULL;
    static const char *const what[] = {"momentum_accumulate u", "momentum_accumulate v",
                                       "momentum_accumulate g"};
    Py_buffer views[3];
    if (get_buffers(args, views, 3, 3u, what) < 0) return NULL;
    const Py_buffer *u = &views[0], *v = &views[1], *g = &views[2];
    if (u->len != v->len || u->len != g->len) {
        PyErr_Format(PyExc_ValueError, "momentum_accumulate: sizes differ (u %zd, v %zd, g %zd elements)",
                     u->len / 4, v->len / 4, g->len / 4);
    } else {
        float *pu = (float *)u->buf, *pv = (float *)v->buf;
        const float *pg = (const float *)g->buf;
        Py_ssize_t n = u->len / 4;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            float next = m * pu[i] + pg[i];
            pu[i] = next;
            pv[i] += next;
        }
        Py_END_ALLOW_THREADS
    }
    int failed = PyErr_Occurred() != NULL;
    release_buffers(views, 3);
    if (failed) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef cc_methods[] = {
    {"topk", (PyCFunction)(void (*)(void))cc_topk, METH_FASTCALL, topk_doc},
    {"scatter_add", (PyCFunction)(void (*)(void))cc_scatter_add, METH_FASTCALL, scatter_add_doc},
    {"momentum_accumulate", (PyCFunction)(void (*)(void))cc_momentum_accumulate, METH_FASTCALL,
     momentum_accumulate_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef cc_module = {
    PyModuleDef_HEAD_INIT, "_compression", "Top-k selection and scatter-add for sparse gradient exchange.",
    0, cc_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__compression(void) { return PyModuleDef_Init(&cc_module); }
