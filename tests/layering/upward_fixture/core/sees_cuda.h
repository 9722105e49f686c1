// A fixture of the layering test: core must not see CUDA.
#pragma once

#include <cuda_runtime.h>
