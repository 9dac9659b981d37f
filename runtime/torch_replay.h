/*
 * The serving fast path's replay in C++ (the ``Replayer`` type of ``_fmha_torch_fast``; included by
 * torch_fast.cpp, inside its anonymous namespace, after the helpers it uses).
 *
 *     R = _fmha_torch_fast.Replayer(tensor_type, raw_stream, capacity)
 *     r = R.run(tensors, scalars)        # None: no recipe (take the Python path); else a tuple of the tensors
 *                                        # the recipe allocates (possibly empty), the launches enqueued
 *     R.record(tensors, scalars, steps, checks, allocs)
 *
 * ``tensors`` is a tuple of torch tensors or None in a fixed order of the caller's (paged_attention's,
 * append_kv's or attention_backward's, fmha_dsl/replay.py); ``scalars`` any hashable object holding the call's
 * other arguments.
 * The key is every tensor's sizes, strides, dtype and device (None marked as such), which of them start off a
 * 16-byte boundary, and ``scalars`` (hash, then equality): a hit is a call equal to one the Python path checked and
 * launched in everything but the addresses.
 * A recipe is its launches -- per step the driver's launch entry point, the function, block, shared bytes, grid,
 * the packed arguments and the pointer slots ``(argument, tensor index, byte offset)`` patched per call --, the
 * ``checks`` ``(tensor index, byte offset)`` whose address must stay 16-byte aligned (the binary was built for
 * that: a call breaking it returns None), and ``allocs`` ``(tensor index, tensor[, zero])``: positions the call
 * leaves None and the recipe allocates (with the recorded tensor's sizes, strides, dtype and device; zero-filled on
 * the current stream with ``zero``) before launching.
 * A recipe holds references to the kernel objects (``steps[i][0]``) that keep the loaded functions alive.
 */

constexpr int kMaxReplayTensors = 16;

struct ReplayStep : Launch {
    std::vector<int> slot_arg, slot_tensor;
    std::vector<int64_t> slot_offset;
};

struct ReplayAlloc {
    int index = 0;
    bool zero = false;  // zero-filled before the launches (an accumulating workspace)
    std::vector<int64_t> sizes, strides;
    c10::ScalarType dtype = c10::ScalarType::Float;
    c10::Device device = c10::Device(c10::DeviceType::CPU);
};

struct ReplayRecipe {
    Held scalars;  // compared on a hit (the key holds their hash)
    Held keep;     // the kernel objects
    std::vector<ReplayStep> steps;
    std::vector<std::pair<int, int64_t>> checks;
    std::vector<ReplayAlloc> allocs;
    int device = -1;
};

using ReplayMap = std::unordered_map<std::string, std::shared_ptr<ReplayRecipe>>;

struct Replayer {
    PyObject_HEAD
    PyObject *tensor_type;
    PyObject *raw_stream;
    Py_ssize_t capacity;
    ReplayMap *map;
    unsigned long long hits, misses;
};

/* the key of ``tensors`` (a tuple of tensors / None) and ``scalars``' hash into ``key``; false when a tensor is not
 * a plain torch tensor (the Python path decides then); ``ptrs`` gets the data pointers (0 for None) */
