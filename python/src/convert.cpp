#include "convert.h"

#include <nanobind/ndarray.h>

#include <cstring>
#include <memory>
#include <vector>

namespace qgpy {
namespace {

namespace dl = nb::dlpack;

dl::dtype dlpack_from_dtype(qg::DType t) {
  using C = dl::dtype_code;
  auto make = [](C code, int bits) {
    return dl::dtype{static_cast<uint8_t>(code), static_cast<uint8_t>(bits), 1};
  };
  switch (t) {
    case qg::DType::f32:
      return make(C::Float, 32);
    case qg::DType::f64:
      return make(C::Float, 64);
    case qg::DType::f16:
      return make(C::Float, 16);
    case qg::DType::bf16:
      return make(C::Bfloat, 16);
    case qg::DType::i8:
      return make(C::Int, 8);
    case qg::DType::u8:
      return make(C::UInt, 8);
    case qg::DType::i32:
      return make(C::Int, 32);
    case qg::DType::i64:
      return make(C::Int, 64);
    case qg::DType::boolean:
      return make(C::Bool, 8);
  }
  QG_FAIL("python", "unknown dtype");
}

using ReadOnlyArray = nb::ndarray<nb::ro>;

// Keeps the Python-side array alive; its last release takes the GIL, since the tensor may
// die on a thread that released it (an executor run).
std::shared_ptr<void> hold(const ReadOnlyArray& a) {
  return std::shared_ptr<void>(new ReadOnlyArray(a), [](void* p) {
    nb::gil_scoped_acquire gil;
    delete static_cast<ReadOnlyArray*>(p);
  });
}

// Copies a strided CPU array element by element into a contiguous tensor.
void copy_strided(const ReadOnlyArray& a, qg::Tensor& out) {
  const size_t item = qg::dtype_size(out.dtype()), ndim = a.ndim();
  const auto* src = static_cast<const char*>(a.data());
  char* dst = static_cast<char*>(out.raw_data());
  std::vector<int64_t> index(ndim, 0);
  for (int64_t n = 0; n < out.numel(); ++n) {
    int64_t offset = 0;
    for (size_t d = 0; d < ndim; ++d) offset += index[d] * a.stride(d);
    std::memcpy(dst + n * item, src + offset * static_cast<int64_t>(item), item);
    for (size_t d = ndim; d-- > 0;) {
      if (++index[d] < static_cast<int64_t>(a.shape(d))) break;
      index[d] = 0;
    }
  }
}

}  // namespace

qg::DType dtype_from_dlpack(dl::dtype d) {
  using C = dl::dtype_code;
  auto code = static_cast<C>(d.code);
  if (d.lanes == 1) {
    if (code == C::Float && d.bits == 32) return qg::DType::f32;
    if (code == C::Float && d.bits == 64) return qg::DType::f64;
    if (code == C::Float && d.bits == 16) return qg::DType::f16;
    if (code == C::Bfloat && d.bits == 16) return qg::DType::bf16;
    if (code == C::Int && d.bits == 8) return qg::DType::i8;
    if (code == C::Int && d.bits == 32) return qg::DType::i32;
    if (code == C::Int && d.bits == 64) return qg::DType::i64;
    if (code == C::UInt && d.bits == 8) return qg::DType::u8;
    if (code == C::Bool && d.bits == 8) return qg::DType::boolean;
  }
  QG_FAIL("python", "array element type (DLPack code ", int(d.code), ", ", int(d.bits), " bits, ",
          d.lanes,
          " lanes) is not a qatgraph dtype: f32, f64, f16, bf16, i8, u8, "
          "i32, i64, bool");
}

qg::Device device_from_dlpack(int type, int id) {
  if (type == nb::device::cpu::value) return qg::Device::cpu();
  if (type == nb::device::cuda::value) return qg::Device::cuda(id);
  QG_FAIL("python", "arrays on DLPack device type ", type, " are not supported (CPU and CUDA are)");
}

Framework framework_for(const nb::handle& name, const qg::Tensor& t) {
  if (name.is_none()) return t.device().is_cpu() ? Framework::numpy : Framework::torch;
  std::string s = nb::cast<std::string>(name);
  if (s == "numpy") return Framework::numpy;
  if (s == "torch") return Framework::torch;
  if (s == "dlpack") return Framework::dlpack;
  QG_FAIL("python", "framework '", s, "' is not one of numpy, torch, dlpack");
}

qg::Tensor to_tensor(nb::handle obj, bool copy) {
  ReadOnlyArray a;
  if (!nb::try_cast(obj, a, /*convert=*/false)) {
    nb::object array = nb::module_::import_("numpy").attr("asarray")(obj);
    QG_CHECK(nb::try_cast(array, a, false), "python", "cannot convert a ",
             nb::cast<std::string>(nb::str(obj.type())), " to a tensor");
  }
  qg::DType dtype = dtype_from_dlpack(a.dtype());
  qg::Device device = device_from_dlpack(a.device_type(), a.device_id());
  if (device.is_cuda() && nb::hasattr(obj, "is_cuda")) {
    // A torch CUDA tensor may still be being written on torch's stream, which the executor's
    // stream does not wait for: finish that stream's work first.
    nb::module_::import_("torch")
        .attr("cuda")
        .attr("current_stream")(device.index)
        .attr("synchronize")();
  }
  qg::Shape shape(a.ndim());
  for (size_t d = 0; d < a.ndim(); ++d) shape[d] = static_cast<int64_t>(a.shape(d));

  bool contiguous = true;
  int64_t expect = 1;
  for (size_t d = a.ndim(); d-- > 0;) {
    if (shape[d] != 1 && a.stride(d) != expect) contiguous = false;
    expect *= shape[d];
  }
  bool aligned = reinterpret_cast<uintptr_t>(a.data()) % 16 == 0;
  if (contiguous && aligned && !copy)
    return qg::Tensor::from_external(const_cast<void*>(a.data()), shape, dtype, device, hold(a));

  if (contiguous) {
    qg::Tensor view =
        qg::Tensor::from_external(const_cast<void*>(a.data()), shape, dtype, device, hold(a));
    return view.to(device);
  }
  QG_CHECK(device.is_cpu(), "python", "a non-contiguous array on ", device.str(),
           " (call .contiguous() first)");
  qg::Tensor out = qg::Tensor::empty(shape, dtype);
  copy_strided(a, out);
  return out;
}

nb::object from_tensor(const qg::Tensor& t, Framework framework) {
  QG_CHECK(t.defined(), "python", "an undefined tensor has no Python value");
  QG_CHECK(t.is_contiguous(), "python", "a non-contiguous tensor ", t.str());
  std::vector<size_t> shape(t.shape().begin(), t.shape().end());
  nb::capsule owner(new qg::Tensor(t),
                    [](void* p) noexcept { delete static_cast<qg::Tensor*>(p); });
  int device_type = t.device().is_cuda() ? nb::device::cuda::value : nb::device::cpu::value;
  dl::dtype dtype = dlpack_from_dtype(t.dtype());
  switch (framework) {
    case Framework::numpy: {
      QG_CHECK(t.device().is_cpu(), "python", "a ", t.str(),
               " cannot become a NumPy array (framework='torch' or 'dlpack')");
      QG_CHECK(t.dtype() != qg::DType::bf16, "python",
               "NumPy has no bfloat16 (framework='torch' or 'dlpack')");
      return nb::ndarray<nb::numpy>(t.raw_data(), shape.size(), shape.data(), owner, nullptr, dtype,
                                    device_type, t.device().index)
          .cast(nb::rv_policy::automatic);
    }
    case Framework::torch: {
      // PyTorch before 2.0 rejects DLPack's bool code: hand bools over as uint8 and view
      // them as torch.bool (same bytes, no copy).
      bool as_bytes = t.dtype() == qg::DType::boolean;
      if (as_bytes) dtype = dlpack_from_dtype(qg::DType::u8);
      nb::object out = nb::ndarray<nb::pytorch>(t.raw_data(), shape.size(), shape.data(), owner,
                                                nullptr, dtype, device_type, t.device().index)
                           .cast(nb::rv_policy::automatic);
      if (as_bytes) out = out.attr("view")(nb::module_::import_("torch").attr("bool"));
      return out;
    }
    case Framework::dlpack:
      return nb::ndarray<nb::array_api>(t.raw_data(), shape.size(), shape.data(), owner, nullptr,
                                        dtype, device_type, t.device().index)
          .cast(nb::rv_policy::automatic);
  }
  QG_FAIL("python", "unknown framework");
}

nb::object from_tensor(const qg::Tensor& t, nb::handle framework) {
  return from_tensor(t, framework_for(framework, t));
}

qg::Device parse_device(const std::string& s) {
  if (s == "cpu") return qg::Device::cpu();
  if (s == "cuda") return qg::Device::cuda(0);
  if (s.rfind("cuda:", 0) == 0) {
    std::string index = s.substr(5);
    QG_CHECK(!index.empty() && index.find_first_not_of("0123456789") == std::string::npos, "python",
             "device '", s, "' is not cpu, cuda or cuda:N");
    return qg::Device::cuda(std::stoi(index));
  }
  QG_FAIL("python", "device '", s, "' is not cpu, cuda or cuda:N");
}

std::map<std::string, qg::Tensor> to_cpu_tensors(const nb::dict& tensors) {
  std::map<std::string, qg::Tensor> out;
  for (auto [name, value] : tensors) {
    qg::Tensor t = to_tensor(value);
    out[nb::cast<std::string>(name)] = t.device().is_cpu() ? t : t.to(qg::Device::cpu());
  }
  return out;
}

}  // namespace qgpy
