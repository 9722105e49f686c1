// `qat crosscheck` cases of the integer GEMM: ragged M and N around the CUDA kernel's tiles,
// every group size the language-model recipes use and per channel, int4 and int8 weight codes,
// each output dtype. Compared bit for bit: both backends run int8_matmul_math.h's steps.
#include "ops/common/crosscheck_inputs.h"

namespace qg {

using namespace crosscheck_spec;

namespace {

// a [m, k] codes over the full int8 range with per-row qparams, w [n, k] codes in
// [-wmax - 1, wmax] with one scale per group of `group` (0: per channel).
std::vector<GradcheckInput> operands(int64_t m, int64_t n, int64_t k, int64_t group, int wmax) {
  const int64_t groups = group == 0 ? 1 : k / group;
  return {fixed({m, k}, DType::i8, -128, 127), fixed({m}, DType::f32, 1e-3, 0.1),
          fixed({m}, DType::i32, -128, 127), fixed({n, k}, DType::i8, -wmax - 1, wmax),
          fixed({n, groups}, DType::f32, 1e-3, 0.2)};
}

}  // namespace

void add_int8_matmul_crosscheck(OpRegistry& r) {
  set_cases(r, "int8_matmul", [] {
    return std::vector<CrosscheckCase>{{"[7,64] x [5,64] int4 g32 bf16",
                                        operands(7, 5, 64, 32, 7),
                                        {{"group_size", 32}, {"out_dtype", std::string("bf16")}},
                                        false,
                                        0,
                                        1,
                                        true},
                                       {"[130,96] x [129,96] int8 per channel f32",
                                        operands(130, 129, 96, 0, 127),
                                        {{"out_dtype", std::string("f32")}},
                                        false,
                                        0,
                                        1,
                                        true},
                                       {"[65,256] x [257,256] int4 g128 f16",
                                        operands(65, 257, 256, 128, 7),
                                        {{"group_size", 128}, {"out_dtype", std::string("f16")}},
                                        false,
                                        0,
                                        1,
                                        true},
                                       {"[300,512] x [40,512] int4 g256 bf16",
                                        operands(300, 40, 512, 256, 7),
                                        {{"group_size", 256}, {"out_dtype", std::string("bf16")}},
                                        false,
                                        0,
                                        1,
                                        true},
                                       {"[129,2816] x [33,2816] int8 per channel bf16",
                                        operands(129, 33, 2816, 0, 127),
                                        {{"out_dtype", std::string("bf16")}},
                                        false,
                                        0,
                                        1,
                                        true}};
  });
  set_cases(r, "int8_matmul_ste", [] {
    std::vector<GradcheckInput> in = {x_in({33, 64}), x_in({17, 64})};
    for (GradcheckInput& c : operands(33, 17, 64, 64, 7)) in.push_back(c);
    return std::vector<CrosscheckCase>{{"[33,64] x [17,64] int4 g64", in, {{"group_size", 64}}}};
  });
}

}  // namespace qg
