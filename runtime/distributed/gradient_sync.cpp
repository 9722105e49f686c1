#include "runtime/distributed/gradient_sync.h"

#include "core/error.h"
#include "core/graph.h"

namespace qg::dist {

namespace {

bool is_float(DType d) {
  return d == DType::f32 || d == DType::f64 || d == DType::bf16 || d == DType::f16;
}

}  // namespace

GradientSync bucketed_all_reduce(int64_t bucket_bytes, DType reduce_dtype) {
  QG_CHECK(bucket_bytes > 0, "gradient_sync", "bucket size ", bucket_bytes, " bytes");
  QG_CHECK(is_float(reduce_dtype), "gradient_sync", "reduce dtype ", dtype_name(reduce_dtype),
           ": gradients are reduced in f32, f64, bf16 or f16");
  return [bucket_bytes, reduce_dtype](Graph& g, const std::vector<ValueId>& grads) {
    std::vector<ValueId> out(grads);
    // The dtype a gradient travels in: the reduce dtype for floating-point gradients.
    auto wire = [&](ValueId v) {
      const DType d = g.value(v).type.dtype;
      return is_float(d) ? reduce_dtype : d;
    };
    // 1. Buckets: consecutive gradients in reverse order, one dtype each, up to the size cap
    //    (a gradient larger than the cap gets a bucket of its own).
    std::vector<std::vector<size_t>> buckets;
    int64_t filled = 0;
    DType dtype = DType::f32;
    for (size_t k = grads.size(); k-- > 0;) {
      if (grads[k] == kNoValue) continue;
      const DType d = wire(grads[k]);
      const int64_t bytes = g.value(grads[k]).type.numel() * static_cast<int64_t>(dtype_size(d));
      if (buckets.empty() || d != dtype || filled + bytes > bucket_bytes) {
        buckets.emplace_back();
        filled = 0;
        dtype = d;
      }
      buckets.back().push_back(k);
      filled += bytes;
    }
    // A gradient as it enters its bucket, and as the optimizer reads it back.
    auto to_wire = [&](ValueId v) {
      const DType d = wire(v);
      return d == g.value(v).type.dtype
                 ? v
                 : g.apply1("cast", {v}, {{"dtype", std::string(dtype_name(d))}});
    };
    // 2. Each bucket: pack, all-reduce (avg), unpack.
    int index = 0;
    for (const std::vector<size_t>& b : buckets) {
      // Each gradient on a 512-byte boundary (the planner's alignment): the optimizer reads it
      // through a view (bucket_get), and vectorised kernels expect aligned tensors. The gaps
      // are reduced with the rest and never read.
      const int64_t align = 512 / static_cast<int64_t>(dtype_size(wire(grads[b[0]])));
      int64_t size = 0;
      std::vector<int64_t> offsets;
      for (size_t k : b) {
        size = (size + align - 1) / align * align;
        offsets.push_back(size);
        size += g.value(grads[k]).type.numel();
      }
      if (size == 0) continue;
      ValueId bucket =
          g.apply1("bucket_begin", {to_wire(grads[b[0]])}, {{"size", size}, {"offset", 0}});
      for (size_t i = 1; i < b.size(); ++i)
        bucket = g.apply1("bucket_put", {bucket, to_wire(grads[b[i]])}, {{"offset", offsets[i]}});
      ValueId reduced = g.apply1("bucket_all_reduce", {bucket}, {{"op", std::string("avg")}});
      g.set_name(reduced, "gradient_sync.bucket" + std::to_string(index++));
      for (size_t i = 0; i < b.size(); ++i) {
        const TensorType t = g.value(grads[b[i]]).type;  // a copy: apply1 grows the values
        ValueId avg =
            g.apply1("bucket_get", {reduced}, {{"offset", offsets[i]}, {"shape", t.shape}});
        if (g.value(avg).type.dtype != t.dtype)
          avg = g.apply1("cast", {avg}, {{"dtype", std::string(dtype_name(t.dtype))}});
        out[b[i]] = avg;
      }
    }
    return out;
  };
}

}  // namespace qg::dist
