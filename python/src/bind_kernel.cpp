// qatgraph._core.Kernel: one op's kernel prepared once and called on tensors that the caller
// owns, on the caller's stream. The torch ops (qatgraph.torch) run on it: torch allocates the
// outputs (its caching allocator, its memory accounting, its CUDA graphs), the work goes on
// torch's current stream, and nothing waits for the device.
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
    // 0 is torch's default stream, CUDA's legacy one (cudaStreamLegacy, handle 0x1); a null
    // stream would make the context create a stream of its own.
    options.stream = reinterpret_cast<void*>(stream == 0 ? uintptr_t{1} : stream);
    options.error_record = owner->error_buffer();
    slot = qg::make_device_context(device, options);
  }
  return *slot;
}

// A tensor over a caller's memory at `address`, of the type the kernel was prepared for. The
// caller (qatgraph.torch) passes the data pointers of dense tensors of exactly these types:
// no DLPack exchange, which in torch makes the legacy default stream wait on the current one
// (costly per call, and not allowed while a CUDA graph is being captured).
qg::Tensor view_at(uintptr_t address, const qg::TensorType& type, const qg::Device& device,
                   const std::string& op, const char* what, size_t i) {
  QG_CHECK(address % 16 == 0 || type.numel() == 0, op, what, " ", i, " at 0x", std::hex, address,
           std::dec, " is not 16-byte aligned (a view into another tensor: pass a copy)");
  return qg::Tensor::from_external(reinterpret_cast<void*>(address), type.shape, type.dtype, device,
                                   nullptr);
}

std::vector<qg::Tensor> views(const std::vector<uintptr_t>& addresses,
                              const std::vector<qg::TensorType>& types, const qg::Device& device,
                              const std::string& op, const char* what) {
  QG_CHECK(addresses.size() == types.size(), op, "takes ", types.size(), " ", what, "s, got ",
           addresses.size());
  std::vector<qg::Tensor> out;
  out.reserve(addresses.size());
  for (size_t i = 0; i < addresses.size(); ++i)
    out.push_back(view_at(addresses[i], types[i], device, op, what, i));
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
  Kernel(const std::string& op, nb::handle attrs, const TypeList& inputs, const std::string& device)
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

  // Runs on `stream` (a cudaStream_t as an integer; 0 is CUDA's legacy default stream, or
  // the CPU) over the caller's memory: the data pointers of dense tensors of input_types(),
  // output_types() (written) and the state specs (updated in place; none given: the op's
  // initial states, which the kernel keeps). Returns at once on CUDA; what a kernel records
  // on the device is raised by check_device_errors.
  void run(const std::vector<uintptr_t>& inputs, const std::vector<uintptr_t>& outputs,
           const std::vector<uintptr_t>& states, bool training, uintptr_t stream) const {
    const std::string& op = prepared_.def().name;
    // First the context: it installs the device's allocator.
    qg::DeviceContext& context = stream_context(device_, stream);
    std::vector<qg::Tensor> in = views(inputs, prepared_.input_types(), device_, op, "input");
    std::vector<qg::Tensor> out = views(outputs, prepared_.output_types(), device_, op, "output");
    std::vector<qg::TensorType> state_types;
    for (const qg::StateSpec& s : prepared_.state_specs()) state_types.push_back(s.type);
    std::vector<qg::Tensor> st = states.empty() && !state_types.empty()
                                     ? initial_states()
                                     : views(states, state_types, device_, op, "state");
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
           "Runs over the data pointers of dense tensors of the prepared input, output and "
           "state types, on `stream` (a cudaStream_t as an integer; 0: the legacy default "
           "stream, or the CPU); returns without waiting for the device.");
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
