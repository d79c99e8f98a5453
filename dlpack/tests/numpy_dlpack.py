"""numpy, a real DLPack consumer and producer, against unihal's CPU backend.

Usage: python3 numpy_dlpack.py target/debug/examples/libnumpy_fixture.so

unihal -> numpy: np.from_dlpack reads tensors exported from the CPU backend (versioned and
legacy structs, an unconsumed capsule freed by its destructor), and the tensor outlives the
exporter's handles until numpy releases it (the caching allocator's allocated bytes show it).
numpy -> unihal: unihal imports arrays numpy exported (contiguous, transposed, negatively
strided, unaligned; versioned and legacy), reads them through a unihal op, and keeps the array
alive (a weak reference shows it) until unihal drops the import.
"""

import ctypes
import gc
import sys
import unittest
import weakref

import numpy as np

LIB = ctypes.CDLL(sys.argv.pop(1))
P = ctypes.c_void_p
for name, res, args in [
    ("uh_fx_new", P, []),
    ("uh_fx_free", None, [P]),
    ("uh_fx_allocated_bytes", ctypes.c_uint64, [P]),
    ("uh_fx_tensor_f32", P, [P, ctypes.c_uint64, ctypes.c_uint64]),
    ("uh_fx_tensor_drop", None, [P]),
    ("uh_fx_export", P, [P, P, ctypes.c_int32, ctypes.c_int64]),
    ("uh_fx_delete", None, [P, ctypes.c_int32]),
    ("uh_fx_import", P, [P, P, ctypes.c_int32]),
    ("uh_fx_imported_aligned", ctypes.c_int32, [P]),
    ("uh_fx_imported_read", ctypes.c_int64, [P, P, P, ctypes.c_uint64]),
    ("uh_fx_imported_drop", None, [P]),
]:
    f = getattr(LIB, name)
    f.restype, f.argtypes = res, args

API = ctypes.pythonapi
API.PyCapsule_New.restype = ctypes.py_object
API.PyCapsule_New.argtypes = [P, ctypes.c_char_p, P]
API.PyCapsule_GetPointer.restype = P
API.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
API.PyCapsule_SetName.restype = ctypes.c_int
API.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
# The destructor gets a borrowed, dying PyObject*: raw pointers only, no py_object.
RAW_IS_VALID = ctypes.PYFUNCTYPE(ctypes.c_int, P, ctypes.c_char_p)(("PyCapsule_IsValid", API))
RAW_GET = ctypes.PYFUNCTYPE(P, P, ctypes.c_char_p)(("PyCapsule_GetPointer", API))

# Capsule names must outlive their capsules.
# Capsules keep the name pointer (no copy): these buffers live as long as the module.
NAMES = {1: ctypes.create_string_buffer(b"dltensor_versioned"), 0: ctypes.create_string_buffer(b"dltensor")}
USED = {v: ctypes.create_string_buffer(b"used_" + n.value) for v, n in NAMES.items()}
DESTRUCTOR = ctypes.CFUNCTYPE(None, P)


def destroy(versioned):
    def run(cap):
        name = NAMES[versioned].value
        if RAW_IS_VALID(cap, name):  # not consumed: the producer frees it
            LIB.uh_fx_delete(RAW_GET(cap, name), versioned)
    return DESTRUCTOR(run)


DESTROY = {1: destroy(1), 0: destroy(0)}
FX = LIB.uh_fx_new()
assert FX, "the fixture did not open"


def capsule(ptr, versioned):
    assert ptr, "export failed"
    return API.PyCapsule_New(ptr, ctypes.cast(NAMES[versioned], ctypes.c_char_p),
                             ctypes.cast(DESTROY[versioned], P))


class UnihalTensor:
    """A unihal CPU tensor with the Python DLPack protocol (DLPack 1.0)."""

    def __init__(self, rows, cols):
        self.t = LIB.uh_fx_tensor_f32(FX, rows, cols)
        assert self.t
        self.calls = []

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        self.calls.append({"stream": stream, "max_version": max_version, "copy": copy})
        if copy:
            raise BufferError("unihal exports without copying")
        versioned = int(max_version is not None and max_version[0] >= 1)
        s = -2 if stream is None else stream
        return capsule(LIB.uh_fx_export(FX, self.t, versioned, s), versioned)

    def drop(self):
        LIB.uh_fx_tensor_drop(self.t)
        self.t = None


class LegacyUnihalTensor(UnihalTensor):
    """A producer of the pre-1.0 protocol: no max_version, legacy struct."""

    def __dlpack__(self, stream=None):
        self.calls.append({"stream": stream})
        return capsule(LIB.uh_fx_export(FX, self.t, 0, -2 if stream is None else stream), 0)


def expected(rows, cols):
    return (np.arange(rows * cols, dtype=np.float32) * 0.5 + 1.0).reshape(rows, cols)


