/* commlib._peer_memory: allreduce among the processes of one node by reading and writing each other's
 * memory directly (Linux cross-memory attach: process_vm_readv / process_vm_writev).
 *
 * A message through MPI's shared memory is copied twice (into a shared cell, out of it); here a peer's
 * data is copied once, straight into a small scratch segment that stays in cache, reduced into this
 * process's own buffer, and the finished segment is written once into every peer's buffer.
 *
 * The caller (commlib/algorithms/cma.py) owns all synchronisation: it exchanges buffer addresses before
 * calling allreduce_share and waits for every rank after it. Each rank reduces only its own share of the
 * concatenated buffers and writes only that share into its peers, so no two processes ever touch the same
 * bytes during the call. Everything runs with the GIL released.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#ifdef __linux__
#include <sys/uio.h> /* process_vm_readv/writev; Python.h has defined _GNU_SOURCE */
#endif
#include <errno.h>
#include <string.h>
#include <sys/types.h>

#include "kernels.h"


#ifdef __linux__
/* Move `len` bytes between `local` and `remote` in process `pid`; 0, or an errno value. The kernel may
 * move fewer bytes than asked (it stops at a page it cannot pin), so loop until all have moved. */
static int pm_move(pid_t pid, void *local, uintptr_t remote, size_t len, int write)
{
    while (len > 0) {
        struct iovec l = {local, len};
        struct iovec r = {(void *)remote, len};
        ssize_t got = write ? process_vm_writev(pid, &l, 1, &r, 1, 0) : process_vm_readv(pid, &l, 1, &r, 1, 0);
        if (got < 0) {
            if (errno == EINTR) {
                continue;
            }
            return errno;
        }
        if (got == 0) {
            return EFAULT;
        }
        local = (char *)local + got;
        remote += (uintptr_t)got;
        len -= (size_t)got;
    }
    return 0;
}
#endif

PyDoc_STRVAR(read_doc, "read(pid, address, dst)\n--\n\n"
                       "Copy len(dst) bytes at `address` in process `pid` into the writable buffer dst.\n"
                       "Raises OSError (with the errno) when the kernel refuses.");

