"""A DLPack producer that claims any device: lets a machine without a GPU hand the binding a
"CUDA" tensor (its data pointer is host memory the runner must never touch)."""

import ctypes

import numpy as np


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

CPU, CUDA = 1, 2
FLOAT = 2


class FakeDeviceArray:
    """Wraps a NumPy array's memory and shape, exporting it over DLPack as `device_type`."""

    def __init__(self, array: np.ndarray, device_type: int = CUDA, device_id: int = 0):
        self.array = np.ascontiguousarray(array)
        self.device_type = device_type
        self.device_id = device_id
        self._keep = []

    def __dlpack_device__(self):
        return (self.device_type, self.device_id)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        a = self.array
        shape = (ctypes.c_int64 * a.ndim)(*a.shape)
        strides = (ctypes.c_int64 * a.ndim)(*(s // a.itemsize for s in a.strides))
        mt = _DLManagedTensor()
        mt.dl_tensor.data = a.ctypes.data
        mt.dl_tensor.device = _DLDevice(self.device_type, self.device_id)
        mt.dl_tensor.ndim = a.ndim
        mt.dl_tensor.dtype = _DLDataType(FLOAT, a.itemsize * 8, 1)
        mt.dl_tensor.shape = shape
        mt.dl_tensor.strides = strides
        mt.dl_tensor.byte_offset = 0
        mt.manager_ctx = None
        mt.deleter = None  # nothing to free: this object keeps the memory alive
        self._keep.append((mt, shape, strides))
        return _capsule_new(ctypes.addressof(mt), b"dltensor", None)