def unihal_read(imp, nbytes):
    out = ctypes.create_string_buffer(nbytes)
    n = LIB.uh_fx_imported_read(FX, imp, out, nbytes)
    assert n == nbytes, f"read {n} of {nbytes} bytes"
    return out.raw


def take(cap, versioned):
    """Consumes a numpy capsule as the DLPack protocol says: rename, then own."""
    name = NAMES[versioned].value
    ptr = API.PyCapsule_GetPointer(cap, name)
    assert API.PyCapsule_SetName(cap, ctypes.cast(USED[versioned], ctypes.c_char_p)) == 0
    return ptr


class UnihalToNumpy(unittest.TestCase):
    def test_numpy_reads_a_versioned_export_that_outlives_the_exporter(self):
        t = UnihalTensor(3, 5)
        arr = np.from_dlpack(t)
        self.assertEqual(t.calls[0]["max_version"][0], 1, t.calls)
        self.assertEqual(arr.shape, (3, 5))
        self.assertEqual(arr.dtype, np.float32)
        np.testing.assert_array_equal(arr, expected(3, 5))
        self.assertEqual(LIB.uh_fx_allocated_bytes(FX), 512)
        t.drop()  # the exporter's last handle
        self.assertEqual(LIB.uh_fx_allocated_bytes(FX), 512, "numpy's reference keeps the block")
        np.testing.assert_array_equal(arr, expected(3, 5))
        arr[0, 0] = 42.0  # writable: numpy's own view of unihal memory
        del arr
        gc.collect()
        self.assertEqual(LIB.uh_fx_allocated_bytes(FX), 0, "the deleter gave the block back")

    def test_numpy_reads_a_legacy_export(self):
        t = LegacyUnihalTensor(4, 2)
        arr = np.from_dlpack(t)
        self.assertNotIn("max_version", t.calls[-1])
        np.testing.assert_array_equal(arr, expected(4, 2))
        t.drop()
        np.testing.assert_array_equal(arr, expected(4, 2))
        del arr
        gc.collect()
        self.assertEqual(LIB.uh_fx_allocated_bytes(FX), 0)

    def test_an_unconsumed_capsule_is_freed_by_its_destructor(self):
        t = UnihalTensor(2, 2)
        cap = t.__dlpack__(max_version=(1, 0))
        t.drop()
        self.assertEqual(LIB.uh_fx_allocated_bytes(FX), 512)
        del cap
        gc.collect()
        self.assertEqual(LIB.uh_fx_allocated_bytes(FX), 0)


class NumpyToUnihal(unittest.TestCase):
    def check(self, a, versioned=1, aligned=None):
        """Imports `a` (the caller holds no other reference) and checks bytes and lifetime."""
        want = np.ascontiguousarray(a).tobytes()
        if aligned == 0:
            self.assertNotEqual(a.ctypes.data % 256, 0)
        cap = a.__dlpack__(max_version=(1, 0)) if versioned else a.__dlpack__()
        owner = a.base if a.base is not None else a
        w = weakref.ref(owner)
        imp = LIB.uh_fx_import(FX, take(cap, versioned), versioned)
        self.assertTrue(imp, "import failed")
        if aligned is not None:
            self.assertEqual(LIB.uh_fx_imported_aligned(imp), aligned)
        self.assertEqual(unihal_read(imp, len(want)), want)
        del a, cap, owner
        gc.collect()
        self.assertIsNotNone(w(), "the import keeps numpy's array alive")
        self.assertEqual(unihal_read(imp, len(want)), want)
        LIB.uh_fx_imported_drop(imp)
        gc.collect()
        self.assertIsNone(w(), "unihal released numpy's array")

    def test_contiguous_versioned(self):
        self.check(np.arange(24, dtype=np.int32).reshape(4, 6))

    def test_contiguous_legacy(self):
        self.check(np.arange(10, dtype=np.float64) / 3, versioned=0)

    def test_transposed(self):
        self.check(np.arange(24, dtype=np.float32).reshape(4, 6).T)

    def test_negative_strides(self):
        self.check(np.arange(50, dtype=np.int64)[::-2])

    def test_unaligned_is_accepted_and_said_so(self):
        # One byte past numpy's (at least 16-byte aligned) allocation: never 256-byte aligned.
        self.check(np.arange(301, dtype=np.uint8)[1:], aligned=0)
        self.check(np.zeros(4096 + 256, dtype=np.uint8), aligned=None)

    def test_bool_and_half(self):
        self.check(np.array([True, False, True, True]))
        self.check(np.linspace(-2, 2, 9, dtype=np.float16))


if __name__ == "__main__":
    print(f"numpy {np.__version__}, python {sys.version.split()[0]}")
    ok = unittest.main(exit=False, verbosity=2).result.wasSuccessful()
    LIB.uh_fx_free(FX)
    sys.exit(0 if ok else 1)
