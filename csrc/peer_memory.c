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

static const size_t pm_itemsizes[CK_NUM_DTYPES] = {2, 2, 4, 8, 1, 1, 4, 8};

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

static void pm_reduce(int simd, ck_dtype dt, ck_op op, void *dst, const void *src, size_t n)
{
    int done = 0;
#if defined(CK_HAVE_X86)
    if (simd) {
        done = ck_reduce_avx2(dt, op, dst, src, n);
    }
#endif
    if (!done) {
        ck_reduce_portable(dt, op, dst, src, n);
    }
    (void)simd;
}

static void pm_scale(int simd, ck_dtype dt, void *buf, double factor, size_t n)
{
    int done = 0;
#if defined(CK_HAVE_X86)
    if (simd) {
        done = ck_scale_avx2(dt, buf, factor, n);
    }
#endif
    if (!done) {
        ck_scale_portable(dt, buf, factor, n);
    }
    (void)simd;
}

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

PyDoc_STRVAR(allreduce_share_doc,
             "allreduce_share(bufs, pids, addresses, lo, hi, dtype, op, postscale, scratch, simd, rank)\n"
             "--\n\n"
             "Reduce bytes [lo, hi) of the concatenation of `bufs` (this rank's share) with the same bytes\n"
             "of every peer, in place, multiply by `postscale` (floating dtypes; 1.0 skips it), and write\n"
             "the result into every peer. With more than two ranks the values are combined in rank order\n"
             "(this process is rank `rank`), so the result does not depend on which rank owns a byte.\n\n"
             "bufs: writable C-contiguous buffers of one dtype, identical in length on every rank.\n"
             "pids: int64 buffer, one process id per peer. addresses: uint64 buffer of len(pids) rows of\n"
             "len(bufs) base addresses (peer i's buffer k at addresses[i * len(bufs) + k]).\n"
             "scratch: writable buffer; its length (halved with more than one peer, rounded down to whole\n"
             "elements) is the segment size.\n"
             "Raises OSError naming the peer when the kernel refuses a copy.");

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

