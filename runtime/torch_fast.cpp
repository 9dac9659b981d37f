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
 *     F.commit(token, dispatcher, keep, steps, span, usual, promised, aligned, split, out, lse)
 *     F.decline(token, dispatcher, span)   # such calls are launched by another launcher: never replay them
 *
 * The module's second type, ``Replayer`` (torch_replay.h), replays the serving calls (paged_attention, append_kv).
 *
 * ``run`` takes attention()'s arguments in order.  It returns
 *   - the result (``out`` or ``(out, lse)``) when a recipe serves the call: it allocates the outputs (and a split
 *     plan's workspaces), patches the call's values into the recipe's packed arguments and launches its steps;
 *   - a ``bytes`` token on a miss: the call is one the fast path can serve but has not seen.  attention()'s
 *     Python path then checks, plans and launches as always and hands the token back to ``commit`` with what it
 *     launched;
 *   - ``None`` when the call is not for this path (numpy, a subclass, group mode, bias, ALiBi, dropout, a value
 *     of another type than attention() documents, ...).
 *
 * The key (the call's class) is everything that decides the plan and its arguments other than the addresses, the
 * scale and the key length: the dispatcher's identity, dtype, device, q's sizes and strides, K's and V's but for the
 * key length and the batch and head strides that follow from it, the mask (causal as given: True and "top_left"
 * are one; the window pair), the soft-cap, the sink count and return_lse.  Under a key, each recipe
 * serves a span of key lengths -- those the dispatcher's decision key maps to the same plan (Dispatcher.seq_span:
 * an octave, split by whether the length is a multiple of 128) -- and one alignment class (attention()'s `aligned`).
 * Per call a recipe re-reads what the Python path's packer (fmha_dsl/kernels/fwd_abi.py) derives from the call --
 * the addresses, the scale, the key length, K's and V's strides, and for a split-KV plan the split count
 * (costmodel.splits_at, below), the workspaces and their strides -- as the ABI's ``replay_patches`` list them, and
 * checks every value against its parameter's type and every promised one for 16-divisibility (else: a miss).  So
 * a hit launches what the Python path would for that call, and a decode loop whose K/V grow by a token per step
 * stays here.  A recipe holds references to its dispatcher and its kernel objects (which keep the loaded modules,
 * and so the function handles, alive).  A launch error returns the token: the Python path launches again, with its
 * context handling and its error messages.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zero.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <climits>
#include <cstdint>
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
/* fmha_dsl/numeric.py: the largest |scale| or soft-cap that stays finite in float32 after the multiply by log2(e),
 * and the smallest soft-cap (float32's smallest normal) */
constexpr double kScalarMax = 3.4028234663852886e38 / 1.4426950408889634;
constexpr double kSoftcapMin = 1.1754943508222875e-38;
constexpr Py_ssize_t kRunArgs = 20;
enum RunArg {
    A_Q, A_K, A_V, A_CAUSAL, A_WINDOW, A_BIAS, A_ALIBI, A_DROPOUT, A_SEED, A_SOFTCAP, A_SINK, A_SCALE, A_LSE,
    A_CU_Q, A_CU_K, A_REGISTRY, A_OFFSET, A_MAX_Q, A_MAX_K, A_JIT
};
enum Flag { F_CAUSAL = 1, F_LSE = 2, F_BOTTOM_RIGHT = 4, F_WINDOW = 8, F_SOFTCAP = 16 };
// fmha_dsl/kernels/fwd_abi.py: replay_patches' sources and tensors
enum Source { R_PTR, R_STRIDE, R_SEQLEN_K, R_SCALE, R_SPLITS, R_WS, N_SOURCES };
enum Tensor { T_Q, T_K, T_V, T_OUT, T_LSE, T_WS, T_LWS, N_TENSORS };

/* The class of a call: q's sizes and strides, and K's and V's but for what a growing key axis changes (the key
 * length and the batch and head strides: a recipe serves a span of key lengths and re-reads those per call); the
 * scalars the recorded arguments hold as they were given (the window pair, the sink count, the soft-cap's bits). */
struct Key {
    uint64_t disp;
    int64_t sizes[12];
    int64_t strides[12];
    int32_t device;
    int16_t dtype;
    uint16_t flags;
    int32_t window_left, window_right;
    int64_t sink;
    uint64_t softcap;
};
static_assert(sizeof(Key) == 8 + 2 * 12 * 8 + 8 + 24, "Key must have no padding (it is hashed and compared as bytes)");

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

struct Patch {
    int arg, source, operand;
};

/* one recorded kernel launch (of the FastPath's recipes and the Replayer's) */
struct Launch {
    launch_fn fn = nullptr;
    void *function = nullptr;
    unsigned int grid[3] = {0, 0, 0};
    unsigned int block = 0, shared = 0;
    std::string kinds;              // native_pack.h's code per parameter
    std::vector<uint64_t> storage;  // one packed slot per parameter; the patched ones are rewritten per call
};

struct Step : Launch {
    bool grid_y_splits = false;     // grid y = recorded y x the call's split count
    std::vector<Patch> patches;
};

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

/* a launch tuple's first 8 items -- (launch_fn, function, block, shared, kinds, ntail, grid, args) -- into ``l``
 * (``who`` names the caller in errors) */
bool launch_arg(PyObject *o, const char *who, Launch &l)
{
    unsigned long long fn, function, block, shared, ntail;
    if (!int_arg(PyTuple_GET_ITEM(o, 0), "launch_fn", &fn, UINTPTR_MAX) ||
        !int_arg(PyTuple_GET_ITEM(o, 1), "function", &function, UINTPTR_MAX) ||
        !int_arg(PyTuple_GET_ITEM(o, 2), "block", &block, UINT32_MAX) ||
        !int_arg(PyTuple_GET_ITEM(o, 3), "shared", &shared, UINT32_MAX) ||
        !int_arg(PyTuple_GET_ITEM(o, 5), "ntail", &ntail, kMaxParams))
        return false;
    PyObject *kinds = PyTuple_GET_ITEM(o, 4), *grid = PyTuple_GET_ITEM(o, 6);
    if (fn == 0 || function == 0 || !PyBytes_Check(kinds) || !PyTuple_Check(grid) || PyTuple_GET_SIZE(grid) != 3) {
        PyErr_Format(PyExc_ValueError, "%s: a step needs non-NULL launch_fn and function, bytes kinds and a 3-tuple "
                     "grid", who);
        return false;
    }
    const Py_ssize_t np = PyBytes_GET_SIZE(kinds);
    if (np < 1 || np > kMaxParams || static_cast<Py_ssize_t>(ntail) > np) {
        PyErr_Format(PyExc_ValueError, "%s: %zd parameters (at most %zd), %llu optional", who, np, kMaxParams, ntail);
        return false;
    }
    l.fn = reinterpret_cast<launch_fn>(static_cast<uintptr_t>(fn));
    l.function = reinterpret_cast<void *>(static_cast<uintptr_t>(function));
    l.block = static_cast<unsigned int>(block);
    l.shared = static_cast<unsigned int>(shared);
    l.kinds.assign(PyBytes_AS_STRING(kinds), static_cast<size_t>(np));
    for (int d = 0; d < 3; d++) {
        unsigned long long g;
        if (!int_arg(PyTuple_GET_ITEM(grid, d), "grid", &g, UINT32_MAX))
            return false;
        l.grid[d] = static_cast<unsigned int>(g);
    }
    l.storage.assign(static_cast<size_t>(np), 0);
    return pack_all(PyTuple_GET_ITEM(o, 7), l.kinds.data(), np, static_cast<Py_ssize_t>(ntail), l.storage.data(),
                    who) == 0;
}

/* split-KV: the split count and the workspaces per call, as runtime/plan.py's SplitLaunch derives them */
struct Split {
    int64_t limit = 0, n0 = 1, nprog = 1, cus = 1, occupancy = 1, block_dv = 16, nhead_q = 1, batch = 1,
            max_seqlen_q = 1;
};

/* a strong reference a recipe holds, released with it (recipes are never copied) */
struct Held {
    PyObject *p = nullptr;
    Held() = default;
    Held(const Held &) = delete;
    Held &operator=(const Held &) = delete;
    ~Held() { Py_XDECREF(p); }
    void set(PyObject *o)
    {
        Py_INCREF(o);
        Py_XSETREF(p, o);
    }
};

struct Recipe {
    Held disp;  // keeps the address in the key from being reused by another dispatcher
    Held keep;  // the kernel objects (their loaded modules keep the function handles alive)
    int64_t lo = 0, hi = 0, mod = 1, res = 0;  // the key lengths n it serves: lo <= n <= hi, (n % mod == res) == eq
    bool eq = true;
    std::vector<Step> steps;   // none: calls of this span take the Python path (declined)
    std::vector<int> usual;    // the first step's arguments attention()'s `aligned` class key checks ...
    std::vector<int> promised; // ... and those its binary was built to assume 16-divisible
    bool aligned = false;      // the class it was planned for (all of `usual` 16-divisible)
    bool has_split = false;
    Split split;
    int64_t memo_blocks = -1, memo_splits = 1;
    char scale_kind = 'f';
    int scale_arg = -1;
    std::vector<int64_t> out_sizes, out_strides, lse_sizes, lse_strides;
    bool has_lse = false;

    bool serves(int64_t n) const { return lo <= n && n <= hi && ((n % mod == res) == eq); }
};

// shared: run() keeps its recipe alive across calls that can run Python code (the stream query, the allocator)
using Recipes = std::vector<std::shared_ptr<Recipe>>;
using Map = std::unordered_map<Key, Recipes, KeyHash, KeyEq>;
constexpr size_t kRecipesPerKey = 16;  // spans x alignment classes of one call class (then the oldest goes)

/* an owned reference, released on every path out (exceptions included) */
struct Ref {
    PyObject *p;
    explicit Ref(PyObject *o) : p(o) {}
    Ref(const Ref &) = delete;
    Ref &operator=(const Ref &) = delete;
    ~Ref() { Py_XDECREF(p); }
};

/* the caller's current stream on a device (``raw_stream(device)``); false with a Python error set */
bool stream_of(PyObject *raw_stream, PyObject *devobj, void **stream)
{
    Ref so(PyObject_CallOneArg(raw_stream, devobj));
    if (so.p == nullptr)
        return false;
    *stream = PyLong_AsVoidPtr(so.p);
    return !(*stream == nullptr && PyErr_Occurred());
}

/* one launch of ``l`` with the packed arguments ``buf`` (grid y given), the GIL released: the driver's status */
int launch(const Launch &l, unsigned int grid_y, void *stream, uint64_t *buf)
{
    void *params[kMaxParams];
    for (size_t j = 0; j < l.storage.size(); j++)
        params[j] = &buf[j];
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = l.fn(l.function, l.grid[0], grid_y, l.grid[2], l.block, 1, 1, l.shared, stream, params, nullptr);
    Py_END_ALLOW_THREADS
    return err;
}

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

/* What the two types (FastPath, and torch_replay.h's Replayer) share: the tensor type, the stream query and a
 * bounded map of recipes, set up, cleared and released alike. */
template <class Map_, class T>
void hold(T *self, PyObject *tensor_type, PyObject *raw_stream, Py_ssize_t capacity)
{
    Py_INCREF(tensor_type);
    Py_INCREF(raw_stream);
    Py_XSETREF(self->tensor_type, tensor_type);
    Py_XSETREF(self->raw_stream, raw_stream);
    self->capacity = capacity;
    if (self->map == nullptr)
        self->map = new Map_();
}

template <class T>
void release(T *self)
{
    delete self->map;  // drops the recipes' references
    self->map = nullptr;
    Py_XDECREF(self->tensor_type);
    Py_XDECREF(self->raw_stream);
}

template <class T>
PyObject *clear_recipes(T *self, PyObject *)
{
    if (self->map != nullptr)
        self->map->clear();
    Py_RETURN_NONE;
}

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

/* An exact int within [lo, hi] (bool and int subclasses are not: the Python path decides about those) */
bool exact_int(PyObject *o, long long lo, long long hi, long long *value)
{
    if (!PyLong_CheckExact(o))
        return false;
    int overflow = 0;
    const long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (x == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return false;
    }
    *value = x;
    return lo <= x && x <= hi;
}

/* causal, window, softcap and sink as the key holds them; false: not a value for this path (the Python path
 * checks it, and raises where attention() does) */
bool mask_key(PyObject *const *a, Key &key)
{
    PyObject *causal = a[A_CAUSAL];
    if (causal == Py_True) {
        key.flags |= F_CAUSAL;
    } else if (causal != Py_False && causal != Py_None) {
        if (!PyUnicode_CheckExact(causal))
            return false;
        if (PyUnicode_CompareWithASCIIString(causal, "top_left") == 0)
            key.flags |= F_CAUSAL;  // what True means
        else if (PyUnicode_CompareWithASCIIString(causal, "bottom_right") == 0)
            key.flags |= F_BOTTOM_RIGHT;
        else
            return false;
    }
    PyObject *window = a[A_WINDOW];
    if (window != Py_None) {
        long long left, right;
        if (!PyTuple_CheckExact(window) || PyTuple_GET_SIZE(window) != 2 ||
            !exact_int(PyTuple_GET_ITEM(window, 0), INT32_MIN, INT32_MAX, &left) ||
            !exact_int(PyTuple_GET_ITEM(window, 1), INT32_MIN, INT32_MAX, &right))
            return false;
        key.flags |= F_WINDOW;
        key.window_left = static_cast<int32_t>(left);
        key.window_right = static_cast<int32_t>(right);
    }
    PyObject *softcap = a[A_SOFTCAP];
    if (softcap != Py_None) {
        if (!PyFloat_CheckExact(softcap))
            return false;
        const double cap = PyFloat_AS_DOUBLE(softcap);
        if (!(cap >= kSoftcapMin && cap <= kScalarMax))
            return false;
        key.flags |= F_SOFTCAP;
        std::memcpy(&key.softcap, &cap, sizeof cap);
    }
    long long sink = 0;
    if (a[A_SINK] != Py_None && !exact_int(a[A_SINK], 0, INT32_MAX, &sink))
        return false;
    key.sink = sink;
    return true;
}

/* None, 0 or 0.0 (exact int / float): what attention() treats as "no dropout" */
bool no_dropout(PyObject *o)
{
    long long zero;
    return o == Py_None || exact_int(o, 0, 0, &zero) || (PyFloat_CheckExact(o) && PyFloat_AS_DOUBLE(o) == 0.0);
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

/* an integer into a parameter slot of kind ``kind`` (native_pack.h's codes); false when it does not fit */
bool pack_int(uint64_t *slot, char kind, int64_t v)
{
    *slot = 0;
    switch (kind) {
    case 'p':
    case 'Q':
    case 'q':
        std::memcpy(slot, &v, sizeof v);
        return true;
    case 'i': {
        if (v < INT32_MIN || v > INT32_MAX)
            return false;
        const int32_t y = static_cast<int32_t>(v);
        std::memcpy(slot, &y, sizeof y);
        return true;
    }
    case 'I': {
        if (v < 0 || v > static_cast<int64_t>(UINT32_MAX))
            return false;
        const uint32_t y = static_cast<uint32_t>(v);
        std::memcpy(slot, &y, sizeof y);
        return true;
    }
    default:
        return false;
    }
}

/* the integer a slot holds (the inverse of pack_int for the kinds replayed arguments have) */
int64_t slot_int(uint64_t slot, char kind)
{
    if (kind == 'i') {
        int32_t y;
        std::memcpy(&y, &slot, sizeof y);
        return y;
    }
    if (kind == 'I')
        return static_cast<int64_t>(static_cast<uint32_t>(slot));
    return static_cast<int64_t>(slot);
}

/* costmodel.splits_at: the count with the shortest critical path -- waves of non-empty programs over cus x occupancy
 * slots times (key blocks per split + kSplitSetup) -- and the fewest splits within 5 % of it; at most the kernel's
 * limit, the key blocks and twice the count filling kSplitWaves waves of one program per CU
 * (tests/test_torch_fast.py compares the two) */
constexpr int64_t kSplitWaves = 4, kSplitSetup = 1;
int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t splits_at(int64_t limit, int64_t seqlen_k, int64_t n0, int64_t nprog, int64_t cus, int64_t occupancy)
{
    if (limit <= 0)
        return 1;
    nprog = std::max<int64_t>(nprog, 1);
    cus = std::max<int64_t>(cus, 1);
    const int64_t slots = cus * std::max<int64_t>(occupancy, 1);
    const int64_t blocks = cdiv(std::max<int64_t>(seqlen_k, 1), n0);
    const int64_t most = std::max<int64_t>(1, std::min({limit, blocks, 2 * cdiv(kSplitWaves * cus, nprog)}));
    auto path = [&](int64_t s) {
        const int64_t per = cdiv(blocks, s);
        return cdiv(nprog * cdiv(blocks, per), slots) * (per + kSplitSetup);
    };
    int64_t least = path(1);
    for (int64_t s = 2; s <= most; s++)
        least = std::min(least, path(s));
    for (int64_t s = 1; s <= most; s++) {
        if (path(s) * 20 <= least * 21)
            return s;
    }
    return most;
}

/* SplitLaunch.count: splits_at, halved while the workspace's element strides would overflow int32 */
int64_t split_count(Recipe &r, int64_t seqlen_k)
{
    const Split &p = r.split;
    const int64_t blocks = cdiv(std::max<int64_t>(seqlen_k, 1), p.n0);
    if (blocks == r.memo_blocks)
        return r.memo_splits;  // a decode loop: the count changes once per n0 tokens
    int64_t s = splits_at(p.limit, seqlen_k, p.n0, p.nprog, p.cus, p.occupancy);
    while (s > 1 && p.nhead_q * s * std::max<int64_t>(1, p.max_seqlen_q) * p.block_dv > INT32_MAX)
        s /= 2;
    r.memo_blocks = blocks;
    r.memo_splits = s;
    return s;
}

PyObject *splits_at_py(PyObject *, PyObject *args)
{
    long long limit, seqlen_k, n0, nprog, cus, occupancy = 1;
    if (!PyArg_ParseTuple(args, "LLLLL|L", &limit, &seqlen_k, &n0, &nprog, &cus, &occupancy))
        return nullptr;
    if (n0 < 1) {
        PyErr_SetString(PyExc_ValueError, "splits_at(): n0 must be >= 1");
        return nullptr;
    }
    return PyLong_FromLongLong(splits_at(limit, seqlen_k, n0, nprog, cus, occupancy));
}

void fill_key(Key &key, const at::Tensor *const t[3])
{
    for (int i = 0; i < 3; i++) {
        for (int d = 0; d < 4; d++) {
            const bool grows = i > 0 && (d == 2);  // K/V: the key length ...
            const bool follows = i > 0 && d < 2;   // ... and the batch / head strides a contiguous K/V derives from it
            key.sizes[4 * i + d] = grows ? 0 : t[i]->size(d);
            key.strides[4 * i + d] = follows ? 0 : t[i]->stride(d);
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

/* one call's values of the replayed arguments */
struct CallValues {
    const at::Tensor *qkv[3];
    uintptr_t ptr[N_TENSORS];
    int64_t seqlen_k = 0, splits = 1;
    int64_t ws[5] = {0, 0, 0, 0, 0};
    double scale = 0.0;
};

/* write ``step``'s patched arguments into ``buf``; false when a value does not fit its parameter */
bool patch(const Step &step, const Recipe &r, const CallValues &c, uint64_t *buf)
{
    const size_t n = step.storage.size();
    std::memcpy(buf, step.storage.data(), n * sizeof(uint64_t));
    for (const Patch &p : step.patches) {
        const char kind = step.kinds[static_cast<size_t>(p.arg)];
        int64_t v = 0;
        switch (p.source) {
        case R_PTR: v = static_cast<int64_t>(c.ptr[p.operand]); break;
        case R_STRIDE: v = c.qkv[p.operand / 4]->stride(p.operand % 4); break;
        case R_SEQLEN_K: v = c.seqlen_k; break;
        case R_SPLITS: v = c.splits; break;
        case R_WS: v = c.ws[p.operand]; break;
        case R_SCALE: pack_scale(&buf[p.arg], r.scale_kind, c.scale); continue;
        default: return false;
        }
        if (!pack_int(&buf[p.arg], kind, v))
            return false;
    }
    return true;
}

/* whether the first step's arguments ``buf`` keep the recipe's alignment class and its binary's promises */
bool keeps_alignment(const Recipe &r, const Step &step, const uint64_t *buf)
{
    bool usual = true;
    for (int i : r.usual)
        usual = usual && (slot_int(buf[i], step.kinds[static_cast<size_t>(i)]) & 15) == 0;
    if (usual != r.aligned)
        return false;
    for (int i : r.promised) {
        if (slot_int(buf[i], step.kinds[static_cast<size_t>(i)]) & 15)
            return false;
    }
    return true;
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
    Key key;
    std::memset(&key, 0, sizeof key);
    if (a[A_LSE] == Py_True)
        key.flags |= F_LSE;
    else if (a[A_LSE] != Py_False)
        return decline(self);
    if (!mask_key(a, key) || a[A_BIAS] != Py_None || a[A_ALIBI] != Py_None || a[A_SEED] != Py_None ||
        a[A_CU_Q] != Py_None || a[A_CU_K] != Py_None || !no_dropout(a[A_DROPOUT]))
        return decline(self);
    bool has_scale = a[A_SCALE] != Py_None;
    double scale = 0.0;
    if (has_scale) {
        if (!PyFloat_CheckExact(a[A_SCALE]))
            return decline(self);
        scale = PyFloat_AS_DOUBLE(a[A_SCALE]);
        if (!(std::fabs(scale) <= kScalarMax))  // (NaN too) the Python path refuses it: fmha_dsl/numeric.py
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
        const int64_t sk = k.size(2);
        if (sk < 1 || v.size(2) != sk)
            return decline(self);  // nothing to attend to, or mismatched shapes: the Python path's answer
        // a batch-mode max_seqlen_q/k is an upper bound the launch does not read: an exact int of at least the
        // length replays; anything else takes the Python path, which refuses it
        long long given;
        if ((a[A_MAX_Q] != Py_None && !exact_int(a[A_MAX_Q], q.size(2), INT64_MAX, &given)) ||
            (a[A_MAX_K] != Py_None && !exact_int(a[A_MAX_K], sk, INT64_MAX, &given)))
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
        key.disp = reinterpret_cast<uintptr_t>(disp);
        key.device = dev;
        key.dtype = static_cast<int16_t>(dtype);
        fill_key(key, t);

        auto it = self->map->find(key);
        if (it == self->map->end())
            return miss(self, key);
        CallValues c;
        c.qkv[0] = &q;
        c.qkv[1] = &k;
        c.qkv[2] = &v;
        std::memset(c.ptr, 0, sizeof c.ptr);
        c.ptr[T_Q] = reinterpret_cast<uintptr_t>(q.data_ptr());
        c.ptr[T_K] = reinterpret_cast<uintptr_t>(k.data_ptr());
        c.ptr[T_V] = reinterpret_cast<uintptr_t>(v.data_ptr());
        c.seqlen_k = sk;
        c.scale = has_scale ? scale : 1.0 / std::sqrt(static_cast<double>(q.size(3)));
        uint64_t buf[kMaxParams];
        // the recipe of this key length and alignment class (the outputs' and workspaces' addresses, unknown
        // yet, count as aligned: the caching allocator's are, and are checked below)
        std::shared_ptr<Recipe> held;  // commit()/clear() may drop it from the map meanwhile
        for (const auto &cand : it->second) {
            if (!cand->serves(sk))
                continue;
            if (cand->steps.empty())
                return decline(self);  // a call the Python path launches itself
            if (cand->has_split)
                c.splits = split_count(*cand, sk);
            if (patch(cand->steps[0], *cand, c, buf) && keeps_alignment(*cand, cand->steps[0], buf)) {
                held = cand;
                break;
            }
        }
        if (!held)
            return miss(self, key);
        Recipe &r = *held;
        at::Tensor out = at::empty_strided(r.out_sizes, r.out_strides, q.options());
        at::Tensor lse, ws;
        if (r.has_lse)
            lse = at::empty_strided(r.lse_sizes, r.lse_strides, q.options().dtype(at::kFloat));
        c.ptr[T_OUT] = reinterpret_cast<uintptr_t>(out.data_ptr());
        c.ptr[T_LSE] = r.has_lse ? reinterpret_cast<uintptr_t>(lse.data_ptr()) : 0;
        if (r.has_split) {  // workspace_strides(batch, nhead_q, splits, max_seqlen_q, BLOCK_DV); O then the LSE
            const Split &p = r.split;
            const int64_t hs = p.nhead_q * c.splits, sq = std::max<int64_t>(1, p.max_seqlen_q);
            c.ws[0] = hs * sq * p.block_dv;
            c.ws[1] = sq * p.block_dv;
            c.ws[2] = p.block_dv;
            c.ws[3] = hs * sq;
            c.ws[4] = sq;
            const int64_t n_o = p.batch * c.ws[0];
            ws = at::empty({n_o + p.batch * c.ws[3]}, q.options().dtype(at::kFloat));
            c.ptr[T_WS] = reinterpret_cast<uintptr_t>(ws.data_ptr());
            c.ptr[T_LWS] = c.ptr[T_WS] + 4 * static_cast<uintptr_t>(n_o);
        }
        void *stream;
        if (!stream_of(self->raw_stream, devobj.p, &stream))
            return nullptr;
        for (size_t i = 0; i < r.steps.size(); i++) {
            const Step &s = r.steps[i];
            if (!patch(s, r, c, buf) || (i == 0 && !keeps_alignment(r, s, buf)))
                return miss(self, key);  // an output off a 16-byte boundary: the Python path decides
            const unsigned int gy = s.grid_y_splits ? s.grid[1] * static_cast<unsigned int>(c.splits) : s.grid[1];
            if (launch(s, gy, stream, buf) != 0)
                return miss(self, key);  // the Python path launches again and reports what the driver said
        }
        self->hits++;
        return wrap_result(out, lse, r.has_lse);
    } catch (const std::exception &) {
        // a tensor torch cannot describe here (no storage, ...): the Python path gives the error
        if (PyErr_Occurred())
            return nullptr;
        return decline(self);
    }
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

/* file ``r`` under ``key``: it replaces a recipe of the same span and alignment class, else joins the key's */
void remember(FastPath *self, const Key &key, std::shared_ptr<Recipe> r)
{
    auto it = self->map->find(key);
    if (it == self->map->end()) {
        if (static_cast<Py_ssize_t>(self->map->size()) >= self->capacity)
            self->map->clear();  // a bounded cache: start over rather than track recency on the hot path
        (*self->map)[key].push_back(std::move(r));
        return;
    }
    Recipes &all = it->second;
    for (auto &old : all) {
        if (old->lo == r->lo && old->hi == r->hi && old->mod == r->mod && old->res == r->res && old->eq == r->eq &&
            old->aligned == r->aligned) {
            old = std::move(r);
            return;
        }
    }
    if (all.size() >= kRecipesPerKey)
        all.erase(all.begin());
    all.push_back(std::move(r));
}

/* the span ``(lo, hi, mod, res, eq)`` of key lengths a recipe serves (Dispatcher.seq_span) */
bool span_arg(PyObject *o, Recipe &r)
{
    long long lo, hi, mod, res;
    int eq;
    if (!PyTuple_Check(o) || !PyArg_ParseTuple(o, "LLLLp", &lo, &hi, &mod, &res, &eq))
        return false;
    if (lo < 1 || hi < lo || mod < 1 || res < 0 || res >= mod) {
        PyErr_SetString(PyExc_ValueError, "FastPath: span must be (lo, hi, mod, res, eq) with 1 <= lo <= hi and "
                        "0 <= res < mod");
        return false;
    }
    r.lo = lo;
    r.hi = hi;
    r.mod = mod;
    r.res = res;
    r.eq = eq != 0;
    return true;
}

/* argument indices ``o`` (a tuple of ints) of a step of ``n`` parameters into ``out`` */
bool indices_arg(PyObject *o, Py_ssize_t n, const char *what, std::vector<int> &out)
{
    if (!PyTuple_Check(o)) {
        PyErr_Format(PyExc_TypeError, "FastPath.commit(): %s must be a tuple of argument indices", what);
        return false;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(o); i++) {
        long x = PyLong_AsLong(PyTuple_GET_ITEM(o, i));
        if (x == -1 && PyErr_Occurred())
            return false;
        if (x < 0 || x >= n) {
            PyErr_Format(PyExc_ValueError, "FastPath.commit(): %s index %ld out of range", what, x);
            return false;
        }
        out.push_back(static_cast<int>(x));
    }
    return true;
}

/* one launch: (launch_fn, function, block, shared, kinds, ntail, grid, args, patches, grid_y_splits) */
bool step_arg(PyObject *o, Step &s, Recipe &r)
{
    if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) != 10) {
        PyErr_SetString(PyExc_TypeError, "FastPath.commit(): a step is (launch_fn, function, block, shared, kinds, "
                        "ntail, grid, args, patches, grid_y_splits)");
        return false;
    }
    PyObject *patches = PyTuple_GET_ITEM(o, 8);
    if (!PyTuple_Check(patches)) {
        PyErr_SetString(PyExc_TypeError, "FastPath.commit(): a step's patches must be a tuple");
        return false;
    }
    if (!launch_arg(o, "FastPath.commit()", s))
        return false;
    const int splits = PyObject_IsTrue(PyTuple_GET_ITEM(o, 9));
    if (splits < 0)
        return false;
    s.grid_y_splits = splits != 0;
    const Py_ssize_t np = static_cast<Py_ssize_t>(s.kinds.size());
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(patches); j++) {
        int arg, source, operand;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(patches, j), "iii", &arg, &source, &operand))
            return false;
        bool ok = arg >= 0 && arg < np && source >= 0 && source < N_SOURCES;
        if (ok) {
            const char kind = s.kinds[static_cast<size_t>(arg)];
            switch (source) {
            case R_PTR: ok = kind == 'p' && operand >= 0 && operand < N_TENSORS; break;
            case R_STRIDE: ok = (kind == 'i' || kind == 'q') && operand >= 0 && operand < 12; break;
            case R_WS: ok = (kind == 'i' || kind == 'q') && operand >= 0 && operand < 5; break;
            case R_SCALE: ok = kind == 'f' || kind == 'd'; r.scale_kind = kind; break;
            default: ok = kind == 'i' || kind == 'q'; break;
            }
        }
        if (!ok) {
            PyErr_Format(PyExc_ValueError, "FastPath.commit(): patch (%d, %d, %d) does not fit the step's parameters",
                         arg, source, operand);
            return false;
        }
        s.patches.push_back(Patch{arg, source, operand});
    }
    return true;
}

PyObject *FastPath_commit(FastPath *self, PyObject *const *a, Py_ssize_t nargs)
{
    enum { C_TOKEN, C_DISP, C_KEEP, C_STEPS, C_SPAN, C_USUAL, C_PROMISED, C_ALIGNED, C_SPLIT, C_OUT, C_LSE, C_N };
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
    if (!span_arg(a[C_SPAN], *r))
        return nullptr;
    if (!PyTuple_Check(a[C_STEPS]) || PyTuple_GET_SIZE(a[C_STEPS]) < 1) {
        PyErr_SetString(PyExc_TypeError, "FastPath.commit(): steps must be a non-empty tuple");
        return nullptr;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(a[C_STEPS]); i++) {
        r->steps.emplace_back();
        if (!step_arg(PyTuple_GET_ITEM(a[C_STEPS], i), r->steps.back(), *r))
            return nullptr;
    }
    const Py_ssize_t n0 = static_cast<Py_ssize_t>(r->steps[0].storage.size());
    if (!indices_arg(a[C_USUAL], n0, "usual", r->usual) || !indices_arg(a[C_PROMISED], n0, "promised", r->promised))
        return nullptr;
    const int aligned = PyObject_IsTrue(a[C_ALIGNED]);
    if (aligned < 0)
        return nullptr;
    r->aligned = aligned != 0;
    if (a[C_SPLIT] != Py_None) {
        Split &p = r->split;
        long long v[9];
        if (!PyTuple_Check(a[C_SPLIT]) || !PyArg_ParseTuple(a[C_SPLIT], "LLLLLLLLL", &v[0], &v[1], &v[2], &v[3], &v[4],
                                                            &v[5], &v[6], &v[7], &v[8]))
            return nullptr;
        for (long long x : v) {
            if (x < 1) {
                PyErr_SetString(PyExc_ValueError, "FastPath.commit(): split is (limit, n0, programs, compute units, "
                                "occupancy, BLOCK_DV, nhead_q, batch, max_seqlen_q), each >= 1");
                return nullptr;
            }
        }
        p.limit = v[0];
        p.n0 = v[1];
        p.nprog = v[2];
        p.cus = v[3];
        p.occupancy = v[4];
        p.block_dv = v[5];
        p.nhead_q = v[6];
        p.batch = v[7];
        p.max_seqlen_q = v[8];
        r->has_split = true;
    }
    PyTypeObject *tt = reinterpret_cast<PyTypeObject *>(self->tensor_type);
    const bool want_lse = key.flags & F_LSE;
    if (Py_TYPE(a[C_OUT]) != tt || (want_lse ? Py_TYPE(a[C_LSE]) != tt : a[C_LSE] != Py_None)) {
        PyErr_SetString(PyExc_TypeError, "FastPath.commit(): out (and lse when the call returns it) must be the "
                        "tensors the call allocated");
        return nullptr;
    }
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
    r->disp.set(a[C_DISP]);
    r->keep.set(a[C_KEEP]);
    remember(self, key, std::move(r));
    Py_RETURN_NONE;
}

PyObject *FastPath_decline(FastPath *self, PyObject *const *a, Py_ssize_t nargs)
{
    if (self->map == nullptr) {
        PyErr_SetString(PyExc_RuntimeError, "FastPath: __init__ was not called");
        return nullptr;
    }
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "FastPath.decline(token, dispatcher, span) takes 3 arguments, got %zd", nargs);
        return nullptr;
    }
    Key key;
    if (token_key(a[0], a[1], &key) == nullptr)
        return nullptr;
    auto r = std::make_shared<Recipe>();  // no steps: run() hands such calls to the Python path at once
    if (!span_arg(a[2], *r))
        return nullptr;
    r->disp.set(a[1]);
    remember(self, key, std::move(r));
    Py_RETURN_NONE;
}

