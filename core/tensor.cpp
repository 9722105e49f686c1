#include "core/tensor.h"

#include <cmath>
#include <cstring>
#include <sstream>

#include "core/half.h"
#include "core/strided_layout.h"

namespace qg {

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (int i = static_cast<int>(s.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

Storage::Storage(size_t bytes, Device device) : bytes_(bytes), device_(device) {
  allocator_ = &allocator_for(device);
  data_ = allocator_->allocate(bytes);
}

Storage::Storage(void* data, size_t bytes, Device device, std::shared_ptr<void> owner)
    : data_(data), bytes_(bytes), device_(device), owner_(std::move(owner)) {}

Storage::~Storage() {
  if (data_ != nullptr && allocator_ != nullptr) allocator_->deallocate(data_, bytes_);
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape) {
    QG_CHECK(d >= 0, "tensor", "negative dimension in shape ", shape_str(shape));
  }
  Tensor t;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.numel_ = shape_numel(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  t.storage_ = std::make_shared<Storage>(t.nbytes(), device);
  return t;
}

Tensor Tensor::from_external(void* data, const Shape& shape, DType dtype, Device device,
                             std::shared_ptr<void> owner) {
  Tensor t;
  for (int64_t d : shape) {
    QG_CHECK(d >= 0, "tensor", "negative dimension in shape ", shape_str(shape));
  }
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.numel_ = shape_numel(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  QG_CHECK(data != nullptr || t.numel_ == 0, "tensor", "from_external: null data for ", t.numel_,
           " elements");
  t.storage_ = std::make_shared<Storage>(data, t.nbytes(), device, std::move(owner));
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor host = empty(shape, dtype);
  if (host.nbytes() > 0) std::memset(host.raw_data(), 0, host.nbytes());
  return device.is_cpu() ? host : host.to(device);
}

Tensor Tensor::from_doubles(const Shape& shape, const std::vector<double>& values, DType dtype) {
  Tensor t = empty(shape, dtype);
  QG_CHECK(static_cast<int64_t>(values.size()) == t.numel(), "tensor", "shape ", shape_str(shape),
           " needs ", t.numel(), " values, got ", values.size());
  dispatch_any(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(t.raw_data());
    for (size_t i = 0; i < values.size(); ++i) p[i] = static_cast<T>(values[i]);
  });
  return t;
}

int64_t Tensor::size(int axis) const {
  int d = dim();
  int a = axis < 0 ? axis + d : axis;
  QG_CHECK(a >= 0 && a < d, "tensor", "axis ", axis, " is out of range for a tensor of rank ", d);
  return shape_[a];
}

bool Tensor::is_contiguous() const {
  return strides_ == contiguous_strides(shape_);
}

void* Tensor::raw_data() const {
  if (!storage_ || storage_->data() == nullptr) return nullptr;
  return static_cast<char*>(storage_->data()) + offset_bytes_;
}

Tensor Tensor::reshape(const Shape& shape) const {
  QG_CHECK(defined(), "reshape", "reshape of an undefined tensor");
  QG_CHECK(is_contiguous(), "reshape", "reshape needs a contiguous tensor");
  QG_CHECK(shape_numel(shape) == numel_, "reshape", "cannot reshape ", shape_str(shape_), " (",
           numel_, " elements) to ", shape_str(shape), " (", shape_numel(shape), " elements)");
  Tensor t = *this;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  return t;
}

Tensor Tensor::view(int64_t byte_offset, const Shape& shape, DType dtype) const {
  QG_CHECK(defined(), "tensor", "view of an undefined tensor");
  for (int64_t d : shape)
    QG_CHECK(d >= 0, "tensor", "view: negative dimension in shape ", shape_str(shape));
  int64_t bytes = shape_numel(shape) * static_cast<int64_t>(dtype_size(dtype));
  int64_t start = offset_bytes_ + byte_offset;
  QG_CHECK(byte_offset >= 0 && start + bytes <= static_cast<int64_t>(storage_->bytes()), "tensor",
           "view of ", bytes, " bytes at offset ", byte_offset, " reaches past the ",
           storage_->bytes(), "-byte storage (tensor starts at byte ", offset_bytes_, ")");
  Tensor t = *this;
  t.offset_bytes_ = start;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.numel_ = shape_numel(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::as_strided(const Shape& shape, const Shape& strides, int64_t offset) const {
  QG_CHECK(defined(), "tensor", "as_strided of an undefined tensor");
  QG_CHECK(shape.size() == strides.size(), "tensor", "as_strided: shape ", shape_str(shape),
           " and strides ", shape_str(strides), " differ in rank");
  QG_CHECK(offset >= 0, "tensor", "as_strided: negative offset ", offset);
  int64_t last = offset;  // the furthest element the view reaches
  for (size_t d = 0; d < shape.size(); ++d) {
    QG_CHECK(shape[d] >= 0 && strides[d] >= 0, "tensor", "as_strided: negative size or stride in ",
             shape_str(shape), " / ", shape_str(strides));
    if (shape[d] > 0) last += (shape[d] - 1) * strides[d];
  }
  const int64_t es = static_cast<int64_t>(dtype_size(dtype_));
  const int64_t start = offset_bytes_ + offset * es;
  QG_CHECK(shape_numel(shape) == 0 ||
               start + (last - offset + 1) * es <= static_cast<int64_t>(storage_->bytes()),
           "tensor", "as_strided: shape ", shape_str(shape), " with strides ", shape_str(strides),
           " at element ", offset, " reaches past the ", storage_->bytes(), "-byte storage");
  Tensor t = *this;
  t.offset_bytes_ = start;
  t.shape_ = shape;
  t.strides_ = strides;
  t.numel_ = shape_numel(shape);
  return t;
}

Tensor Tensor::to(Device device) const {
  QG_CHECK(defined(), "tensor", "copy of an undefined tensor");
  QG_CHECK(is_contiguous(), "tensor", "copy of a non-contiguous tensor");
  Tensor t = empty(shape_, dtype_, device);
  copy_bytes(t.raw_data(), device, raw_data(), device_, nbytes());
  return t;
}

Tensor Tensor::cast(DType dtype) const {
  QG_CHECK(device_.is_cpu(), "cast", "cast runs on CPU tensors; got one on ", device_.str());
  QG_CHECK(is_contiguous(), "cast", "cast of a strided view (the op `cast` reads strides)");
  Tensor out = empty(shape_, dtype);
  dispatch_any(dtype_, [&](auto src_tag) {
    using S = decltype(src_tag);
    const S* src = static_cast<const S*>(raw_data());
    dispatch_any(dtype, [&](auto dst_tag) {
      using D = decltype(dst_tag);
      D* dst = static_cast<D*>(out.raw_data());
      for (int64_t i = 0; i < numel_; ++i) {
        if constexpr (std::is_same_v<S, f16> || std::is_same_v<S, bf16>) {
          dst[i] = static_cast<D>(static_cast<float>(src[i]));
        } else {
          dst[i] = static_cast<D>(src[i]);
        }
      }
    });
  });
  return out;
}

double Tensor::at(int64_t i) const {
  QG_CHECK(device_.is_cpu(), "tensor", "at() needs a CPU tensor; got one on ", device_.str());
  QG_CHECK(i >= 0 && i < numel_, "tensor", "index ", i, " out of range for ", numel_, " elements");
  if (!is_contiguous()) i = strided_layout("tensor", *this).offset(i);  // a strided view
  return dispatch_any(dtype_, [&](auto tag) {
    using T = decltype(tag);
    return static_cast<double>(static_cast<const T*>(raw_data())[i]);
  });
}

std::vector<double> Tensor::to_doubles() const {
  Tensor host = device_.is_cpu() ? *this : to(Device::cpu());
  std::vector<double> v(static_cast<size_t>(numel_));
  for (int64_t i = 0; i < numel_; ++i) v[i] = host.at(i);
  return v;
}

void Tensor::fill(double value) {
  QG_CHECK(device_.is_cpu(), "tensor", "fill() needs a CPU tensor; got one on ", device_.str());
  QG_CHECK(is_contiguous(), "tensor", "fill() of a strided view");
  dispatch_any(dtype_, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(raw_data());
    for (int64_t i = 0; i < numel_; ++i) p[i] = static_cast<T>(value);
  });
}

std::string Tensor::str() const {
  return std::string(dtype_name(dtype_)) + shape_str(shape_) + " on " + device_.str();
}

StridedLayout strided_layout(const std::string& op, const Tensor& t) {
  QG_CHECK(t.dim() <= kMaxStridedRank, op, "strided view of rank ", t.dim(), " (", t.str(),
           "); at most ", kMaxStridedRank, " dimensions");
  StridedLayout l;
  l.rank = t.dim();
  l.contiguous = t.is_contiguous();
  for (int d = 0; d < l.rank; ++d) {
    l.sizes[d] = t.shape()[d];
    l.strides[d] = t.strides()[d];
  }
  return l;
}

}  // namespace qg
