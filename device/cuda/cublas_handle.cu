#include "device/cuda/cublas_handle.h"

#include "device/cuda/cuda_context.h"

namespace qg::cuda {

cublasHandle_t cublas_handle(DeviceContext& context) {
  void* h = context.library_handle(
      LibraryHandle::cublas,
      [](DeviceContext& c) -> void* {
        cublasHandle_t created;
        QG_CUBLAS_CHECK("cublas", cublas_api().Create(&created));
        // Pedantic until a caller asks for more: no reduced-precision shortcut reaches f32.
        QG_CUBLAS_CHECK("cublas", cublas_api().SetMathMode(created, CUBLAS_PEDANTIC_MATH));
        QG_CUBLAS_CHECK("cublas", cublas_api().SetStream(created, cuda_stream(c)));
        return created;
      },
      [](void* handle) { (void)cublas_api().Destroy(static_cast<cublasHandle_t>(handle)); });
  return static_cast<cublasHandle_t>(h);
}

}  // namespace qg::cuda
