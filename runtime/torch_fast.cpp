/*
 * fmha-dsl's torch fast path (the CPython extension ``_fmha_torch_fast``): repeat calls of
 * ``fmha_dsl.attention`` served in C++.
 *
 * Compiled on first use by fmha_dsl/runtime/torch_fast.py against the installed torch's headers and libraries,
 * cached by content, and loaded from there; until it is ready, or where it cannot be built, attention() runs its
 * Python path only.  One object per process:
 *
 *     F = _fmha_torch_fast.FastPath(tensor_type, dispatcher_type, raw_stream, device_type, capacity)
 *     r = F.run(q, k, v, causal, window, bias, alibi_slopes, dropout_p, seed, softcap, sink, scale, return_lse,
 *               cu_seqlens_q, cu_seqlens_k, registry, offset, max_seqlen_q, max_seqlen_k, jit_dispatchers)
 *     F.commit(token, dispatcher, kernel, launch_fn, function, block, shared, kinds, ntail, grid, args, slots,
 *              out, lse, aligned)
 *     F.decline(token, dispatcher)     # this call is launched in stages / by another launcher: never replay it
 *
 * The module's second type, ``Replayer`` (torch_replay.h), replays the serving calls (paged_attention, append_kv).
 *
 * ``run`` takes attention()'s arguments in order.  It returns
 *   - the result (``out`` or ``(out, lse)``) when a recipe for this exact call exists: it allocates the outputs,
 *     patches the pointers and the scale into the recipe's packed arguments and launches;
 *   - a ``bytes`` token on a miss: the call is one the fast path can serve but has not seen.  attention()'s
 *     Python path then checks, plans and launches as always and hands the token back to ``commit`` with what it
 *     launched;
 *   - ``None`` when the call is not for this path (numpy, a subclass, group mode, bias, dropout, window, ...).
 *
 * The recipe key is everything that decides the kernel and its arguments other than the pointers and the
 * scale: the dispatcher's identity, dtype, device, the three tensors' sizes and strides, causal, return_lse and
 * whether q/k/v are 16-byte aligned.  So a hit is a call that the Python path has already checked and launched in
 * every respect but the pointers and the scale, both of which are re-read here.  A recipe holds references to its
 * dispatcher and its kernel object (which keeps the loaded module, and so the function handle, alive).  A launch
 * error returns the token: the Python path launches again, with its context handling and its error messages.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <ATen/ops/empty_strided.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cmath>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "native_pack.h"

namespace {

constexpr Py_ssize_t kMaxParams = FMHA_MAX_PARAMS;
constexpr Py_ssize_t kRunArgs = 20;
enum RunArg {
    A_Q, A_K, A_V, A_CAUSAL, A_WINDOW, A_BIAS, A_ALIBI, A_DROPOUT, A_SEED, A_SOFTCAP, A_SINK, A_SCALE, A_LSE,
    A_CU_Q, A_CU_K, A_REGISTRY, A_OFFSET, A_MAX_Q, A_MAX_K, A_JIT
};
enum Slot { S_Q, S_K, S_V, S_OUT, S_LSE, S_SCALE, N_SLOTS };
enum Flag { F_CAUSAL = 1, F_LSE = 2, F_ALIGNED = 4 };

struct Key {
    uint64_t disp;
    int64_t sizes[12];
    int64_t strides[12];
    int32_t device;
    int16_t dtype;
    uint16_t flags;
};
static_assert(sizeof(Key) == 8 + 2 * 12 * 8 + 8, "Key must have no padding (it is hashed and compared as bytes)");

struct KeyHash {
    size_t operator()(const Key &k) const noexcept
    {
        uint64_t w[sizeof(Key) / 8];
        std::memcpy(w, &k, sizeof w);
        uint64_t h = 0x9E3779B97F4A7C15ull;
        for (uint64_t x : w) {
            h ^= x + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
        }
        return static_cast<size_t>(h ^ (h >> 31));
    }
};

struct KeyEq {
    bool operator()(const Key &a, const Key &b) const noexcept { return std::memcmp(&a, &b, sizeof(Key)) == 0; }
};

struct Recipe {
    PyObject *disp = nullptr;    // strong references
    PyObject *kernel = nullptr;
    launch_fn fn = nullptr;
    void *function = nullptr;
    unsigned int grid[3] = {0, 0, 0};
    unsigned int block = 0, shared = 0;
    std::vector<uint64_t> storage;  // one packed slot per parameter; pointer and scale slots are patched per call
    int slots[N_SLOTS] = {-1, -1, -1, -1, -1, -1};
    char scale_kind = 'f';
    std::vector<int64_t> out_sizes, out_strides, lse_sizes, lse_strides;
    bool has_lse = false;
    bool aligned_out = false;  // the kernel was chosen for 16-byte aligned pointers: out must be aligned too

    Recipe() = default;
    Recipe(const Recipe &) = delete;
    Recipe &operator=(const Recipe &) = delete;
    ~Recipe()
    {
        Py_XDECREF(disp);
        Py_XDECREF(kernel);
    }
};

// shared: run() keeps its recipe alive across calls that can run Python code (the stream query, the allocator)
using Map = std::unordered_map<Key, std::shared_ptr<Recipe>, KeyHash, KeyEq>;

/* an owned reference, released on every path out (exceptions included) */
struct Ref {
    PyObject *p;
    explicit Ref(PyObject *o) : p(o) {}
    Ref(const Ref &) = delete;
    Ref &operator=(const Ref &) = delete;
    ~Ref() { Py_XDECREF(p); }
};

