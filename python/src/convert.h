// Conversions between Python objects and qatgraph values shared by the binding files:
// tensors (NumPy arrays, PyTorch tensors, anything with the buffer protocol or __dlpack__),
// devices ("cpu", "cuda", "cuda:1") and attribute dictionaries.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <map>
#include <string>

#include "core/attrs.h"
#include "core/tensor.h"

namespace qgpy {

namespace nb = nanobind;

// What a returned tensor becomes: a numpy.ndarray (CPU only), a torch.Tensor, or a
// framework-neutral array object that supports both the buffer protocol (CPU) and DLPack.
enum class Framework { numpy, torch, dlpack };

// nullptr / None: NumPy for CPU tensors, PyTorch for CUDA tensors.
Framework framework_for(const nb::handle& name, const qg::Tensor& t);

// A qatgraph tensor over `obj`'s memory when it is C-contiguous, 16-byte aligned and of a
// qatgraph dtype ("zero-copy": the tensor keeps `obj` alive); otherwise (or with
// copy=true) a contiguous copy. Lists and scalars go through numpy.asarray first.
qg::Tensor to_tensor(nb::handle obj, bool copy = false);

// A view of `t` in `framework` sharing its memory (the returned object keeps the storage
// alive). NumPy has no bfloat16: such tensors are refused with a qg::Error.
nb::object from_tensor(const qg::Tensor& t, Framework framework);
nb::object from_tensor(const qg::Tensor& t, nb::handle framework);

// A dict of name -> tensor-like as CPU tensors (device tensors are copied to the host).
std::map<std::string, qg::Tensor> to_cpu_tensors(const nb::dict& tensors);

qg::Device parse_device(const std::string& s);  // "cpu", "cuda", "cuda:N"

// An array's DLPack dtype and device as qatgraph's; a qg::Error for anything else.
qg::DType dtype_from_dlpack(nb::dlpack::dtype d);
qg::Device device_from_dlpack(int type, int id);

// {"bits": 4, "signed": True, "scope": "channel", "axis": 0, "shape": [2, 3]} -> Attrs.
qg::Attrs to_attrs(const nb::handle& dict);
nb::object attr_to_python(const qg::Attr& a);

// An int (or an object with __index__, not a float or bool) as int64; a qg::Error naming
// `what` otherwise, or when it does not fit.
int64_t to_int(const nb::handle& obj, const std::string& what);

}  // namespace qgpy