bool replay_key(Replayer *self, PyObject *tensors, Py_hash_t h, std::string &key, uintptr_t *ptrs, Py_ssize_t *n)
{
    if (!PyTuple_Check(tensors))
        return false;
    const Py_ssize_t nt = PyTuple_GET_SIZE(tensors);
    if (nt > kMaxReplayTensors)
        return false;
    PyTypeObject *tt = reinterpret_cast<PyTypeObject *>(self->tensor_type);
    int64_t words[kMaxReplayTensors * 13 + 3];
    size_t w = 0;
    words[w++] = static_cast<int64_t>(h);
    words[w++] = nt;
    int64_t misaligned = 0;  // which tensors start off a 16-byte boundary: they get their own (unpromised) recipe
    for (Py_ssize_t i = 0; i < nt; i++) {
        PyObject *o = PyTuple_GET_ITEM(tensors, i);
        if (o == Py_None) {
            words[w++] = -1;
            ptrs[i] = 0;
            continue;
        }
        if (Py_TYPE(o) != tt)
            return false;
        const at::Tensor &t = THPVariable_Unpack(o);
        if (!t.defined() || t.layout() != c10::kStrided || t.dim() > 5)
            return false;
        const int64_t nd = t.dim();
        const c10::Device d = t.device();
        words[w++] = nd | (static_cast<int64_t>(t.scalar_type()) << 8) | (static_cast<int64_t>(d.type()) << 24) |
                     (static_cast<int64_t>(d.has_index() ? d.index() + 1 : 0) << 40);
        for (int64_t k = 0; k < nd; k++) {
            words[w++] = t.size(k);
            words[w++] = t.stride(k);
        }
        ptrs[i] = reinterpret_cast<uintptr_t>(t.data_ptr());
        if (ptrs[i] & 15)
            misaligned |= int64_t{1} << i;
    }
    words[w++] = misaligned;
    key.assign(reinterpret_cast<const char *>(words), w * sizeof(int64_t));
    *n = nt;
    return true;
}

PyObject *Replayer_run(Replayer *self, PyObject *const *a, Py_ssize_t nargs)
{
    if (self->map == nullptr || nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "Replayer.run(tensors, scalars) takes 2 arguments (after __init__)");
        return nullptr;
    }
    Py_hash_t h = PyObject_Hash(a[1]);
    if (h == -1) {
        PyErr_Clear();  // an unhashable argument: never replayed
        Py_RETURN_NONE;
    }
    try {
        std::string key;
        uintptr_t ptrs[kMaxReplayTensors];
        Py_ssize_t nt = 0;
        if (!replay_key(self, a[0], h, key, ptrs, &nt))
            Py_RETURN_NONE;
        auto it = self->map->find(key);
        if (it == self->map->end()) {
            self->misses++;
            Py_RETURN_NONE;
        }
        const std::shared_ptr<ReplayRecipe> held = it->second;  // record() may drop it from the map meanwhile
        const ReplayRecipe &r = *held;
        int eq = PyObject_RichCompareBool(r.scalars.p, a[1], Py_EQ);
        if (eq < 0)
            return nullptr;
        if (eq == 0) {  // a hash collision
            self->misses++;
            Py_RETURN_NONE;
        }
        Ref made(PyTuple_New(static_cast<Py_ssize_t>(r.allocs.size())));
        if (made.p == nullptr)
            return nullptr;
        for (size_t i = 0; i < r.allocs.size(); i++) {
            const ReplayAlloc &al = r.allocs[i];
            at::Tensor t = at::empty_strided(al.sizes, al.strides,
                                             at::TensorOptions().dtype(al.dtype).device(al.device));
            if (al.zero)
                t.zero_();  // on the current stream, before the launches below
            ptrs[al.index] = reinterpret_cast<uintptr_t>(t.data_ptr());
            PyObject *o = THPVariable_Wrap(std::move(t));
            if (o == nullptr)
                return nullptr;
            PyTuple_SET_ITEM(made.p, static_cast<Py_ssize_t>(i), o);
        }
        for (const auto &c : r.checks) {
            if ((ptrs[c.first] + static_cast<uintptr_t>(c.second)) & 15) {
                self->misses++;
                Py_RETURN_NONE;  // an address breaks the binary's 16-byte promise: the Python path decides
            }
        }
        Ref devobj(PyLong_FromLong(r.device));
        if (devobj.p == nullptr)
            return nullptr;
        void *stream;
        if (!stream_of(self->raw_stream, devobj.p, &stream))
            return nullptr;
        uint64_t buf[kMaxParams];
        for (const ReplayStep &s : r.steps) {
            std::memcpy(buf, s.storage.data(), s.storage.size() * sizeof(uint64_t));
            for (size_t j = 0; j < s.slot_arg.size(); j++)
                buf[s.slot_arg[j]] = ptrs[s.slot_tensor[j]] + static_cast<uintptr_t>(s.slot_offset[j]);
            if (launch(s, s.grid[1], stream, buf) != 0) {  // the Python path launches again (every step: they only
                // write) and reports the error
                self->misses++;
                Py_RETURN_NONE;
            }
        }
        self->hits++;
        Py_INCREF(made.p);
        return made.p;
    } catch (const std::exception &) {
        if (PyErr_Occurred())
            return nullptr;
        Py_RETURN_NONE;  // a tensor torch cannot describe here: the Python path gives the error
    }
}