struct FastPath {
    PyObject_HEAD
    PyObject *tensor_type;
    PyObject *dispatcher_type;
    PyObject *raw_stream;
    int device_type;
    Py_ssize_t capacity;
    Map *map;
    unsigned long long hits, misses, declined;
};

PyObject *decline(FastPath *self)
{
    self->declined++;
    Py_RETURN_NONE;
}

PyObject *miss(FastPath *self, const Key &key)
{
    self->misses++;
    return PyBytes_FromStringAndSize(reinterpret_cast<const char *>(&key), sizeof key);
}

/* None, 0 or 0.0 (exact int / float): what attention() treats as "no dropout" / "no sink" */
bool is_zero(PyObject *o, bool allow_float)
{
    if (o == Py_None)
        return true;
    if (PyLong_CheckExact(o)) {
        int overflow = 0;
        return PyLong_AsLongAndOverflow(o, &overflow) == 0 && !overflow;
    }
    return allow_float && PyFloat_CheckExact(o) && PyFloat_AS_DOUBLE(o) == 0.0;
}

void pack_scale(uint64_t *slot, char kind, double value)
{
    *slot = 0;
    if (kind == 'f') {
        float f = static_cast<float>(value);
        std::memcpy(slot, &f, sizeof f);
    } else {
        std::memcpy(slot, &value, sizeof value);
    }
}

void fill_key(Key &key, const at::Tensor *const t[3])
{
    for (int i = 0; i < 3; i++) {
        for (int d = 0; d < 4; d++) {
            key.sizes[4 * i + d] = t[i]->size(d);
            key.strides[4 * i + d] = t[i]->stride(d);
        }
    }
}

PyObject *wrap_result(at::Tensor &out, at::Tensor &lse, bool has_lse)
{
    PyObject *o = THPVariable_Wrap(std::move(out));
    if (o == nullptr || !has_lse)
        return o;
    PyObject *l = THPVariable_Wrap(std::move(lse));
    if (l == nullptr) {
        Py_DECREF(o);
        return nullptr;
    }
    PyObject *pair = PyTuple_Pack(2, o, l);
    Py_DECREF(o);
    Py_DECREF(l);
    return pair;
}

