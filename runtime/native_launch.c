/*
 * fmha-dsl's native kernel launcher (the CPython extension ``_fmha_native``).
 *
 * Compiled on first use by fmha_dsl/runtime/native.py with the interpreter's C compiler and headers, cached
 * by content, and loaded from there; when it cannot be built the runtime launches through cuda-python
 * instead.  It does one thing: convert the Python arguments of one launch into kernel-parameter slots and
 * call the driver's launch entry point, whose address it is given (``cuLaunchKernel`` and
 * ``hipModuleLaunchKernel`` have the same signature).  It includes only Python.h: no CUDA headers, no
 * linking against the driver.
 *
 *     L = _fmha_native.Launcher(launch_fn_address, function_handle, block_x, shared_bytes, kinds, ntail)
 *     err = L.launch(grid_x, grid_y, grid_z, stream, args)    # args: list/tuple, one item per parameter
 *
 * ``kinds`` holds one struct-module code per parameter (b B h H i I q Q f d; p = pointer), trailing scratch
 * pointers included.  ``args`` may omit the last ``ntail`` parameters: they are passed as NULL.  The return
 * value is the driver's status (0 = success); a value that does not fit its parameter raises OverflowError
 * or TypeError naming the parameter, before anything is launched.  Each call packs into its own stack
 * buffer, and the GIL is released around the driver call.
 *
 *     addr = _fmha_native.after_prior_address(cuLaunchKernelEx_address)
 *
 * gives the address of a function with cuLaunchKernel's signature that launches through ``cuLaunchKernelEx`` with
 * programmatic stream serialization allowed (programmatic dependent launch, sm90 and later): the kernel may start
 * while the one before it in the stream finishes, and must wait for that one's writes itself
 * (``griddepcontrol.wait``).  Passed as a Launcher's ``launch_fn`` -- or the torch fast path's -- it launches
 * such a kernel (the split-KV combine) with no other change.  The two structs below are the driver's
 * ``CUlaunchConfig`` and ``CUlaunchAttribute`` (cuda.h, CUDA 12), laid out by hand as the rest of this file is.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "native_pack.h"


/* cuda.h's CUlaunchAttribute: a 4-byte id, padding to 8, a 64-byte value union */
typedef struct {
    unsigned int id;
    char pad[4];
    union {
        char bytes[64];
        int allowed;
        void *align;
    } value;
} launch_attribute;

/* cuda.h's CUlaunchConfig */
typedef struct {
    unsigned int grid[3];
    unsigned int block[3];
    unsigned int shared;
    void *stream;
    launch_attribute *attrs;
    unsigned int num_attrs;
} launch_config;

typedef int (*launch_ex_fn)(const launch_config *config, void *function, void **params, void **extra);

#define PROGRAMMATIC_STREAM_SERIALIZATION 6 /* CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION */

static launch_ex_fn launch_ex;

static int launch_after_prior(void *function, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                              unsigned int by, unsigned int bz, unsigned int shared, void *stream, void **params,
                              void **extra)
{
    launch_attribute attr;
    memset(&attr, 0, sizeof attr);
    attr.id = PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.allowed = 1;
    launch_config config = {{gx, gy, gz}, {bx, by, bz}, shared, stream, &attr, 1};
    return launch_ex(&config, function, params, extra);
}

static PyObject *after_prior_address(PyObject *module, PyObject *arg)
{
    (void)module;
    unsigned long long ex = PyLong_AsUnsignedLongLong(arg);
    if (ex == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    if (ex == 0) {
        PyErr_SetString(PyExc_ValueError, "after_prior_address(): cuLaunchKernelEx's address must be non-NULL");
        return NULL;
    }
    launch_ex = (launch_ex_fn)(uintptr_t)ex;
    return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)&launch_after_prior);
}

typedef struct {
    PyObject_HEAD
    launch_fn fn;
    void *function;
    unsigned int block;
    unsigned int shared;
    Py_ssize_t nparams;
    Py_ssize_t ntail;
    char kinds[FMHA_MAX_PARAMS];
} Launcher;