bool replay_step(PyObject *o, Py_ssize_t nt, ReplayStep &s)
{
    // (launch_fn, function, block, shared, kinds, ntail, grid, args, slots)
    if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) != 9 || !PyTuple_Check(PyTuple_GET_ITEM(o, 8))) {
        PyErr_SetString(PyExc_TypeError, "Replayer.record(): a step is (launch_fn, function, block, shared, kinds, "
                        "ntail, grid, args, slots), slots a tuple");
        return false;
    }
    if (!launch_arg(o, "Replayer.record()", s))
        return false;
    PyObject *slots = PyTuple_GET_ITEM(o, 8);
    const Py_ssize_t np = static_cast<Py_ssize_t>(s.kinds.size());
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(slots); j++) {
        long long arg, ti, off;
        PyObject *t = PyTuple_GET_ITEM(slots, j);
        if (!PyArg_ParseTuple(t, "LLL", &arg, &ti, &off))
            return false;
        if (arg < 0 || arg >= np || s.kinds[static_cast<size_t>(arg)] != 'p' || ti < 0 || ti >= nt) {
            PyErr_Format(PyExc_ValueError, "Replayer.record(): slot (%lld, %lld) is not a pointer parameter / tensor",
                         arg, ti);
            return false;
        }
        s.slot_arg.push_back(static_cast<int>(arg));
        s.slot_tensor.push_back(static_cast<int>(ti));
        s.slot_offset.push_back(static_cast<int64_t>(off));
    }
    return true;
}

PyObject *Replayer_record(Replayer *self, PyObject *const *a, Py_ssize_t nargs)
{
    enum { R_TENSORS, R_SCALARS, R_STEPS, R_CHECKS, R_ALLOCS, R_KEEP, R_N };
    if (self->map == nullptr || nargs != R_N) {
        PyErr_SetString(PyExc_TypeError, "Replayer.record(tensors, scalars, steps, checks, allocs, keep) takes 6 "
                        "arguments (after __init__)");
        return nullptr;
    }
    Py_hash_t h = PyObject_Hash(a[R_SCALARS]);
    if (h == -1)
        return nullptr;
    try {
        std::string key;
        uintptr_t ptrs[kMaxReplayTensors];
        Py_ssize_t nt = 0;
        if (!replay_key(self, a[R_TENSORS], h, key, ptrs, &nt)) {
            PyErr_SetString(PyExc_TypeError, "Replayer.record(): tensors must be a tuple of at most 16 plain torch "
                            "tensors or None");
            return nullptr;
        }
        auto r = std::make_shared<ReplayRecipe>();
        if (!PyTuple_Check(a[R_STEPS]) || !PyTuple_Check(a[R_CHECKS]) || !PyTuple_Check(a[R_ALLOCS])) {
            PyErr_SetString(PyExc_TypeError, "Replayer.record(): steps, checks and allocs must be tuples");
            return nullptr;
        }
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(a[R_STEPS]); i++) {
            r->steps.emplace_back();
            if (!replay_step(PyTuple_GET_ITEM(a[R_STEPS], i), nt, r->steps.back()))
                return nullptr;
        }
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(a[R_CHECKS]); i++) {
            long long ti, off;
            if (!PyArg_ParseTuple(PyTuple_GET_ITEM(a[R_CHECKS], i), "LL", &ti, &off))
                return nullptr;
            if (ti < 0 || ti >= nt) {
                PyErr_SetString(PyExc_ValueError, "Replayer.record(): a check names no tensor");
                return nullptr;
            }
            r->checks.emplace_back(static_cast<int>(ti), static_cast<int64_t>(off));
        }
        PyTypeObject *tt = reinterpret_cast<PyTypeObject *>(self->tensor_type);
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(a[R_ALLOCS]); i++) {
            long long ti;
            PyObject *t;
            int zero = 0;
            if (!PyArg_ParseTuple(PyTuple_GET_ITEM(a[R_ALLOCS], i), "LO|p", &ti, &t, &zero))
                return nullptr;
            if (ti < 0 || ti >= nt || PyTuple_GET_ITEM(a[R_TENSORS], ti) != Py_None || Py_TYPE(t) != tt) {
                PyErr_SetString(PyExc_ValueError, "Replayer.record(): an allocation must fill a None position with "
                                "a recorded tensor");
                return nullptr;
            }
            const at::Tensor &x = THPVariable_Unpack(t);
            ReplayAlloc al;
            al.index = static_cast<int>(ti);
            al.zero = zero != 0;
            sizes_of(x, al.sizes, al.strides);
            al.dtype = x.scalar_type();
            al.device = x.device();
            r->allocs.push_back(std::move(al));
        }
        int dev = -1;
        for (Py_ssize_t i = 0; i < nt; i++) {
            PyObject *o = PyTuple_GET_ITEM(a[R_TENSORS], i);
            if (o != Py_None) {
                const c10::Device d = THPVariable_Unpack(o).device();
                dev = d.has_index() ? d.index() : -1;
                break;
            }
        }
        r->device = dev;
        r->scalars.set(a[R_SCALARS]);
        r->keep.set(a[R_KEEP]);
        if (static_cast<Py_ssize_t>(self->map->size()) >= self->capacity && self->map->find(key) == self->map->end())
            self->map->clear();  // bounded: start over rather than track recency on the hot path
        (*self->map)[key] = std::move(r);
    } catch (const std::exception &exc) {
        PyErr_Format(PyExc_ValueError, "Replayer.record(): %s", exc.what());
        return nullptr;
    }
    Py_RETURN_NONE;
}

