// qatgraph._core.Kernel: one op's kernel prepared once and called on tensors that the caller
// owns, on the caller's stream. The torch ops (qatgraph.torch) run on it: torch allocates the
// outputs (its caching allocator, its memory accounting, its CUDA graphs), the work goes on
// torch's current stream, and nothing waits for the device.
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "bindings.h"
#include "convert.h"
#include "core/error.h"
#include "runtime/op_call.h"

namespace qgpy {
namespace {

using Operand = nb::ndarray<nb::ro>;

// One context per (device, stream): a CUDA context bound to a stream it does not own, made on
// first use and kept for the process (torch's streams outlive the calls made on them). The
// contexts of one device share the error record of that device's first context, so a context
// for a stream met during a CUDA graph capture allocates nothing.
qg::DeviceContext& stream_context(const qg::Device& device, uintptr_t stream) {
  using Key = std::tuple<int, int, uintptr_t>;
  static std::map<Key, std::unique_ptr<qg::DeviceContext>> contexts;
  static std::map<std::pair<int, int>, std::unique_ptr<qg::DeviceContext>> record_owners;
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = contexts[{static_cast<int>(device.type), device.index, stream}];
  if (!slot) {
    auto& owner = record_owners[{static_cast<int>(device.type), device.index}];
    if (!owner) owner = qg::make_device_context(device);
    qg::ContextOptions options;
    options.stream = reinterpret_cast<void*>(stream);
    options.error_record = owner->error_buffer();
    slot = qg::make_device_context(device, options);
  }
  return *slot;
}

// A zero-copy view of a caller's contiguous, 16-byte aligned array. No stream is waited for:
// the caller orders the work (torch's current stream is the one the kernel runs on).
qg::Tensor view_of(const Operand& a, const std::string& op, const char* what, size_t i) {
  qg::Shape shape(a.ndim());
  int64_t expect = 1;
  bool contiguous = true;
  for (size_t d = a.ndim(); d-- > 0;) {
    shape[d] = static_cast<int64_t>(a.shape(d));
    if (shape[d] != 1 && a.stride(d) != expect) contiguous = false;
    expect *= shape[d];
  }
  QG_CHECK(contiguous, op, what, " ", i, " is not contiguous (call .contiguous() first)");
  QG_CHECK(reinterpret_cast<uintptr_t>(a.data()) % 16 == 0 || expect == 0, op, what, " ", i,
           " is not 16-byte aligned (a view into another tensor: pass a copy)");
  return qg::Tensor::from_external(const_cast<void*>(a.data()), shape,
                                   dtype_from_dlpack(a.dtype()),
                                   device_from_dlpack(a.device_type(), a.device_id()), nullptr);
}

std::vector<qg::Tensor> views(const std::vector<Operand>& arrays, const std::string& op,
                              const char* what) {
  std::vector<qg::Tensor> out;
  out.reserve(arrays.size());
  for (size_t i = 0; i < arrays.size(); ++i) out.push_back(view_of(arrays[i], op, what, i));
  return out;
}

using TypeList = std::vector<std::pair<std::string, std::vector<int64_t>>>;

TypeList type_list(const std::vector<qg::TensorType>& types) {
  TypeList out;
  for (const qg::TensorType& t : types)
    out.push_back({qg::dtype_name(t.dtype), std::vector<int64_t>(t.shape.begin(), t.shape.end())});
  return out;
}

class Kernel {
 public:
  Kernel(const std::string& op, nb::handle attrs, const TypeList& inputs,
         const std::string& device)
      : device_(parse_device(device)),
        prepared_(op, to_attrs(attrs), input_types(inputs), device_.type) {}

  TypeList output_types() const { return type_list(prepared_.output_types()); }

