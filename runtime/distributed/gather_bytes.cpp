#include "runtime/distributed/gather_bytes.h"

#include <algorithm>
#include <cstdint>

#include "core/allocator.h"
#include "core/error.h"
#include "core/tensor.h"

namespace qg::dist {

std::vector<std::string> all_gather_bytes(Communicator& comm, const std::string& mine,
                                          Device device) {
  QG_CHECK(comm.memory() == device.type, "all_gather_bytes", "the ", comm.backend(),
           " communicator takes ", device_type_name(comm.memory()), " buffers, not ", device.str());
  const int n = comm.world_size();
  const Device host = Device::cpu();
  // 1. the lengths, so every rank can size one padded slot per rank.
  const int64_t length = static_cast<int64_t>(mine.size());
  Tensor one = Tensor::empty({1}, DType::i64, device);
  Tensor all_lengths = Tensor::empty({n}, DType::i64, device);
  copy_bytes(one.raw_data(), device, &length, host, sizeof length);
  comm.all_gather(one.raw_data(), all_lengths.raw_data(), sizeof length);
  std::vector<int64_t> lengths(n);
  copy_bytes(lengths.data(), host, all_lengths.raw_data(), device, n * sizeof(int64_t));
  const int64_t slot = std::max<int64_t>(*std::max_element(lengths.begin(), lengths.end()), 1);
  // 2. the bytes, each rank's in a slot of the longest one's size.
  Tensor padded = Tensor::empty({slot}, DType::u8, device);
  Tensor gathered = Tensor::empty({slot * n}, DType::u8, device);
  copy_bytes(padded.raw_data(), device, mine.data(), host, mine.size());
  comm.all_gather(padded.raw_data(), gathered.raw_data(), slot);
  std::string all(static_cast<size_t>(slot * n), '\0');
  copy_bytes(all.data(), host, gathered.raw_data(), device, all.size());
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r) {
    QG_CHECK(lengths[r] >= 0 && lengths[r] <= slot, "all_gather_bytes", "rank ", r, " sent ",
             lengths[r], " bytes");
    out.push_back(all.substr(static_cast<size_t>(r * slot), static_cast<size_t>(lengths[r])));
  }
  return out;
}

void all_reduce_host(Communicator& comm, double* values, int64_t count, ReduceOp op,
                     Device device) {
  QG_CHECK(comm.memory() == device.type, "all_reduce_host", "the ", comm.backend(),
           " communicator takes ", device_type_name(comm.memory()), " buffers, not ", device.str());
  if (count == 0) return;
  if (device.is_cpu()) {
    comm.all_reduce(values, count, DType::f64, op);
    return;
  }
  const Device host = Device::cpu();
  const size_t bytes = static_cast<size_t>(count) * sizeof(double);
  Tensor buffer = Tensor::empty({count}, DType::f64, device);
  copy_bytes(buffer.raw_data(), device, values, host, bytes);
  comm.all_reduce(buffer.raw_data(), count, DType::f64, op);  // no stream: done on return
  copy_bytes(values, host, buffer.raw_data(), device, bytes);
}

}  // namespace qg::dist