PyObject *Replayer_stats(Replayer *self, PyObject *)
{
    return Py_BuildValue("{s:K,s:K,s:n}", "hits", self->hits, "misses", self->misses, "recipes",
                         static_cast<Py_ssize_t>(self->map ? self->map->size() : 0));
}

int Replayer_init(Replayer *self, PyObject *args, PyObject *kwargs)
{
    PyObject *tensor_type, *raw_stream;
    Py_ssize_t capacity = 1024;
    static const char *names[] = {"tensor_type", "raw_stream", "capacity", nullptr};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|n", const_cast<char **>(names), &tensor_type, &raw_stream,
                                     &capacity))
        return -1;
    if (!PyType_Check(tensor_type) || !PyCallable_Check(raw_stream) || capacity < 1) {
        PyErr_SetString(PyExc_TypeError, "Replayer(): tensor_type must be a type, raw_stream a callable, "
                        "capacity >= 1");
        return -1;
    }
    hold<ReplayMap>(self, tensor_type, raw_stream, capacity);
    return 0;
}

void Replayer_dealloc(Replayer *self)
{
    release(self);
    Py_TYPE(self)->tp_free(reinterpret_cast<PyObject *>(self));
}

PyMethodDef Replayer_methods[] = {
    {"run", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(Replayer_run)), METH_FASTCALL,
     "run(tensors, scalars) -> None (no recipe: take the Python path) | tuple of the tensors it allocated"},
    {"record", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(Replayer_record)), METH_FASTCALL,
     "record(tensors, scalars, steps, checks, allocs, keep): what the Python path launched for this call"},
    {"clear", reinterpret_cast<PyCFunction>(clear_recipes<Replayer>), METH_NOARGS, "forget every recipe"},
    {"stats", reinterpret_cast<PyCFunction>(Replayer_stats), METH_NOARGS, "{'hits', 'misses', 'recipes'}"},
    {nullptr, nullptr, 0, nullptr},
};

PyTypeObject ReplayerType = {PyVarObject_HEAD_INIT(nullptr, 0)};
