// A fixture of the layering test: an ops header that reaches up into runtime.
#pragma once

#include "core/tensor.h"
#include "runtime/executor.h"
