#include "device/cuda/cublas_api.h"

#include <dlfcn.h>

#include <string>

#include "core/error.h"

namespace qg::cuda {
namespace {

// The soname first (the loader's search path, the program's RUNPATH), then the library CMake
// found when this was configured.
void* open_cublas() {
  const std::string soname = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
  std::string tried = soname + ": ";
  if (void* h = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  tried += dlerror();
#ifdef QG_CUBLAS_LIBRARY
  if (void* h = dlopen(QG_CUBLAS_LIBRARY, RTLD_NOW | RTLD_LOCAL)) return h;
  tried += std::string("; ") + QG_CUBLAS_LIBRARY + ": " + dlerror();
#endif
  QG_FAIL("cublas", "cannot open cuBLAS (", tried, ")");
}

template <typename Fn>
void resolve(void* library, const char* name, Fn& fn) {
  fn = reinterpret_cast<Fn>(dlsym(library, name));
  QG_CHECK(fn != nullptr, "cublas", "the cuBLAS library has no ", name);
}

CublasApi load() {
  void* library = open_cublas();  // kept open for the life of the process
  CublasApi api{};
  resolve(library, "cublasCreate_v2", api.Create);
  resolve(library, "cublasDestroy_v2", api.Destroy);
  resolve(library, "cublasSetStream_v2", api.SetStream);
  resolve(library, "cublasSetMathMode", api.SetMathMode);
  resolve(library, "cublasGetStatusString", api.GetStatusString);
  resolve(library, "cublasGemmEx", api.GemmEx);
  resolve(library, "cublasDgemm_v2", api.Dgemm);
  resolve(library, "cublasSgemmStridedBatched", api.SgemmStridedBatched);
  resolve(library, "cublasDgemmStridedBatched", api.DgemmStridedBatched);
  resolve(library, "cublasGemmStridedBatchedEx", api.GemmStridedBatchedEx);
  return api;
}

}  // namespace

const CublasApi& cublas_api() {
  static const CublasApi api = load();
  return api;
}

}  // namespace qg::cuda
