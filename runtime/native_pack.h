/*
 * What the native launcher (native_launch.c) and the torch fast path (torch_fast.cpp) share, in C that C++
 * also compiles: the driver's launch entry point (``cuLaunchKernel`` and ``hipModuleLaunchKernel`` have this
 * signature), the parameter limit, and packing kernel arguments into 8-byte parameter slots (one per parameter).
 *
 * ``kind`` is a struct-module code (b B h H i I q Q f d) or ``p`` for a pointer.  A value that does not fit
 * raises TypeError (not a number / not an int) or OverflowError naming the parameter, and returns -1.
 */
#ifndef FMHA_NATIVE_PACK_H
#define FMHA_NATIVE_PACK_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

/* the most parameters a kernel may take (fmha_fwd takes 51 plus 2 scratch pointers) */
#define FMHA_MAX_PARAMS 512

/* cuLaunchKernel / hipModuleLaunchKernel */
typedef int (*launch_fn)(void *function, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                         unsigned int by, unsigned int bz, unsigned int shared, void *stream, void **params,
                         void **extra);

static int bad_arg(Py_ssize_t i, char kind, const char *why)
{
    if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_OverflowError) &&
        !PyErr_ExceptionMatches(PyExc_TypeError))
        return -1;
    PyErr_Clear();
    PyErr_Format(strncmp(why, "not ", 4) == 0 ? PyExc_TypeError : PyExc_OverflowError,
                 "kernel argument %zd (kind '%c'): %s", i, kind, why);
    return -1;
}

/* one argument into its 8-byte slot (little-endian: narrower values occupy the slot's first bytes) */
static int pack_one(PyObject *o, char kind, uint64_t *slot, Py_ssize_t i)
{
    *slot = 0;
    if (kind == 'f' || kind == 'd') {
        double x = PyFloat_AsDouble(o);
        if (x == -1.0 && PyErr_Occurred())
            return bad_arg(i, kind, "not a number");
        if (kind == 'f') {
            float y = (float)x;
            memcpy(slot, &y, sizeof y);
        } else {
            memcpy(slot, &x, sizeof x);
        }
        return 0;
    }
    if (!PyLong_Check(o))
        return bad_arg(i, kind, "not an int");
    if (kind == 'Q' || kind == 'p') {
        unsigned long long u = PyLong_AsUnsignedLongLong(o);
        if (u == (unsigned long long)-1 && PyErr_Occurred())
            return bad_arg(i, kind, "out of range for an unsigned 64-bit value");
        *slot = (uint64_t)u;
        return 0;
    }
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred())
        return bad_arg(i, kind, "out of range for a 64-bit value");
    switch (kind) {
    case 'q': { int64_t y = (int64_t)v; memcpy(slot, &y, sizeof y); return 0; }
    case 'i': if (v < INT32_MIN || v > INT32_MAX) break; { int32_t y = (int32_t)v; memcpy(slot, &y, sizeof y); return 0; }
    case 'I': if (v < 0 || v > (long long)UINT32_MAX) break; { uint32_t y = (uint32_t)v; memcpy(slot, &y, sizeof y); return 0; }
    case 'h': if (v < INT16_MIN || v > INT16_MAX) break; { int16_t y = (int16_t)v; memcpy(slot, &y, sizeof y); return 0; }
    case 'H': if (v < 0 || v > UINT16_MAX) break; { uint16_t y = (uint16_t)v; memcpy(slot, &y, sizeof y); return 0; }
    case 'b': if (v < INT8_MIN || v > INT8_MAX) break; { int8_t y = (int8_t)v; memcpy(slot, &y, sizeof y); return 0; }
    case 'B': if (v < 0 || v > UINT8_MAX) break; { uint8_t y = (uint8_t)v; memcpy(slot, &y, sizeof y); return 0; }
    default: return bad_arg(i, kind, "unknown parameter kind");
    }
    return bad_arg(i, kind, "out of range for the parameter's type");
}

/* ``args`` (a list or tuple of ``nparams`` values, or all but the ``ntail`` optional trailing ones) into
 * ``storage[0 .. nparams)``, one slot each; missing trailing slots are 0.  ``who`` prefixes the TypeError. */
static int pack_all(PyObject *args, const char *kinds, Py_ssize_t nparams, Py_ssize_t ntail, uint64_t *storage,
                    const char *who)
{
    PyObject *seq = PySequence_Fast(args, "args must be a list or tuple");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n != nparams && n != nparams - ntail) {
        PyErr_Format(PyExc_TypeError, "%s: the kernel takes %zd arguments (the last %zd optional), got %zd", who,
                     nparams, ntail, n);
        Py_DECREF(seq);
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (pack_one(items[i], kinds[i], &storage[i], i) < 0) {
            Py_DECREF(seq);
            return -1;
        }
    }
    Py_DECREF(seq);
    for (Py_ssize_t i = n; i < nparams; i++)
        storage[i] = 0;
    return 0;
}

#endif