PyObject *FastPath_run(FastPath *self, PyObject *const *a, Py_ssize_t nargs)
{
    if (self->map == nullptr) {
        PyErr_SetString(PyExc_RuntimeError, "FastPath: __init__ was not called");
        return nullptr;
    }
    if (nargs != kRunArgs) {
        PyErr_Format(PyExc_TypeError, "FastPath.run() takes %zd arguments (attention()'s, then the JIT "
                     "dispatchers), got %zd", kRunArgs, nargs);
        return nullptr;
    }
    PyTypeObject *tt = reinterpret_cast<PyTypeObject *>(self->tensor_type);
    if (Py_TYPE(a[A_Q]) != tt || Py_TYPE(a[A_K]) != tt || Py_TYPE(a[A_V]) != tt)
        return decline(self);
    uint16_t flags = 0;
    if (a[A_CAUSAL] == Py_True)
        flags |= F_CAUSAL;
    else if (a[A_CAUSAL] != Py_False && a[A_CAUSAL] != Py_None)
        return decline(self);
    if (a[A_LSE] == Py_True)
        flags |= F_LSE;
    else if (a[A_LSE] != Py_False)
        return decline(self);
    if (a[A_WINDOW] != Py_None || a[A_BIAS] != Py_None || a[A_ALIBI] != Py_None || a[A_SEED] != Py_None ||
        a[A_SOFTCAP] != Py_None || a[A_CU_Q] != Py_None || a[A_CU_K] != Py_None || !is_zero(a[A_DROPOUT], true) ||
        !is_zero(a[A_SINK], false))
        return decline(self);
    bool has_scale = a[A_SCALE] != Py_None;
    double scale = 0.0;
    if (has_scale) {
        if (!PyFloat_CheckExact(a[A_SCALE]))
            return decline(self);
        scale = PyFloat_AS_DOUBLE(a[A_SCALE]);
        if (!std::isfinite(scale))
            return decline(self);
    }
    PyObject *disp = a[A_REGISTRY];
    if (disp != Py_None && Py_TYPE(disp) != reinterpret_cast<PyTypeObject *>(self->dispatcher_type))
        return decline(self);
    if (!PyDict_CheckExact(a[A_JIT]))
        return decline(self);
    try {
        const at::Tensor &q = THPVariable_Unpack(a[A_Q]);
        const at::Tensor &k = THPVariable_Unpack(a[A_K]);
        const at::Tensor &v = THPVariable_Unpack(a[A_V]);
        const at::Tensor *const t[3] = {&q, &k, &v};
        for (const at::Tensor *x : t) {
            if (!x->defined() || x->dim() != 4 || x->layout() != c10::kStrided)
                return decline(self);
        }
        const c10::Device device = q.device();
        if (static_cast<int>(device.type()) != self->device_type || k.device() != device || v.device() != device)
            return decline(self);
        const c10::ScalarType dtype = q.scalar_type();
        if (k.scalar_type() != dtype || v.scalar_type() != dtype)
            return decline(self);
        const int dev = device.has_index() ? device.index() : -1;
        Ref devobj(PyLong_FromLong(dev));  // small ints are cached: no allocation
        if (devobj.p == nullptr)
            return nullptr;
        if (disp == Py_None) {
            disp = PyDict_GetItemWithError(a[A_JIT], devobj.p);  // borrowed
            if (disp == nullptr)
                return PyErr_Occurred() ? nullptr : decline(self);
        }
        Key key;
        std::memset(&key, 0, sizeof key);
        key.disp = reinterpret_cast<uintptr_t>(disp);
        key.device = dev;
        key.dtype = static_cast<int16_t>(dtype);
        fill_key(key, t);
        const uintptr_t qp = reinterpret_cast<uintptr_t>(q.data_ptr());
        const uintptr_t kp = reinterpret_cast<uintptr_t>(k.data_ptr());
        const uintptr_t vp = reinterpret_cast<uintptr_t>(v.data_ptr());
        if (((qp | kp | vp) & 15) == 0)
            flags |= F_ALIGNED;
        key.flags = flags;

        auto it = self->map->find(key);
        if (it == self->map->end())
            return miss(self, key);
        const std::shared_ptr<Recipe> held = it->second;  // commit()/clear() may drop it from the map meanwhile
        const Recipe &r = *held;
        if (r.fn == nullptr)
            return decline(self);  // a call the Python path launches in stages or through another launcher
        at::Tensor out = at::empty_strided(r.out_sizes, r.out_strides, q.options());
        at::Tensor lse;
        if (r.has_lse)
            lse = at::empty_strided(r.lse_sizes, r.lse_strides, q.options().dtype(at::kFloat));
        const uintptr_t op = reinterpret_cast<uintptr_t>(out.data_ptr());
        if (r.aligned_out && (op & 15))
            return miss(self, key);
        Ref so(PyObject_CallOneArg(self->raw_stream, devobj.p));
        if (so.p == nullptr)
            return nullptr;
        void *stream = PyLong_AsVoidPtr(so.p);
        if (stream == nullptr && PyErr_Occurred())
            return nullptr;

        const Py_ssize_t n = static_cast<Py_ssize_t>(r.storage.size());
        uint64_t buf[kMaxParams];
        void *params[kMaxParams];
        std::memcpy(buf, r.storage.data(), static_cast<size_t>(n) * sizeof(uint64_t));
        buf[r.slots[S_Q]] = qp;
        buf[r.slots[S_K]] = kp;
        buf[r.slots[S_V]] = vp;
        buf[r.slots[S_OUT]] = op;
        if (r.has_lse)
            buf[r.slots[S_LSE]] = reinterpret_cast<uintptr_t>(lse.data_ptr());
        if (r.slots[S_SCALE] >= 0)
            pack_scale(&buf[r.slots[S_SCALE]], r.scale_kind,
                       has_scale ? scale : 1.0 / std::sqrt(static_cast<double>(q.size(3))));
        for (Py_ssize_t i = 0; i < n; i++)
            params[i] = &buf[i];
        const launch_fn fn = r.fn;
        void *function = r.function;
        const unsigned int gx = r.grid[0], gy = r.grid[1], gz = r.grid[2], block = r.block, shared = r.shared;
        const bool has_lse = r.has_lse;
        int err;
        Py_BEGIN_ALLOW_THREADS
        err = fn(function, gx, gy, gz, block, 1, 1, shared, stream, params, nullptr);
        Py_END_ALLOW_THREADS
        if (err != 0)
            return miss(self, key);  // the Python path launches again and reports what the driver said
        self->hits++;
        return wrap_result(out, lse, has_lse);
    } catch (const std::exception &) {
        // a tensor torch cannot describe here (no storage, ...): the Python path gives the error
        if (PyErr_Occurred())
            return nullptr;
        return decline(self);
    }
}

