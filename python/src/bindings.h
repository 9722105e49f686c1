// One function per binding file; module.cpp calls them in order. A new area (weight import,
// ONNX export) adds its bind_*.cpp file here and a call in module.cpp, and its Python side
// registers with qatgraph.io (see python/qatgraph/io.py).
#pragma once

#include <nanobind/nanobind.h>

namespace qgpy {

namespace nb = nanobind;

void bind_graph(nb::module_& m);     // Graph, grad, ops, op_info, run_op
void bind_runtime(nb::module_& m);   // Executor, cuda_available
void bind_nn(nb::module_& m);        // the nn submodule: QConfig, Builder, models, Trainer
void bind_compile(nb::module_& nn);  // nn.compile, nn.CompiledStep (called by bind_nn)
void bind_io(nb::module_& m);        // safetensors, npy, checkpoints
void bind_import(nb::module_& m);    // nn.import_weights (after bind_nn: adds to nn)
void bind_kernel(nb::module_& m);    // Kernel: one op on caller-owned tensors and stream
void bind_onnx(nb::module_& m);      // ONNX export (raises without QG_WITH_ONNX)

}  // namespace qgpy