PyObject *FastPath_stats(FastPath *self, PyObject *)
{
    Py_ssize_t recipes = 0;
    if (self->map != nullptr) {
        for (const auto &kv : *self->map)
            recipes += static_cast<Py_ssize_t>(kv.second.size());
    }
    return Py_BuildValue("{s:K,s:K,s:K,s:n}", "hits", self->hits, "misses", self->misses, "declined", self->declined,
                         "recipes", recipes);
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
    Py_INCREF(dispatcher_type);
    Py_XSETREF(self->dispatcher_type, dispatcher_type);
    hold<Map>(self, tensor_type, raw_stream, capacity);
    return 0;
}

void FastPath_dealloc(FastPath *self)
{
    release(self);
    Py_XDECREF(self->dispatcher_type);
    Py_TYPE(self)->tp_free(reinterpret_cast<PyObject *>(self));
}

#include "torch_replay.h"  // the serving calls' replay (paged_attention, append_kv): the Replayer type

PyMethodDef FastPath_methods[] = {
    {"run", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(FastPath_run)), METH_FASTCALL,
     "run(q, k, v, causal, ..., max_seqlen_k, jit) -> result | bytes token (miss) | None (not for this path)"},
    {"commit", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(FastPath_commit)), METH_FASTCALL,
     "commit(token, dispatcher, keep, steps, span, usual, promised, aligned, split, out, lse): record what the "
     "Python path launched for the token's call, to replay for every key length of its span"},
    {"decline", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(FastPath_decline)), METH_FASTCALL,
     "decline(token, dispatcher, span): calls like the token's, of a key length in span, take the Python path"},
    {"clear", reinterpret_cast<PyCFunction>(clear_recipes<FastPath>), METH_NOARGS, "forget every recipe"},
    {"stats", reinterpret_cast<PyCFunction>(FastPath_stats), METH_NOARGS,
     "{'hits', 'misses', 'declined', 'recipes'}"},
    {nullptr, nullptr, 0, nullptr},
};

PyTypeObject FastPathType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyMethodDef module_methods[] = {
    {"splits_at", splits_at_py, METH_VARARGS,
     "splits_at(limit, seqlen_k, n0, nprog, cus, occupancy=1): the split count the replay uses "
     "(= fmha_dsl.costmodel.splits_at)"},
    {nullptr, nullptr, 0, nullptr},
};

struct PyModuleDef fast_module = {PyModuleDef_HEAD_INIT, "_fmha_torch_fast",
                                  "fmha-dsl's torch fast path for attention().", -1, module_methods};

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