static PyObject *pm_py_read(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "read(pid, address, dst) takes 3 arguments");
        return NULL;
    }
    long pid = PyLong_AsLong(args[0]);
    unsigned long long address = PyLong_AsUnsignedLongLong(args[1]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    Py_buffer dst;
    if (PyObject_GetBuffer(args[2], &dst, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        return NULL;
    }
    int err = ENOSYS;
#ifdef __linux__
    Py_BEGIN_ALLOW_THREADS
    err = pm_move((pid_t)pid, dst.buf, (uintptr_t)address, (size_t)dst.len, 0);
    Py_END_ALLOW_THREADS
#endif
    PyBuffer_Release(&dst);
    if (err) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

typedef struct {
    Py_buffer *views;
    Py_ssize_t count;
} pm_views;

static void pm_release(pm_views *v)
{
    for (Py_ssize_t i = 0; i < v->count; i++) {
        PyBuffer_Release(&v->views[i]);
    }
    PyMem_Free(v->views);
    v->views = NULL;
    v->count = 0;
}

/* What one call reduces and how: shared by every segment of the share. */
typedef struct {
    const int64_t *pid;      /* peers' process ids, in rank order without this rank */
    const uint64_t *addr;    /* peer i's buffer k starts at addr[i * nbufs + k] */
    size_t npeers, nbufs, rank, item;
    ck_dtype dt;
    ck_op op;
    int simd;
    int half;                /* -1, or the wire type (CK_FLOAT16 / CK_BFLOAT16) of a codec */
    double prescale, postscale;
    char *acc, *tmp;         /* two segments of scratch (tmp only with more than one peer) */
    void *wire;              /* half a segment of scratch, for the codec's encoded values */
    size_t overflow;         /* values that became inf on the way through the codec */
    size_t failed_peer;
} pm_share;

/* One contribution, in place: through the codec (scaled, then rounded to what the wire would carry),
 * or only scaled. */
static void pm_contribution(pm_share *c, void *buf, size_t n)
{
    if (c->half >= 0) {
        c->overflow += ck_round_trip(c->simd, (ck_dtype)c->half, (float *)buf, c->wire, (float)c->prescale, 1.0f, n);
    } else if (c->prescale != 1.0) {
        ck_scale(c->simd, c->dt, buf, c->prescale, n);
    }
}

#ifdef __linux__
/* Reduce `n` bytes at offset `s` of buffer `k` (`mine` points there) with every peer, finish them
 * (codec rounding, postscale) and write them into every peer. 0, or an errno value. */
static int pm_segment(pm_share *c, size_t k, size_t s, char *mine, size_t n)
{
    size_t count = n / c->item;
    int err = 0;
    int finished = 0; /* the codec's rounding of the result and the postscale are done */
    if (c->npeers == 1) { /* two ranks: x0 op x1 == x1 op x0 exactly, so reduce in place */
        err = pm_move((pid_t)c->pid[0], c->acc, (uintptr_t)c->addr[k] + s, n, 0);
        if (err) {
            c->failed_peer = 0;
            return err;
        }
        if (c->half >= 0) { /* two passes instead of four: the peer's share encoded as the wire would carry
                             * it, then rounding mine, reducing, rounding the result and the postscale in one */
            c->overflow += ck_to_half(c->simd, (ck_dtype)c->half, (const float *)c->acc, c->wire,
                                      (float)c->prescale, count);
            c->overflow += ck_reduce_round_trip(c->simd, (ck_dtype)c->half, c->op, (float *)mine, c->wire,
                                                c->wire, (float)c->prescale, (float)c->postscale, 1, count);
            finished = 1;
        } else {
            pm_contribution(c, c->acc, count);
            pm_contribution(c, mine, count);
            ck_reduce(c->simd, c->dt, c->op, mine, c->acc, count);
        }
    } else { /* more: accumulate in rank order, so the result does not depend on the owner */
        for (size_t q = 0; q <= c->npeers; q++) { /* q: rank, this rank included */
            void *src = mine;
            if (q != c->rank) {
                size_t peer = q < c->rank ? q : q - 1;
                src = q == 0 ? c->acc : c->tmp;
                err = pm_move((pid_t)c->pid[peer], src, (uintptr_t)c->addr[peer * c->nbufs + k] + s, n, 0);
                if (err) {
                    c->failed_peer = peer;
                    return err;
                }
            }
            pm_contribution(c, src, count);
            if (q == 0) {
                if (src != c->acc) {
                    memcpy(c->acc, src, n);
                }
            } else {
                ck_reduce(c->simd, c->dt, c->op, c->acc, src, count);
            }
        }
        memcpy(mine, c->acc, n);
    }
    if (finished) {
    } else if (c->half >= 0) { /* the result as the wire carries it, then the postscale */
        c->overflow += ck_round_trip(c->simd, (ck_dtype)c->half, (float *)mine, c->wire, 1.0f, (float)c->postscale, count);
    } else if (c->postscale != 1.0) {
        ck_scale(c->simd, c->dt, mine, c->postscale, count);
    }
    for (size_t q = 0; q < c->npeers; q++) {
        err = pm_move((pid_t)c->pid[q], mine, (uintptr_t)c->addr[q * c->nbufs + k] + s, n, 1);
        if (err) {
            c->failed_peer = q;
            return err;
        }
    }
    return 0;
}
#endif

PyDoc_STRVAR(allreduce_share_doc,
             "allreduce_share(bufs, pids, addresses, rank, lo, hi, dtype, op, prescale, postscale, half,\n"
             "                scratch, segment, simd) -> int\n--\n\n"
             "Reduce bytes [lo, hi) of the concatenation of `bufs` (this rank's share) with the same bytes\n"
             "of every peer, in place, and write the result into every peer. Every contribution is first\n"
             "multiplied by `prescale`; with a codec (`half` = the wire's dtype code, -1 for none; float32\n"
             "buffers only) it is then rounded to what the wire would carry, and so is the result, before\n"
             "`postscale` multiplies it. With more than two ranks values combine in rank order (this process\n"
             "is rank `rank`), so the result does not depend on which rank owns a byte. Returns how many\n"
             "values became inf in the codec's rounding.\n\n"
             "bufs: writable C-contiguous buffers of one dtype, identical in length on every rank.\n"
             "pids: int64 buffer, one process id per peer. addresses: uint64 buffer of len(pids) rows of\n"
             "len(bufs) base addresses (peer i's buffer k at addresses[i * len(bufs) + k]).\n"
             "scratch: writable, 64-byte aligned; `segment` bytes (whole elements) are copied at a time, and\n"
             "scratch holds 2 segments (more than one peer) or 1, plus half a segment with a codec.\n"
             "Raises OSError naming the peer when the kernel refuses a copy.");

static PyObject *pm_py_allreduce_share(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 14) {
        PyErr_SetString(PyExc_TypeError, "allreduce_share takes 14 arguments");
        return NULL;
    }
    long rank = PyLong_AsLong(args[3]);
    long long lo = PyLong_AsLongLong(args[4]), hi = PyLong_AsLongLong(args[5]);
    long dtv = PyLong_AsLong(args[6]), opv = PyLong_AsLong(args[7]);
    double prescale = PyFloat_AsDouble(args[8]), postscale = PyFloat_AsDouble(args[9]);
    long half = PyLong_AsLong(args[10]);
    long long segment_arg = PyLong_AsLongLong(args[12]);
    int simd = PyObject_IsTrue(args[13]);
    if (PyErr_Occurred() || simd < 0) {
        return NULL;
    }
    if (dtv < 0 || dtv >= CK_NUM_DTYPES || (opv != CK_SUM && opv != CK_MIN && opv != CK_MAX && opv != CK_PRODUCT)) {
        PyErr_Format(PyExc_ValueError, "unknown dtype code %ld or op %ld", dtv, opv);
        return NULL;
    }
    pm_share c;
    memset(&c, 0, sizeof c);
    c.dt = (ck_dtype)dtv;
    c.op = (ck_op)opv;
    c.item = ck_itemsizes[c.dt];
    c.simd = simd;
    c.half = (int)half;
    c.prescale = prescale;
    c.postscale = postscale;
    if ((postscale != 1.0 || prescale != 1.0) && c.dt == CK_BOOL) {
        PyErr_SetString(PyExc_TypeError, "prescale/postscale need a numeric dtype, not bool");
        return NULL;
    }
    if (half != -1 && ((half != CK_FLOAT16 && half != CK_BFLOAT16) || c.dt != CK_FLOAT32)) {
        PyErr_Format(PyExc_TypeError, "a codec (wire dtype code %ld) needs float32 buffers and a float16 or "
                     "bfloat16 wire", half);
        return NULL;
    }
    if (lo < 0 || hi < lo || (size_t)lo % c.item || (size_t)hi % c.item) {
        PyErr_Format(PyExc_ValueError, "share [%lld, %lld) is not a range of whole elements", lo, hi);
        return NULL;
    }
    if (segment_arg <= 0 || (size_t)segment_arg % 64) {
        PyErr_Format(PyExc_ValueError, "segment of %lld bytes: must be a positive multiple of 64", segment_arg);
        return NULL;
    }
    size_t segment = (size_t)segment_arg;

    PyObject *seq = PySequence_Fast(args[0], "bufs must be a sequence of buffers");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t nbufs = PySequence_Fast_GET_SIZE(seq);
    pm_views local = {PyMem_Calloc((size_t)nbufs + 1, sizeof(Py_buffer)), 0};
    Py_buffer pids = {0}, addresses = {0}, scratch = {0};
    int have_pids = 0, have_addresses = 0, have_scratch = 0;
    PyObject *result = NULL;
    if (local.views == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    size_t total = 0;
    for (Py_ssize_t k = 0; k < nbufs; k++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, k), &local.views[k],
                               PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
            goto done;
        }
        local.count++;
        if ((size_t)local.views[k].len % c.item || (uintptr_t)local.views[k].buf % c.item) {
            PyErr_Format(PyExc_ValueError, "buffer %zd is not made of aligned %zu-byte elements", k, c.item);
            goto done;
        }
        total += (size_t)local.views[k].len;
    }
    if ((size_t)hi > total) {
        PyErr_Format(PyExc_ValueError, "share ends at byte %lld but the buffers hold %zu", hi, total);
        goto done;
    }
    if (PyObject_GetBuffer(args[1], &pids, PyBUF_C_CONTIGUOUS) < 0) {
        goto done;
    }
    have_pids = 1;
    if (PyObject_GetBuffer(args[2], &addresses, PyBUF_C_CONTIGUOUS) < 0) {
        goto done;
    }
    have_addresses = 1;
    if (PyObject_GetBuffer(args[11], &scratch, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        goto done;
    }
    have_scratch = 1;
    c.npeers = (size_t)pids.len / sizeof(int64_t);
    c.nbufs = (size_t)nbufs;
    if ((size_t)pids.len % sizeof(int64_t) || (size_t)addresses.len != c.npeers * c.nbufs * sizeof(uint64_t)) {
        PyErr_Format(PyExc_ValueError, "need one int64 pid per peer and %zd uint64 addresses per peer", nbufs);
        goto done;
    }
    if (rank < 0 || (size_t)rank > c.npeers) {
        PyErr_Format(PyExc_ValueError, "rank %ld is not one of %zu ranks", rank, c.npeers + 1);
        goto done;
    }
    c.rank = (size_t)rank;
    size_t needed = (c.npeers > 1 ? 2 : 1) * segment + (c.half >= 0 ? segment / 2 : 0);
    if ((size_t)scratch.len < needed || (uintptr_t)scratch.buf % 64) {
        PyErr_Format(PyExc_ValueError, "scratch must be 64-byte aligned and hold %zu bytes, not %zd", needed,
                     scratch.len);
        goto done;
    }
    c.acc = (char *)scratch.buf;
    c.tmp = c.npeers > 1 ? c.acc + segment : NULL;
    c.wire = c.acc + (c.npeers > 1 ? 2 : 1) * segment;
    c.pid = (const int64_t *)pids.buf;
    c.addr = (const uint64_t *)addresses.buf;

    {
        int err = 0;
#ifndef __linux__
        err = ENOSYS;
#else
        Py_BEGIN_ALLOW_THREADS
        size_t base = 0; /* byte offset of buffer k in the concatenation */
        for (size_t k = 0; k < c.nbufs && !err; k++) {
            size_t len = (size_t)local.views[k].len;
            if (base + len > (size_t)lo && base < (size_t)hi) { /* overlaps this rank's share */
                size_t start = (size_t)lo > base ? (size_t)lo - base : 0;
                size_t stop = (size_t)hi < base + len ? (size_t)hi - base : len;
                for (size_t s = start; s < stop && !err; s += segment) {
                    size_t n = stop - s < segment ? stop - s : segment;
                    err = pm_segment(&c, k, s, (char *)local.views[k].buf + s, n);
                }
            }
            base += len;
        }
        Py_END_ALLOW_THREADS
#endif
        if (err) {
            PyErr_Format(PyExc_OSError, "cross-memory attach with process %lld failed: %s",
                         c.npeers ? (long long)c.pid[c.failed_peer] : -1LL, strerror(err));
            goto done;
        }
    }
    result = PyLong_FromSize_t(c.overflow);
done:
    if (have_scratch) {
        PyBuffer_Release(&scratch);
    }
    if (have_addresses) {
        PyBuffer_Release(&addresses);
    }
    if (have_pids) {
        PyBuffer_Release(&pids);
    }
    if (local.views != NULL) {
        pm_release(&local);
    }
    Py_DECREF(seq);
    return result;
}

static PyMethodDef pm_methods[] = {
    {"read", (PyCFunction)(void (*)(void))pm_py_read, METH_FASTCALL, read_doc},
    {"allreduce_share", (PyCFunction)(void (*)(void))pm_py_allreduce_share, METH_FASTCALL, allreduce_share_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef pm_module = {
    PyModuleDef_HEAD_INIT,
    "commlib._peer_memory",
    "Cross-memory attach between the ranks of one node (see commlib/transport/peer_memory.py).",
    0,
    pm_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__peer_memory(void) { return PyModuleDef_Init(&pm_module); }