  std::vector<std::tuple<std::string, std::string, std::vector<int64_t>>> state_specs() const {
    std::vector<std::tuple<std::string, std::string, std::vector<int64_t>>> out;
    for (const qg::StateSpec& s : prepared_.state_specs())
      out.emplace_back(s.name, qg::dtype_name(s.type.dtype),
                       std::vector<int64_t>(s.type.shape.begin(), s.type.shape.end()));
    return out;
  }

  // Runs on `stream` (a cudaStream_t as an integer; 0 on the CPU) into `outputs`, updating
  // `states` in place (empty: the op's initial states, which the kernel keeps). Returns at once on CUDA; what a kernel records on the device is raised
  // by check_device_errors.
  void run(const std::vector<Operand>& inputs, const std::vector<Operand>& outputs,
           const std::vector<Operand>& states, bool training, uintptr_t stream) const {
    const std::string& op = prepared_.def().name;
    // First the context: it installs the device's allocator, which the views below look up.
    qg::DeviceContext& context = stream_context(device_, stream);
    std::vector<qg::Tensor> in = views(inputs, op, "input");
    std::vector<qg::Tensor> out = views(outputs, op, "output");
    // No states given: the op's initial ones (a fresh node's, e.g. fake_quant_enabled = 1),
    // made once per kernel.
    std::vector<qg::Tensor> st = states.empty() && !prepared_.state_specs().empty()
                                     ? initial_states()
                                     : views(states, op, "state");
    QG_CHECK(out.size() == prepared_.output_types().size(), op, "takes ",
             prepared_.output_types().size(), " outputs, got ", out.size());
    nb::gil_scoped_release release;
    prepared_.run(context, in, st, training, std::move(out));
  }

  std::string device() const { return device_.str(); }

 private:
  static std::vector<qg::TensorType> input_types(const TypeList& inputs) {
    std::vector<qg::TensorType> types;
    for (const auto& [dtype, shape] : inputs)
      types.push_back({qg::dtype_from_name(dtype), qg::Shape(shape.begin(), shape.end())});
    return types;
  }

  std::vector<qg::Tensor> initial_states() const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (initial_.empty()) initial_ = prepared_.initial_states(device_);
    return initial_;
  }

  qg::Device device_;
  qg::PreparedOp prepared_;
  mutable std::mutex mutex_;
  mutable std::vector<qg::Tensor> initial_;
};

}  // namespace

void bind_kernel(nb::module_& m) {
  nb::class_<Kernel>(m, "Kernel",
                     "One op's kernel, prepared once (attributes resolved and validated, "
                     "outputs inferred, arguments parsed) for fixed input types on a device, "
                     "then run on caller-owned tensors on the caller's stream.")
      .def(nb::init<const std::string&, nb::handle, const TypeList&, const std::string&>(),
           nb::arg("op"), nb::arg("attrs").none(), nb::arg("inputs"), nb::arg("device"),
           "Kernel(op, attrs, inputs=[(dtype, shape), ...], device='cuda:0').")
      .def_prop_ro("output_types", &Kernel::output_types,
                   "The outputs the caller allocates: [(dtype, shape), ...].")
      .def_prop_ro("state_specs", &Kernel::state_specs,
                   "The op's persistent states, updated in place: [(name, dtype, shape), ...].")
      .def_prop_ro("device", &Kernel::device, "The device the kernel runs on.")
      .def("run", &Kernel::run, nb::arg("inputs"), nb::arg("outputs"), nb::arg("states"),
           nb::arg("training"), nb::arg("stream"),
           "Runs into `outputs` on `stream` (a cudaStream_t as an integer, 0 for the CPU or "
           "the default stream); returns without waiting for the device.");
  m.def(
      "check_device_errors",
      [](const std::string& device, uintptr_t stream) {
        qg::Device dev = parse_device(device);
        nb::gil_scoped_release release;
        stream_context(dev, stream).check_errors(nullptr);
      },
      nb::arg("device"), nb::arg("stream"),
      "Waits for `stream` and raises what a kernel run there recorded on the device (a scale "
      "<= 0, a zero point out of range, ...).");
}

}  // namespace qgpy
