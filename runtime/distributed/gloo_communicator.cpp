// The Gloo backend: collectives over TCP between the ranks' CPU buffers. Compiled only when
// CMake found Gloo (Debian's libgloo-dev); its rendezvous store is our TcpStoreClient behind
// Gloo's Store interface, as Debian's Gloo has no TCP store of its own.
#ifdef QG_WITH_GLOO
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include "core/error.h"
#include "core/half.h"
#include "core/half_bits.h"
#include "runtime/distributed/backends.h"

namespace qg::dist {
namespace {

// Gloo's Store over ours; keys are prefixed so that Gloo's own ("rank_0", ...) cannot meet
// ours.
class GlooStore final : public gloo::rendezvous::Store {
 public:
  GlooStore(TcpStoreClient& store, std::chrono::milliseconds timeout)
      : store_(store), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set("gloo/" + key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    std::string v = store_.get("gloo/" + key, timeout_);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& t) override {
    std::vector<std::string> ours;
    for (const std::string& k : keys) ours.push_back("gloo/" + k);
    store_.wait(ours, t);
  }

 private:
  TcpStoreClient& store_;
  std::chrono::milliseconds timeout_;
};

template <typename T>
gloo::AllreduceOptions::Func reduce_fn(ReduceOp op) {
  switch (op) {
    case ReduceOp::min:
      return [](void* c, const void* a, const void* b, size_t n) { gloo::min<T>(c, a, b, n); };
    case ReduceOp::max:
      return [](void* c, const void* a, const void* b, size_t n) { gloo::max<T>(c, a, b, n); };
    default:
      return [](void* c, const void* a, const void* b, size_t n) { gloo::sum<T>(c, a, b, n); };
  }
}

// bf16 and f16 (bit patterns in uint16_t): each partial result is computed in f32 and rounded
// to the 16-bit type, as NCCL reduces them, so a bf16 gradient bucket is reduced alike on
// both backends (for 2 ranks exactly alike: one addition). min/max compare the f32 values.
template <bool kBf16>
float widen16(uint16_t h) {
  return kBf16 ? half_bits::bf16_to_f32(h) : half_bits::f16_to_f32(h);
}
template <bool kBf16>
uint16_t narrow16(float v) {
  return kBf16 ? half_bits::f32_to_bf16(v) : half_bits::f32_to_f16(v);
}

template <bool kBf16>
gloo::AllreduceOptions::Func reduce_fn16(ReduceOp op) {
  return [op](void* c, const void* a, const void* b, size_t n) {
    auto* out = static_cast<uint16_t*>(c);
    const auto* x = static_cast<const uint16_t*>(a);
    const auto* y = static_cast<const uint16_t*>(b);
    for (size_t i = 0; i < n; ++i) {
      const float u = widen16<kBf16>(x[i]), v = widen16<kBf16>(y[i]);
      if (op == ReduceOp::min)
        out[i] = v < u ? y[i] : x[i];
      else if (op == ReduceOp::max)
        out[i] = v > u ? y[i] : x[i];
      else
        out[i] = narrow16<kBf16>(u + v);
    }
  };
}

template <bool kBf16>
void divide16(void* data, int64_t n, int by) {
  auto* p = static_cast<uint16_t*>(data);
  for (int64_t i = 0; i < n; ++i)
    p[i] = narrow16<kBf16>(widen16<kBf16>(p[i]) / static_cast<float>(by));
}

template <typename T>
void divide(void* data, int64_t n, int by) {
  T* p = static_cast<T*>(data);
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(p[i] / static_cast<T>(by));
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(int rank, int size, TcpStoreClient& store, const std::string& hostname,
                   std::chrono::milliseconds timeout, FailureReports reports)
      : reports_(std::move(reports)) {
    gloo::transport::tcp::attr attr;
    attr.hostname = hostname;
    try {
      auto device = gloo::transport::tcp::CreateDevice(attr);
      auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
      ctx->setTimeout(timeout);
      GlooStore gstore(store, timeout);
      ctx->connectFullMesh(gstore, device);
      // connectFullMesh returns once this rank's own pairs are up, while a peer may not yet
      // have accepted the connection this rank made to it. A rank that went on and exited
      // (closing its sockets) before that would make the peer's connectFullMesh fail with
      // "Connection closed by peer". After this barrier every rank's mesh is complete.
      gloo::BarrierOptions barrier(ctx);
      barrier.setTimeout(timeout);
      gloo::barrier(barrier);
      context_ = ctx;
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      QG_FAIL("gloo", "rank ", rank, " of ", size, " could not connect to its peers: ", e.what());
    }
  }

  int rank() const override { return context_->rank; }
  int world_size() const override { return context_->size; }
  std::string backend() const override { return "gloo"; }
  DeviceType memory() const override { return DeviceType::cpu; }

  void all_reduce(void* data, int64_t count, DType dtype, ReduceOp op, void*) override {
    if (count == 0) return;
    if (dtype == DType::bf16 || dtype == DType::f16) return all_reduce16(data, count, dtype, op);
    guarded("all_reduce", [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setTimeout(context_->getTimeout());
      dispatch(dtype, "all_reduce", [&](auto tag) {
        using T = decltype(tag);
        opts.setOutput(static_cast<T*>(data), static_cast<size_t>(count));
        opts.setReduceFunction(reduce_fn<T>(op));
      });
      gloo::allreduce(opts);
    });
    if (op == ReduceOp::avg && world_size() > 1)
      dispatch(dtype, "all_reduce", [&](auto tag) {
        using T = decltype(tag);
        divide<T>(data, count, world_size());
      });
  }

  void broadcast(void* data, int64_t bytes, int root, void*) override {
    QG_CHECK(root >= 0 && root < world_size(), "broadcast", "root ", root, " is outside [0, ",
             world_size(), ")");
    if (bytes == 0) return;
    guarded("broadcast", [&] {
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(static_cast<char*>(data), static_cast<size_t>(bytes));
      opts.setRoot(root);
      gloo::broadcast(opts);
    });
  }

  void all_gather(const void* in, void* out, int64_t bytes, void*) override {
    if (bytes == 0) return;
    guarded("all_gather", [&] {
      gloo::AllgatherOptions opts(context_);
      opts.setInput(const_cast<char*>(static_cast<const char*>(in)), static_cast<size_t>(bytes));
      opts.setOutput(static_cast<char*>(out), static_cast<size_t>(bytes) * world_size());
      gloo::allgather(opts);
    });
  }

  void barrier() override {
    guarded("barrier", [&] {
      gloo::BarrierOptions opts(context_);
      gloo::barrier(opts);
    });
  }

  void set_timeout(std::chrono::milliseconds timeout) override { context_->setTimeout(timeout); }
  std::chrono::milliseconds timeout() const override { return context_->getTimeout(); }

 private:
  void all_reduce16(void* data, int64_t count, DType dtype, ReduceOp op) {
    const bool bf16 = dtype == DType::bf16;
    guarded("all_reduce", [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setTimeout(context_->getTimeout());
      opts.setOutput(static_cast<uint16_t*>(data), static_cast<size_t>(count));
      opts.setReduceFunction(bf16 ? reduce_fn16<true>(op) : reduce_fn16<false>(op));
      gloo::allreduce(opts);
    });
    if (op == ReduceOp::avg && world_size() > 1) {
      if (bf16)
        divide16<true>(data, count, world_size());
      else
        divide16<false>(data, count, world_size());
    }
  }

  // The element types the reductions take besides bf16/f16 (all_reduce16).
  template <typename Fn>
  static void dispatch(DType dtype, const char* op, Fn&& fn) {
    switch (dtype) {
      case DType::f32:
        return fn(float{});
      case DType::f64:
        return fn(double{});
      case DType::i32:
        return fn(int32_t{});
      case DType::i64:
        return fn(int64_t{});
      case DType::u8:
        return fn(uint8_t{});
      default:
        QG_FAIL(op, "Gloo backend: no reduction for dtype ", dtype_name(dtype));
    }
  }

  // Runs one collective; a Gloo failure (timeout, a peer gone) becomes a qg::Error naming
  // this rank, the collective and what the other ranks reported.
  template <typename Fn>
  void guarded(const char* op, Fn&& fn) {
    try {
      fn();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      std::string why = reports_ ? reports_() : std::string();
      QG_FAIL(op, "rank ", rank(), " of ", world_size(), ": the collective failed (", e.what(),
              "); ", why.empty() ? "no rank reported a failure: a peer died or is stuck" : why);
    }
  }

  std::shared_ptr<gloo::Context> context_;
  FailureReports reports_;
};

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(int rank, int size, TcpStoreClient& store,
                                                     const std::string& hostname,
                                                     std::chrono::milliseconds timeout,
                                                     FailureReports reports) {
  return std::make_unique<GlooCommunicator>(rank, size, store, hostname, timeout,
                                            std::move(reports));
}

}  // namespace qg::dist
#endif  // QG_WITH_GLOO
