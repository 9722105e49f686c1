#include "runtime/distributed/gradient_sync.h"

#include "core/error.h"
#include "core/graph.h"

namespace qg::dist {

GradientSync bucketed_all_reduce(int64_t bucket_bytes) {
  QG_CHECK(bucket_bytes > 0, "gradient_sync", "bucket size ", bucket_bytes, " bytes");
  return [bucket_bytes](Graph& g, const std::vector<ValueId>& grads) {
    std::vector<ValueId> out(grads);
    // 1. Buckets: consecutive gradients in reverse order, one dtype each, up to the size cap
    //    (a gradient larger than the cap gets a bucket of its own).
    std::vector<std::vector<size_t>> buckets;
    int64_t filled = 0;
    DType dtype = DType::f32;
    for (size_t k = grads.size(); k-- > 0;) {
      if (grads[k] == kNoValue) continue;
      const TensorType& t = g.value(grads[k]).type;
      const int64_t bytes = t.numel() * static_cast<int64_t>(dtype_size(t.dtype));
      if (buckets.empty() || t.dtype != dtype || filled + bytes > bucket_bytes) {
        buckets.emplace_back();
        filled = 0;
        dtype = t.dtype;
      }
      buckets.back().push_back(k);
      filled += bytes;
    }
    // 2. Each bucket: pack, all-reduce (avg), unpack.
    int index = 0;
    for (const std::vector<size_t>& b : buckets) {
      int64_t size = 0;
      std::vector<int64_t> offsets;
      for (size_t k : b) {
        offsets.push_back(size);
        size += g.value(grads[k]).type.numel();
      }
      if (size == 0) continue;
      ValueId bucket = g.apply1("bucket_begin", {grads[b[0]]}, {{"size", size}, {"offset", 0}});
      for (size_t i = 1; i < b.size(); ++i)
        bucket = g.apply1("bucket_put", {bucket, grads[b[i]]}, {{"offset", offsets[i]}});
      ValueId reduced = g.apply1("all_reduce", {bucket}, {{"op", std::string("avg")}});
      g.set_name(reduced, "gradient_sync.bucket" + std::to_string(index++));
      for (size_t i = 0; i < b.size(); ++i) {
        const TensorType& t = g.value(grads[b[i]]).type;
        out[b[i]] = g.apply1("bucket_get", {reduced}, {{"offset", offsets[i]}, {"shape", t.shape}});
      }
    }
    return out;
  };
}

}  // namespace qg::dist