bool int_arg(PyObject *o, const char *what, unsigned long long *out, unsigned long long limit)
{
    *out = PyLong_AsUnsignedLongLong(o);
    if (*out == static_cast<unsigned long long>(-1) && PyErr_Occurred())
        return false;
    if (*out > limit) {
        PyErr_Format(PyExc_OverflowError, "FastPath.commit(): %s out of range", what);
        return false;
    }
    return true;
}

void sizes_of(const at::Tensor &t, std::vector<int64_t> &sizes, std::vector<int64_t> &strides)
{
    sizes.assign(t.sizes().begin(), t.sizes().end());
    strides.assign(t.strides().begin(), t.strides().end());
}

Key *token_key(PyObject *token, PyObject *disp, Key *key)
{
    if (!PyBytes_Check(token) || PyBytes_GET_SIZE(token) != static_cast<Py_ssize_t>(sizeof(Key))) {
        PyErr_SetString(PyExc_ValueError, "FastPath: the token is not one run() returned");
        return nullptr;
    }
    std::memcpy(key, PyBytes_AS_STRING(token), sizeof *key);
    if (key->disp != reinterpret_cast<uintptr_t>(disp)) {
        PyErr_SetString(PyExc_ValueError, "FastPath: the dispatcher is not the one the token was made for");
        return nullptr;
    }
    return key;
}

void remember(FastPath *self, const Key &key, std::shared_ptr<Recipe> r)
{
    if (static_cast<Py_ssize_t>(self->map->size()) >= self->capacity && self->map->find(key) == self->map->end())
        self->map->clear();  // a bounded cache: start over rather than track recency on the hot path
    (*self->map)[key] = std::move(r);
}

