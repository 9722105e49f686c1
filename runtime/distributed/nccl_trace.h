// QG_NCCL_TRACE=<file>: a timeline of the NCCL backend's gradient all-reduces, to see how much
// of each one the compute stream hides. Marks, each a CUDA event:
//   i  an all-reduce issued (recorded on the compute stream)
//   s  it starts, e  it ends (on the communication stream)
//   w  the compute stream reaches a wait for a bucket, r  it resumes after the wait
// Rank 0 writes one line "mark,elements,ms,status" per mark (ms since the first mark) once
// kMarks are taken, or when the communicator goes. The events are timed from the host, so
// this needs steps launched kernel by kernel (QG_CUDA_GRAPH=0): a captured event cannot be.
// docs/DISTRIBUTED.md shows what it found on two H100s.
#pragma once
#ifdef QG_WITH_NCCL
#include <cuda_runtime.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace qg::dist {

class CollectiveTrace {
 public:
  static constexpr size_t kMarks = 2000;

  // Opens the file on rank 0 (a qg::Error naming it when it cannot be written); off when
  // QG_NCCL_TRACE is unset or empty.
  explicit CollectiveTrace(int rank) {
    const char* path = std::getenv("QG_NCCL_TRACE");
    if (path == nullptr || *path == '\0') return;
    on_ = true;
    if (rank != 0) return;
    file_ = std::fopen(path, "w");
    QG_CHECK(file_ != nullptr, "nccl", "QG_NCCL_TRACE: cannot write '", path,
             "': ", std::strerror(errno));
  }
  ~CollectiveTrace() { write(); }
  CollectiveTrace(const CollectiveTrace&) = delete;
  CollectiveTrace& operator=(const CollectiveTrace&) = delete;

  void mark(char kind, int64_t elements, cudaStream_t stream) {
    if (!on_ || marks_.size() >= kMarks) return;
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    QG_CHECK(cudaStreamIsCapturing(stream, &capturing) == cudaSuccess &&
                 capturing == cudaStreamCaptureStatusNone,
             "nccl",
             "QG_NCCL_TRACE times steps launched kernel by kernel: set QG_CUDA_GRAPH=0 "
             "(a collective was issued during a CUDA graph capture)");
    cudaEvent_t e;
    QG_CHECK(cudaEventCreate(&e) == cudaSuccess, "nccl", "QG_NCCL_TRACE: cudaEventCreate failed");
    QG_CHECK(cudaEventRecord(e, stream) == cudaSuccess, "nccl",
             "QG_NCCL_TRACE: cudaEventRecord failed");
    marks_.push_back({kind, elements, e});
    if (marks_.size() == kMarks) write();
  }

  // Waits for the device, writes the marks (rank 0) and frees their events; once.
  void write() {
    if (!on_ || marks_.empty()) return;
    on_ = false;
    (void)cudaDeviceSynchronize();
    for (const Mark& m : marks_) {
      float ms = 0;
      const cudaError_t r = cudaEventElapsedTime(&ms, marks_.front().at, m.at);
      if (file_ != nullptr)
        std::fprintf(file_, "%c,%lld,%.4f,%s\n", m.kind, static_cast<long long>(m.elements), ms,
                     cudaGetErrorName(r));
    }
    // Destroyed only after every time is read: each is measured from the first mark.
    for (const Mark& m : marks_) (void)cudaEventDestroy(m.at);
    marks_.clear();
    if (file_ != nullptr) std::fclose(file_);
    file_ = nullptr;
  }

 private:
  struct Mark {
    char kind;
    int64_t elements;
    cudaEvent_t at;
  };
  bool on_ = false;
  FILE* file_ = nullptr;
  std::vector<Mark> marks_;
};

}  // namespace qg::dist
#endif  // QG_WITH_NCCL