static PyObject *Launcher_launch(Launcher *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "launch(grid_x, grid_y, grid_z, stream, args) takes 5 arguments");
        return NULL;
    }
    unsigned long g[3];
    for (int d = 0; d < 3; d++) {
        g[d] = PyLong_AsUnsignedLong(args[d]);
        if (g[d] == (unsigned long)-1 && PyErr_Occurred())
            return NULL;
        if (g[d] > UINT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "grid dimension out of range");
            return NULL;
        }
    }
    void *stream = PyLong_AsVoidPtr(args[3]);
    if (stream == NULL && PyErr_Occurred())
        return NULL;
    uint64_t storage[FMHA_MAX_PARAMS];
    void *params[FMHA_MAX_PARAMS];
    if (pack_all(args[4], self->kinds, self->nparams, self->ntail, storage, "launch()") < 0)
        return NULL;
    for (Py_ssize_t i = 0; i < self->nparams; i++)
        params[i] = &storage[i];
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = self->fn(self->function, (unsigned int)g[0], (unsigned int)g[1], (unsigned int)g[2], self->block, 1, 1,
                   self->shared, stream, params, NULL);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(err);
}

static int Launcher_init(Launcher *self, PyObject *args, PyObject *kwargs)
{
    unsigned long long fn, function;
    unsigned int block, shared;
    const char *kinds;
    Py_ssize_t nkinds, ntail;
    static char *names[] = {"launch_fn", "function", "block", "shared", "kinds", "ntail", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KKIIy#n", names, &fn, &function, &block, &shared, &kinds,
                                     &nkinds, &ntail))
        return -1;
    if (fn == 0 || function == 0) {
        PyErr_SetString(PyExc_ValueError, "Launcher(): launch_fn and function must be non-NULL");
        return -1;
    }
    if (nkinds < 1 || nkinds > FMHA_MAX_PARAMS || ntail < 0 || ntail > nkinds) {
        PyErr_Format(PyExc_ValueError, "Launcher(): %zd parameters (at most %d), %zd optional", nkinds,
                     FMHA_MAX_PARAMS, ntail);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nkinds; i++) {
        if (!strchr("bBhHiIqQfdp", kinds[i])) {
            PyErr_Format(PyExc_ValueError, "Launcher(): unknown parameter kind '%c' at %zd", kinds[i], i);
            return -1;
        }
    }
    self->fn = (launch_fn)(uintptr_t)fn;
    self->function = (void *)(uintptr_t)function;
    self->block = block;
    self->shared = shared;
    self->nparams = nkinds;
    self->ntail = ntail;
    memcpy(self->kinds, kinds, (size_t)nkinds);
    return 0;
}

static PyMethodDef Launcher_methods[] = {
    {"launch", (PyCFunction)(void (*)(void))Launcher_launch, METH_FASTCALL,
     "launch(grid_x, grid_y, grid_z, stream, args) -> driver status (0 = success)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LauncherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_fmha_native.Launcher",
    .tp_basicsize = sizeof(Launcher),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One kernel function's launcher: packs arguments, calls the driver's launch entry point.",
    .tp_methods = Launcher_methods,
    .tp_init = (initproc)Launcher_init,
    .tp_new = PyType_GenericNew,
};

static PyMethodDef native_functions[] = {
    {"after_prior_address", after_prior_address, METH_O,
     "after_prior_address(cuLaunchKernelEx_address) -> address of a cuLaunchKernel-shaped programmatic dependent "
     "launch"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "_fmha_native", "fmha-dsl's native kernel launcher.", -1, native_functions,
};

PyMODINIT_FUNC PyInit__fmha_native(void)
{
    if (PyType_Ready(&LauncherType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&native_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&LauncherType);
    if (PyModule_AddObject(m, "Launcher", (PyObject *)&LauncherType) < 0) {
        Py_DECREF(&LauncherType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