PyObject *FastPath_commit(FastPath *self, PyObject *const *a, Py_ssize_t nargs)
{
    enum { C_TOKEN, C_DISP, C_KERNEL, C_FN, C_FUNCTION, C_BLOCK, C_SHARED, C_KINDS, C_NTAIL, C_GRID, C_ARGS,
           C_SLOTS, C_OUT, C_LSE, C_ALIGNED, C_N };
    if (self->map == nullptr) {
        PyErr_SetString(PyExc_RuntimeError, "FastPath: __init__ was not called");
        return nullptr;
    }
    if (nargs != C_N) {
        PyErr_Format(PyExc_TypeError, "FastPath.commit() takes %d arguments, got %zd", static_cast<int>(C_N), nargs);
        return nullptr;
    }
    Key key;
    if (token_key(a[C_TOKEN], a[C_DISP], &key) == nullptr)
        return nullptr;
    auto r = std::make_shared<Recipe>();
    unsigned long long fn, function, block, shared, ntail;
    if (!int_arg(a[C_FN], "launch_fn", &fn, UINTPTR_MAX) || !int_arg(a[C_FUNCTION], "function", &function,
                                                                      UINTPTR_MAX) ||
        !int_arg(a[C_BLOCK], "block", &block, UINT32_MAX) || !int_arg(a[C_SHARED], "shared", &shared, UINT32_MAX) ||
        !int_arg(a[C_NTAIL], "ntail", &ntail, kMaxParams))
        return nullptr;
    if (fn == 0 || function == 0) {
        PyErr_SetString(PyExc_ValueError, "FastPath.commit(): launch_fn and function must be non-NULL");
        return nullptr;
    }
    r->fn = reinterpret_cast<launch_fn>(static_cast<uintptr_t>(fn));
    r->function = reinterpret_cast<void *>(static_cast<uintptr_t>(function));
    r->block = static_cast<unsigned int>(block);
    r->shared = static_cast<unsigned int>(shared);
    if (!PyBytes_Check(a[C_KINDS])) {
        PyErr_SetString(PyExc_TypeError, "FastPath.commit(): kinds must be bytes");
        return nullptr;
    }
    const char *kinds = PyBytes_AS_STRING(a[C_KINDS]);
    const Py_ssize_t nparams = PyBytes_GET_SIZE(a[C_KINDS]);
    if (nparams < 1 || nparams > kMaxParams || static_cast<Py_ssize_t>(ntail) > nparams) {
        PyErr_Format(PyExc_ValueError, "FastPath.commit(): %zd parameters (at most %zd), %llu optional", nparams,
                     kMaxParams, ntail);
        return nullptr;
    }
    if (!PyTuple_Check(a[C_GRID]) || PyTuple_GET_SIZE(a[C_GRID]) != 3) {
        PyErr_SetString(PyExc_TypeError, "FastPath.commit(): grid must be a 3-tuple");
        return nullptr;
    }
    for (int d = 0; d < 3; d++) {
        unsigned long long g;
        if (!int_arg(PyTuple_GET_ITEM(a[C_GRID], d), "grid", &g, UINT32_MAX))
            return nullptr;
        r->grid[d] = static_cast<unsigned int>(g);
    }
    r->storage.assign(static_cast<size_t>(nparams), 0);
    if (pack_all(a[C_ARGS], kinds, nparams, static_cast<Py_ssize_t>(ntail), r->storage.data(),
                 "FastPath.commit()") < 0)
        return nullptr;
    const Py_ssize_t given = PySequence_Size(a[C_ARGS]);  // a sequence: pack_all checked it
    if (!PyTuple_Check(a[C_SLOTS]) || PyTuple_GET_SIZE(a[C_SLOTS]) != N_SLOTS) {
        PyErr_Format(PyExc_TypeError, "FastPath.commit(): slots must be a %d-tuple (q, k, v, out, lse, scale)",
                     static_cast<int>(N_SLOTS));
        return nullptr;
    }
    for (int s = 0; s < N_SLOTS; s++) {
        long x = PyLong_AsLong(PyTuple_GET_ITEM(a[C_SLOTS], s));
        if (x == -1 && PyErr_Occurred())
            return nullptr;
        bool pointer = s != S_SCALE;
        if (x < (s == S_SCALE ? -1 : 0) || x >= given ||
            (x >= 0 && (pointer ? kinds[x] != 'p' : (kinds[x] != 'f' && kinds[x] != 'd')))) {
            PyErr_Format(PyExc_ValueError, "FastPath.commit(): slot %d (%ld) is not a %s parameter", s, x,
                         pointer ? "pointer" : "floating-point");
            return nullptr;
        }
        r->slots[s] = static_cast<int>(x);
    }
    if (r->slots[S_SCALE] >= 0)
        r->scale_kind = kinds[r->slots[S_SCALE]];
    PyTypeObject *tt = reinterpret_cast<PyTypeObject *>(self->tensor_type);
    const bool want_lse = key.flags & F_LSE;
    if (Py_TYPE(a[C_OUT]) != tt || (want_lse ? Py_TYPE(a[C_LSE]) != tt : a[C_LSE] != Py_None)) {
        PyErr_SetString(PyExc_TypeError, "FastPath.commit(): out (and lse when the call returns it) must be the "
                        "tensors the call allocated");
        return nullptr;
    }
    int aligned = PyObject_IsTrue(a[C_ALIGNED]);
    if (aligned < 0)
        return nullptr;
    try {
        const at::Tensor &out = THPVariable_Unpack(a[C_OUT]);
        if (static_cast<int16_t>(out.scalar_type()) != key.dtype) {
            PyErr_SetString(PyExc_ValueError, "FastPath.commit(): out's dtype is not q's");
            return nullptr;
        }
        sizes_of(out, r->out_sizes, r->out_strides);
        if (want_lse)
            sizes_of(THPVariable_Unpack(a[C_LSE]), r->lse_sizes, r->lse_strides);
    } catch (const std::exception &exc) {
        PyErr_Format(PyExc_ValueError, "FastPath.commit(): %s", exc.what());
        return nullptr;
    }
    r->has_lse = want_lse;
    r->aligned_out = aligned != 0;
    Py_INCREF(a[C_DISP]);
    r->disp = a[C_DISP];
    Py_INCREF(a[C_KERNEL]);
    r->kernel = a[C_KERNEL];
    remember(self, key, std::move(r));
    Py_RETURN_NONE;
}