static PyObject *pm_py_allreduce_share(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "allreduce_share takes 11 arguments");
        return NULL;
    }
    long long lo = PyLong_AsLongLong(args[3]), hi = PyLong_AsLongLong(args[4]);
    long dtv = PyLong_AsLong(args[5]), opv = PyLong_AsLong(args[6]);
    double postscale = PyFloat_AsDouble(args[7]);
    int simd = PyObject_IsTrue(args[9]);
    long rank = PyLong_AsLong(args[10]);
    if (PyErr_Occurred() || simd < 0) {
        return NULL;
    }
    if (dtv < 0 || dtv >= CK_NUM_DTYPES || (opv != CK_SUM && opv != CK_MIN && opv != CK_MAX && opv != CK_PRODUCT)) {
        PyErr_Format(PyExc_ValueError, "unknown dtype code %ld or op %ld", dtv, opv);
        return NULL;
    }
    ck_dtype dt = (ck_dtype)dtv;
    ck_op op = (ck_op)opv;
    size_t item = pm_itemsizes[dt];
    int floating = dt == CK_FLOAT16 || dt == CK_BFLOAT16 || dt == CK_FLOAT32 || dt == CK_FLOAT64;
    if (postscale != 1.0 && !floating) {
        PyErr_SetString(PyExc_TypeError, "postscale needs a floating dtype");
        return NULL;
    }
    if (lo < 0 || hi < lo || (size_t)lo % item || (size_t)hi % item) {
        PyErr_Format(PyExc_ValueError, "share [%lld, %lld) is not a range of whole elements", lo, hi);
        return NULL;
    }

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
        if ((size_t)local.views[k].len % item || (uintptr_t)local.views[k].buf % item) {
            PyErr_Format(PyExc_ValueError, "buffer %zd is not made of aligned %zu-byte elements", k, item);
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
    if (PyObject_GetBuffer(args[8], &scratch, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        goto done;
    }
    have_scratch = 1;
    size_t npeers = (size_t)pids.len / sizeof(int64_t);
    if ((size_t)pids.len % sizeof(int64_t) || (size_t)addresses.len != npeers * (size_t)nbufs * sizeof(uint64_t)) {
        PyErr_Format(PyExc_ValueError, "need one int64 pid per peer and %zd uint64 addresses per peer", nbufs);
        goto done;
    }
    size_t npeers_checked = (size_t)pids.len / sizeof(int64_t);
    if (rank < 0 || (size_t)rank > npeers_checked) {
        PyErr_Format(PyExc_ValueError, "rank %ld is not one of %zu ranks", rank, npeers_checked + 1);
        goto done;
    }
    /* with more than one peer the scratch holds two segments: the accumulator and the copy */
    size_t segment = (size_t)scratch.len / (npeers_checked > 1 ? 2 : 1) / item * item;
    if (segment == 0 || (uintptr_t)scratch.buf % item) {
        PyErr_SetString(PyExc_ValueError, "scratch must hold at least one aligned element");
        goto done;
    }

    {
        const int64_t *pid = (const int64_t *)pids.buf;
        const uint64_t *addr = (const uint64_t *)addresses.buf;
        int err = 0;
        size_t failed_peer = 0;
#ifndef __linux__
        err = ENOSYS;
        (void)pid;
        (void)addr;
        (void)postscale;
        (void)floating;
        (void)segment;
#else
        Py_BEGIN_ALLOW_THREADS
        size_t base = 0; /* byte offset of buffer k in the concatenation */
        for (Py_ssize_t k = 0; k < nbufs && !err; k++) {
            size_t len = (size_t)local.views[k].len;
            if (base + len <= (size_t)lo || base >= (size_t)hi) { /* outside this rank's share */
                base += len;
                continue;
            }
            size_t start = (size_t)lo > base ? (size_t)lo - base : 0;
            size_t stop = (size_t)hi < base + len ? (size_t)hi - base : len;
            for (size_t s = start; s < stop && !err; s += segment) {
                size_t n = stop - s < segment ? stop - s : segment;
                char *mine = (char *)local.views[k].buf + s;
                if (npeers == 1) { /* two ranks: x0 op x1 == x1 op x0 exactly, so reduce in place */
                    err = pm_move((pid_t)pid[0], scratch.buf, (uintptr_t)addr[k] + s, n, 0);
                    if (err) {
                        failed_peer = 0;
                    } else {
                        pm_reduce(simd, dt, op, mine, scratch.buf, n / item);
                    }
                } else { /* more: accumulate in rank order, so the result does not depend on the owner */
                    char *acc = (char *)scratch.buf, *tmp = acc + segment;
                    for (size_t q = 0; q <= npeers && !err; q++) { /* q: rank, this rank included */
                        const void *src = mine;
                        if (q != (size_t)rank) {
                            size_t peer = q < (size_t)rank ? q : q - 1;
                            void *into = q == 0 ? acc : tmp;
                            err = pm_move((pid_t)pid[peer], into, (uintptr_t)addr[peer * (size_t)nbufs + k] + s, n, 0);
                            if (err) {
                                failed_peer = peer;
                                break;
                            }
                            src = into;
                        }
                        if (q == 0) {
                            if (src != acc) {
                                memcpy(acc, src, n);
                            }
                        } else {
                            pm_reduce(simd, dt, op, acc, src, n / item);
                        }
                    }
                    if (!err) {
                        memcpy(mine, acc, n);
                    }
                }
                if (!err && postscale != 1.0) {
                    pm_scale(simd, dt, mine, postscale, n / item);
                }
                for (size_t q = 0; q < npeers && !err; q++) {
                    err = pm_move((pid_t)pid[q], mine, (uintptr_t)addr[q * (size_t)nbufs + k] + s, n, 1);
                    if (err) {
                        failed_peer = q;
                    }
                }
            }
            base += len;
        }
        Py_END_ALLOW_THREADS
#endif
        if (err) {
            PyErr_Format(PyExc_OSError, "cross-memory attach with process %lld failed: %s",
                         npeers ? (long long)pid[failed_peer] : -1LL, strerror(err));
            goto done;
        }
    }
    result = Py_None;
    Py_INCREF(result);
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
