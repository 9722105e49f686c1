#include <cmath>
#include <limits>

#include "apps/qat/crosscheck_cases.h"

namespace qg::cli {

void add_pool_activation_dropout_cases(std::vector<CrosscheckCase>& c);  // _pool.cpp
void add_fold_cases(std::vector<CrosscheckCase>& c);                     // _fold.cpp

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

// An f64 input (takes the case dtype) drawn from [lo, hi].
GradcheckInput x_in(Shape s, double lo = -3, double hi = 3) {
  return GradcheckInput(std::move(s), DType::f64, lo, hi);
}
// A fixed-dtype input with explicit values, or drawn from [lo, hi] (integers truncate).
GradcheckInput fixed(Shape s, DType d, double lo, double hi, std::vector<double> v = {}) {
  return GradcheckInput(std::move(s), d, lo, hi, std::move(v));
}

// Halfway points of a scale-0.25 grid around zp, NaN, +/-Inf, a huge value and signed
// zeros: the rounding and clamping edges where a backend would first disagree.
std::vector<double> edge_values() {
  std::vector<double> v;
  for (int k = -40; k <= 40; k += 3) v.push_back(0.125 * k);
  for (double e : {kNaN, kInf, -kInf, 1e30, -1e30, 0.0, -0.0, 31.875, -32.125, 63.9, 1e-9})
    v.push_back(e);
  while (v.size() % 8 != 5) v.push_back(0.375);  // a partial last mask byte
  return v;
}

void add_fake_quantize(std::vector<CrosscheckCase>& c) {
  std::vector<double> e = edge_values();
  Shape es{static_cast<int64_t>(e.size())};
  c.push_back({"fake_quantize",
               "edges u8 zp 3",
               {GradcheckInput(es, DType::f64, 0, 0, e), fixed({1}, DType::f32, 0, 0, {0.25}),
                fixed({1}, DType::i32, 0, 0, {3})},
               {},
               true});
  c.push_back({"fake_quantize",
               "edges s4 f64-scale i64-zp",
               {GradcheckInput(es, DType::f64, 0, 0, e), fixed({1}, DType::f64, 0, 0, {0.25}),
                fixed({1}, DType::i64, 0, 0, {-1})},
               {{"bits", 4}, {"signed", true}},
               true});
  c.push_back(
      {"fake_quantize",
       "tensor s8 [257,1031]",
       {x_in({257, 1031}), fixed({1}, DType::f32, 0, 0, {0.02}), fixed({1}, DType::i32, 0, 0, {0})},
       {{"signed", true}},
       true});
  c.push_back(
      {"fake_quantize",
       "channel axis 0 [64,129]",
       {x_in({64, 129}), fixed({64}, DType::f32, 0.005, 0.05), fixed({64}, DType::i32, 0, 255)},
       {{"scope", "channel"}, {"axis", 0}},
       true});
  c.push_back(
      {"fake_quantize",
       "channel axis 1 [33,17,5]",
       {x_in({33, 17, 5}), fixed({17}, DType::f32, 0.005, 0.05), fixed({17}, DType::i32, -5, 5)},
       {{"scope", "channel"}, {"axis", 1}, {"signed", true}},
       true});
  c.push_back({"fake_quantize",
               "token [6,7,129]",
               {x_in({6, 7, 129}), fixed({6, 7, 1}, DType::f32, 0.01, 0.03),
                fixed({6, 7, 1}, DType::i32, 100, 150)},
               {{"scope", "token"}},
               true});
  c.push_back(
      {"fake_quantize",
       "group 32 axis -1 [9,100]",
       {x_in({9, 100}), fixed({9, 4}, DType::f32, 0.1, 0.5), fixed({9, 4}, DType::i32, 0, 0)},
       {{"scope", "group"}, {"axis", -1}, {"group_size", 32}, {"bits", 4}, {"signed", true}},
       true});
  c.push_back({"fake_quantize",
               "group 4 axis 0 [10,3,2]",
               {x_in({10, 3, 2}), fixed({3, 3, 2}, DType::f32, 0.1, 0.5),
                fixed({3, 3, 2}, DType::i32, 0, 3)},
               {{"scope", "group"}, {"axis", 0}, {"group_size", 4}, {"bits", 2}},
               true});
  c.push_back(
      {"fake_quantize",
       "bad scale (both must raise)",
       {x_in({3, 4}), fixed({1}, DType::f32, 0, 0, {-0.5}), fixed({1}, DType::i32, 0, 0, {0})},
       {},
       false});
  c.push_back({"fake_quantize",
               "bad zero point (both must raise)",
               {x_in({3, 4}), fixed({4}, DType::f32, 0, 0, {0.1, 0.1, 0.1, 0.1}),
                fixed({4}, DType::i32, 0, 0, {0, 7, 300, 1})},
               {{"scope", "channel"}, {"axis", 1}},
               false});
}

void add_observers(std::vector<CrosscheckCase>& c) {
  std::vector<double> e = edge_values();
  Shape es{static_cast<int64_t>(e.size())};
  for (const char* op : {"minmax_observer", "moving_average_observer", "percentile_observer",
                         "histogram_observer"}) {
    c.push_back({op, "tensor [257,1031]", {x_in({257, 1031}, -2, 5)}, {}});
    c.push_back({op, "tensor edges", {GradcheckInput(es, DType::f64, 0, 0, e)}, {}});
    c.push_back({op,
                 "signed zeros",
                 {GradcheckInput({6}, DType::f64, 0, 0, {-0.0, 0.0, 0.0, -0.0, 0.0, -0.0})},
                 {}});
    c.push_back({op,
                 "tensor symmetric s8 [4096,33]",
                 {x_in({4096, 33}, -1, 3)},
                 {{"qscheme", "symmetric"}, {"signed", true}}});
    c.push_back({op,
                 "channel axis 0 [64,300]",
                 {x_in({64, 300})},
                 {{"scope", "channel"}, {"axis", 0}, {"reduce_range", true}}});
    c.push_back({op,
                 "channel axis -1 [300,64] symmetric",
                 {x_in({300, 64})},
                 {{"scope", "channel"}, {"axis", -1}, {"qscheme", "symmetric"}}});
    c.push_back({op,
                 "channel axis 1 [5,3,7] edges",
                 {GradcheckInput({5, 3, 7}, DType::f64, 0, 0,
                                 [] {
                                   std::vector<double> v(105);
                                   for (int i = 0; i < 105; ++i) v[i] = 0.37 * (i % 13) - 2.0;
                                   v[4] = kNaN;
                                   v[50] = kInf;
                                   v[51] = -kInf;
                                   return v;
                                 }())},
                 {{"scope", "channel"}, {"axis", 1}}});
  }
}

// Token and group scopes of the min/max observers (a tail group included).
void add_observer_token_group(std::vector<CrosscheckCase>& c) {
  for (const char* op : {"minmax_observer", "moving_average_observer"}) {
    c.push_back({op, "token [6,7,129]", {x_in({6, 7, 129})}, {{"scope", "token"}}});
    c.push_back({op,
                 "group 32 axis -1 [9,100]",
                 {x_in({9, 100})},
                 {{"scope", "group"}, {"axis", -1}, {"group_size", 32}, {"signed", true}}});
    c.push_back({op, "delayed tensor [257,1031]", {x_in({257, 1031})}, {{"delayed", true}}});
    c.push_back({op,
                 "delayed channel 0 [64,300]",
                 {x_in({64, 300})},
                 {{"scope", "channel"}, {"axis", 0}, {"delayed", true}}});
    c.push_back({op,
                 "group 4 axis 0 [10,3,2] symmetric",
                 {x_in({10, 3, 2})},
                 {{"scope", "group"}, {"axis", 0}, {"group_size", 4}, {"qscheme", "symmetric"}}});
  }
}

void add_percentile(std::vector<CrosscheckCase>& c) {
  c.push_back({"percentile_observer",
               "affine p=90 bins 64 channel 0 [16,300]",
               {x_in({16, 300}, -1, 6)},
               {{"percentile", 90.0}, {"bins", 64}, {"scope", "channel"}, {"axis", 0}}});
  c.push_back({"percentile_observer",
               "symmetric p=99 bins 100 s8 [1000,37]",
               {x_in({1000, 37}, -5, 2)},
               {{"percentile", 99.0}, {"bins", 100}, {"qscheme", "symmetric"}, {"signed", true}}});
}

// NF4: quantize + pack (groups with a tail, both nibble orders, a leading axis, edges),
// unpack, and the double quantization of the absmax values.
void add_nf4(std::vector<CrosscheckCase>& c) {
  std::vector<double> e = edge_values();
  Shape es{static_cast<int64_t>(e.size())};
  const char* pack = "nf4_quantize_pack";
  c.push_back({pack, "g64 [33,300]", {x_in({33, 300})}, {}});
  c.push_back({pack,
               "g32 [7,101] high_first (tail group)",
               {x_in({7, 101}, -1, 4)},
               {{"group_size", 32}, {"nibble_order", "high_first"}}});
  c.push_back(
      {pack, "axis 0 g3 [10,5] (odd bytes)", {x_in({10, 5})}, {{"axis", 0}, {"group_size", 3}}});
  c.push_back({pack, "edges g8", {GradcheckInput(es, DType::f64, 0, 0, e)}, {{"group_size", 8}}});
  c.push_back({"nf4_unpack_dequantize",
               "g16 [6,35] low_first",
               {fixed({105}, DType::u8, 0, 255.99), fixed({6, 3}, DType::f32, 0.01, 2.0)},
               {{"shape", Shape{6, 35}}, {"group_size", 16}},
               false,
               0,
               2,
               true});
  c.push_back({"nf4_unpack_dequantize",
               "f64 absmax -> bf16 [4,9] high_first",
               {fixed({18}, DType::u8, 0, 255.99), fixed({4, 1}, DType::f64, 0.01, 2.0)},
               {{"shape", Shape{4, 9}},
                {"group_size", 16},
                {"nibble_order", "high_first"},
                {"dtype", "bf16"}},
               false,
               0,
               2,
               true});
  c.push_back({"nf4_double_quantize",
               "1000 absmax, blocks of 256",
               {fixed({1000}, DType::f32, 0.01, 3.0)},
               {{"block_size", 256}},
               false,
               0,
               2,
               true});
  c.push_back({"nf4_double_dequantize",
               "1000 codes, blocks of 256",
               {fixed({1000}, DType::u8, 0, 255.99), fixed({4}, DType::f32, 0.001, 0.05),
                fixed({4}, DType::f32, 0.0, 0.5)},
               {{"block_size", 256}},
               false,
               0,
               2,
               true});
}

void add_float_ops(std::vector<CrosscheckCase>& c) {
  c.push_back(
      {"add", "broadcast [129,1,67]+[33,67]", {x_in({129, 1, 67}), x_in({33, 67})}, {}, true});
  c.push_back({"mul", "same [1000003]", {x_in({1000003}), x_in({1000003})}, {}, true});
  c.push_back({"sub", "bcast [513]-[7,1]", {x_in({513}), x_in({7, 1})}, {}, true});
  c.push_back(
      {"relu",
       "edges",
       {GradcheckInput({8}, DType::f64, 0, 0, {-1, 0.0, -0.0, kNaN, kInf, -kInf, 2.5, 1e-30})},
       {},
       false});
  c.push_back({"relu", "[1031,257]", {x_in({1031, 257})}, {}, true});
  c.push_back({"sum", "all [1048579]", {x_in({1048579})}, {}, true});
  c.push_back({"sum", "axis 0 [513,1025]", {x_in({513, 1025})}, {{"axes", Shape{0}}}, true});
  c.push_back(
      {"mean", "axes (0,2) [17,300,9]", {x_in({17, 300, 9})}, {{"axes", Shape{0, 2}}}, true});
  c.push_back({"mean", "all empty [0,3]", {x_in({0, 3})}, {}, false});
  c.push_back({"matmul",
               "[129,257]@[257,65]",
               {x_in({129, 257}, -1, 1), x_in({257, 65}, -1, 1)},
               {},
               true});
  c.push_back({"matmul",
               "[257,129]^T@[65,257]^T",
               {x_in({257, 129}, -1, 1), x_in({65, 257}, -1, 1)},
               {{"transpose_a", true}, {"transpose_b", true}},
               true});
  c.push_back({"softmax_cross_entropy",
               "[300,1000]",
               {x_in({300, 1000}, -4, 4), fixed({300}, DType::i64, 0, 999.99)},
               {},
               true});
  c.push_back({"softmax_cross_entropy",
               "i32 labels sum [64,10]",
               {x_in({64, 10}, -4, 4), fixed({64}, DType::i32, 0, 9.99)},
               {{"reduction", "sum"}},
               true});
  c.push_back({"softmax_cross_entropy",
               "bad label (both must raise)",
               {x_in({3, 4}), fixed({3}, DType::i64, 0, 0, {0, 4, 1})},
               {},
               true});
}

// cast from each case dtype to every float dtype: rounding ties, subnormals, overflow and
// specials (edge_values) and a large random tensor, with the gradient cast back.
void add_cast(std::vector<CrosscheckCase>& c) {
  std::vector<double> e = edge_values();
  for (double p : {65504.0, 65520.0, 3.4e38, 0x1p-24, 0x1p-25, 0x1p-133, 1 + 0x1p-8, 1 + 0x1p-11})
    for (double sign : {1.0, -1.0}) e.push_back(sign * p);
  Shape es{static_cast<int64_t>(e.size())};
  for (const char* to : {"f32", "f64", "f16", "bf16"}) {
    c.push_back({"cast",
                 std::string("edges -> ") + to,
                 {GradcheckInput(es, DType::f64, 0, 0, e)},
                 {{"dtype", to}},
                 true});
    c.push_back({"cast",
                 std::string("[1031,257] -> ") + to,
                 {x_in({1031, 257}, -1e5, 1e5)},
                 {{"dtype", to}},
                 true});
  }
}

void add_storage_quant(std::vector<CrosscheckCase>& c) {
  std::vector<double> e = edge_values();
  Shape es{static_cast<int64_t>(e.size())};
  const char* dq = "dynamic_range_quantize";
  c.push_back({dq, "tensor symmetric edges", {GradcheckInput(es, DType::f64, 0, 0, e)}, {}});
  c.push_back({dq,
               "tensor affine [257,1031]",
               {x_in({257, 1031}, -1, 5)},
               {{"mode", "affine"}, {"signed", false}, {"narrow_range", false}}});
  c.push_back(
      {dq, "channel axis 0 [64,300]", {x_in({64, 300})}, {{"scope", "channel"}, {"axis", 0}}});
  c.push_back({dq,
               "token [5,7,129] affine",
               {x_in({5, 7, 129}, -2, 1)},
               {{"scope", "token"}, {"mode", "affine"}}});
  c.push_back({dq,
               "group 32 [9,100]",
               {x_in({9, 100})},
               {{"scope", "group"}, {"axis", -1}, {"group_size", 32}}});
  c.push_back({dq,
               "all zeros",
               {GradcheckInput({2, 8}, DType::f64, 0, 0, std::vector<double>(16, 0.0))},
               {{"scope", "token"}}});
  const char* i4 = "int4_quantize_pack";
  c.push_back({i4, "symmetric g128 [33,300]", {x_in({33, 300})}, {}});
  c.push_back({i4,
               "asymmetric g32 [7,101] high_first",
               {x_in({7, 101}, -1, 4)},
               {{"mode", "asymmetric"}, {"group_size", 32}, {"nibble_order", "high_first"}}});
  c.push_back(
      {i4, "axis 0 g3 [10,5] (odd bytes)", {x_in({10, 5})}, {{"axis", 0}, {"group_size", 3}}});
  c.push_back({i4, "edges g8", {GradcheckInput(es, DType::f64, 0, 0, e)}, {{"group_size", 8}}});
  c.push_back({"int4_unpack_dequantize",
               "g16 [6,35] low_first",
               {fixed({105}, DType::u8, 0, 255.99), fixed({6, 3}, DType::f32, 0.01, 0.2),
                fixed({6, 3}, DType::u8, 0, 15.99)},
               {{"shape", Shape{6, 35}}, {"group_size", 16}},
               false,
               0,
               2,
               true});
  c.push_back({"int4_unpack_dequantize",
               "f64 scale -> f16 [4,9] high_first",
               {fixed({18}, DType::u8, 0, 255.99), fixed({4, 1}, DType::f64, 0.01, 0.2),
                fixed({4, 1}, DType::i32, 0, 15.99)},
               {{"shape", Shape{4, 9}},
                {"group_size", 16},
                {"nibble_order", "high_first"},
                {"dtype", "f16"}},
               false,
               0,
               2,
               true});
  c.push_back({"quantize",
               "token [6,7,33] u8",
               {x_in({6, 7, 33}), fixed({6, 7, 1}, DType::f32, 0.01, 0.03),
                fixed({6, 7, 1}, DType::i32, 100, 150)},
               {{"scope", "token"}},
               true});
  c.push_back(
      {"quantize",
       "group 16 axis 0 [40,3] s8 edges",
       {x_in({40, 3}), fixed({3, 3}, DType::f64, 0.05, 0.1), fixed({3, 3}, DType::i64, -3, 3)},
       {{"scope", "group"}, {"axis", 0}, {"group_size", 16}, {"signed", true}},
       true});
}

}  // namespace

std::vector<CrosscheckCase> extra_crosscheck_cases() {
  std::vector<CrosscheckCase> c;
  add_fake_quantize(c);
  add_observers(c);
  add_observer_token_group(c);
  add_nf4(c);
  add_percentile(c);
  add_float_ops(c);
  add_storage_quant(c);
  add_cast(c);
  add_pool_activation_dropout_cases(c);
  add_fold_cases(c);
  return c;
}

}  // namespace qg::cli