PyObject *FastPath_decline(FastPath *self, PyObject *const *a, Py_ssize_t nargs)
{
    if (self->map == nullptr) {
        PyErr_SetString(PyExc_RuntimeError, "FastPath: __init__ was not called");
        return nullptr;
    }
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "FastPath.decline(token, dispatcher) takes 2 arguments, got %zd", nargs);
        return nullptr;
    }
    Key key;
    if (token_key(a[0], a[1], &key) == nullptr)
        return nullptr;
    auto r = std::make_shared<Recipe>();  // no launch function: run() hands such calls to the Python path at once
    Py_INCREF(a[1]);
    r->disp = a[1];  // keeps the address in the key from being reused by another dispatcher
    remember(self, key, std::move(r));
    Py_RETURN_NONE;
}

PyObject *FastPath_clear(FastPath *self, PyObject *)
{
    if (self->map != nullptr)
        self->map->clear();
    Py_RETURN_NONE;
}

PyObject *FastPath_stats(FastPath *self, PyObject *)
{
    return Py_BuildValue("{s:K,s:K,s:K,s:n}", "hits", self->hits, "misses", self->misses, "declined", self->declined,
                         "recipes", static_cast<Py_ssize_t>(self->map ? self->map->size() : 0));
}

int FastPath_init(FastPath *self, PyObject *args, PyObject *kwargs)
{
    PyObject *tensor_type, *dispatcher_type, *raw_stream;
    const char *device_type;
    Py_ssize_t capacity = 4096;
    static const char *names[] = {"tensor_type", "dispatcher_type", "raw_stream", "device_type", "capacity",
                                  nullptr};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOs|n", const_cast<char **>(names), &tensor_type,
                                     &dispatcher_type, &raw_stream, &device_type, &capacity))
        return -1;
    if (!PyType_Check(tensor_type) || !PyType_Check(dispatcher_type) || !PyCallable_Check(raw_stream)) {
        PyErr_SetString(PyExc_TypeError, "FastPath(): tensor_type and dispatcher_type must be types, raw_stream "
                        "a callable");
        return -1;
    }
    if (capacity < 1) {
        PyErr_SetString(PyExc_ValueError, "FastPath(): capacity must be >= 1");
        return -1;
    }
    try {
        self->device_type = static_cast<int>(c10::Device(std::string(device_type)).type());
    } catch (const std::exception &exc) {
        PyErr_Format(PyExc_ValueError, "FastPath(): device_type '%s': %s", device_type, exc.what());
        return -1;
    }
    Py_INCREF(tensor_type);
    Py_INCREF(dispatcher_type);
    Py_INCREF(raw_stream);
    Py_XSETREF(self->tensor_type, tensor_type);
    Py_XSETREF(self->dispatcher_type, dispatcher_type);
    Py_XSETREF(self->raw_stream, raw_stream);
    self->capacity = capacity;
    if (self->map == nullptr)
        self->map = new Map();
    return 0;
}

