"""Stand-ins shared by the tests of the native pieces (imported by test modules; not a test module)."""

import ctypes

_PROTO = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p,
                          ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)


class FakeDriver:
    """A stand-in for the driver's launch entry point: records the call, returns a chosen status."""

    def __init__(self, nparams, status=0):
        self.calls, self.status, self.nparams = [], status, nparams

        def cb(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
            slots = [ctypes.string_at(params[i], 8) for i in range(self.nparams)]
            self.calls.append(dict(function=function, grid=(gx, gy, gz), block=(bx, by, bz), shared=shared,
                                   stream=stream or 0, slots=slots, extra=extra))
            return self.status

        self._cb = _PROTO(cb)  # keep the callback alive
        self.address = ctypes.cast(self._cb, ctypes.c_void_p).value