void FastPath_dealloc(FastPath *self)
{
    delete self->map;  // drops the recipes' references
    self->map = nullptr;
    Py_XDECREF(self->tensor_type);
    Py_XDECREF(self->dispatcher_type);
    Py_XDECREF(self->raw_stream);
    Py_TYPE(self)->tp_free(reinterpret_cast<PyObject *>(self));
}

#include "torch_replay.h"  // the serving calls' replay (paged_attention, append_kv): the Replayer type

PyMethodDef FastPath_methods[] = {
    {"run", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(FastPath_run)), METH_FASTCALL,
     "run(q, k, v, causal, ..., max_seqlen_k, jit) -> result | bytes token (miss) | None (not for this path)"},
    {"commit", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(FastPath_commit)), METH_FASTCALL,
     "commit(token, dispatcher, kernel, launch_fn, function, block, shared, kinds, ntail, grid, args, slots, out, "
     "lse, aligned): record what the Python path launched for the token's call"},
    {"decline", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(FastPath_decline)), METH_FASTCALL,
     "decline(token, dispatcher): the token's call always takes the Python path (run() returns None for it)"},
    {"clear", reinterpret_cast<PyCFunction>(FastPath_clear), METH_NOARGS, "forget every recipe"},
    {"stats", reinterpret_cast<PyCFunction>(FastPath_stats), METH_NOARGS,
     "{'hits', 'misses', 'declined', 'recipes'}"},
    {nullptr, nullptr, 0, nullptr},
};

PyTypeObject FastPathType = {PyVarObject_HEAD_INIT(nullptr, 0)};

struct PyModuleDef fast_module = {PyModuleDef_HEAD_INIT, "_fmha_torch_fast",
                                  "fmha-dsl's torch fast path for attention().", -1, nullptr};

/* fill in and add one type of the module (``m`` is released on failure) */
int add_type(PyObject *m, PyTypeObject *type, const char *qualname, const char *name, Py_ssize_t size,
             const char *doc, PyMethodDef *methods, initproc init, destructor dealloc)
{
    type->tp_name = qualname;
    type->tp_basicsize = size;
    type->tp_flags = Py_TPFLAGS_DEFAULT;
    type->tp_doc = doc;
    type->tp_methods = methods;
    type->tp_init = init;
    type->tp_new = PyType_GenericNew;
    type->tp_dealloc = dealloc;
    if (PyType_Ready(type) < 0) {
        Py_DECREF(m);
        return -1;
    }
    Py_INCREF(type);
    if (PyModule_AddObject(m, name, reinterpret_cast<PyObject *>(type)) < 0) {
        Py_DECREF(type);
        Py_DECREF(m);
        return -1;
    }
    return 0;
}

}  // namespace

PyMODINIT_FUNC PyInit__fmha_torch_fast(void)
{
    PyObject *m = PyModule_Create(&fast_module);
    if (m == nullptr)
        return nullptr;
    if (add_type(m, &FastPathType, "_fmha_torch_fast.FastPath", "FastPath", sizeof(FastPath),
                 "attention()'s recipes: exact calls the Python path has launched, replayed in C++.", FastPath_methods,
                 reinterpret_cast<initproc>(FastPath_init), reinterpret_cast<destructor>(FastPath_dealloc)) < 0 ||
        add_type(m, &ReplayerType, "_fmha_torch_fast.Replayer", "Replayer", sizeof(Replayer),
                 "the serving calls' recipes (paged_attention, append_kv), replayed in C++.", Replayer_methods,
                 reinterpret_cast<initproc>(Replayer_init), reinterpret_cast<destructor>(Replayer_dealloc)) < 0)
        return nullptr;
    return m;
}
