// nn/import_weights: round trips through safetensors and .npz into MLP, CNN and transformer
// models, the PyTorch name rules, dtype conversion, and one qg::Error per kind of bad input
// (unmatched, missing, shape, dtype, non-finite, conflict, corrupt file), each checked to
// leave every state of the model unchanged.
#include "nn/import_weights.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

#include "core/npy.h"
#include "core/safetensors.h"
#include "tests/core/test_util.h"
#include "tests/nn/nn_util.h"

namespace qg {
namespace {

using testing::expect_error;

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "qg_import_test_" + std::to_string(::getpid()) + "_" + name;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A trainer of a small model of `kind` (float QConfig unless given).
std::unique_ptr<nn::Trainer> trainer(const std::string& kind, uint64_t seed,
                                     nn::QConfig qc = nn::QConfig::float32()) {
  const auto& d = testing::digits();
  return std::make_unique<nn::Trainer>(testing::small_config(kind, qc, seed), d.train, d.test);
}

// Every parameter node's value (buffers included), by name, on the CPU.
std::map<std::string, Tensor> parameters_of(nn::Trainer& t) {
  std::map<std::string, Tensor> out;
  for (NodeId id : t.graph().parameters())
    out[t.graph().value(t.graph().node(id).outputs[0]).name] =
        t.executor().state(id, "value").to(Device::cpu());
  return out;
}

// Every node state of the trainer (parameters, optimizer moments, observers, flags) as bytes;
// without `parameters`, all but the parameter nodes'.
std::vector<std::string> state_bytes(nn::Trainer& t, bool parameters = true) {
  std::vector<std::string> out;
  for (NodeId id = 0; id < t.graph().num_nodes(); ++id) {
    const Node& n = t.graph().node(id);
    if (n.states.empty() || n.op->name == "constant") continue;
    if (!parameters && n.op->name == "parameter") continue;
    for (const Tensor& s : t.executor().states(id)) {
      Tensor c = s.to(Device::cpu());
      out.emplace_back(static_cast<const char*>(c.raw_data()), c.nbytes());
    }
  }
  return out;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.nbytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0);
}

// A stored (uncompressed) ZIP of .npy members, as numpy.savez writes.
std::string npz_bytes(const std::map<std::string, Tensor>& tensors) {
  auto put = [](std::string& s, uint64_t v, int n) {
    for (int i = 0; i < n; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  std::string out, dir;
  int count = 0;
  for (const auto& [key, t] : tensors) {
    const std::string npy_path = temp_path("member.npy");
    save_npy(npy_path, t);
    const std::string data = read_bytes(npy_path), name = key + ".npy";
    ::unlink(npy_path.c_str());
    const uint32_t crc = static_cast<uint32_t>(
        crc32(0, reinterpret_cast<const Bytef*>(data.data()), static_cast<uInt>(data.size())));
    const uint64_t offset = out.size();
    for (std::string* s : {&out, &dir}) {
      const bool central = s == &dir;
      put(*s, central ? 0x02014b50 : 0x04034b50, 4);
      if (central) put(*s, 20, 2);
      put(*s, 20, 2);  // version needed
      put(*s, 0, 2);   // flags
      put(*s, 0, 2);   // stored
      put(*s, 0, 4);   // time, date
      put(*s, crc, 4);
      put(*s, data.size(), 4);
      put(*s, data.size(), 4);
      put(*s, name.size(), 2);
      put(*s, 0, 2);  // extra field length
      if (central) {
        put(*s, 0, 8);  // comment length, disk, internal and external attributes
        put(*s, 0, 2);
        put(*s, offset, 4);
      }
      *s += name;
    }
    out += data;
    ++count;
  }
  const uint64_t dir_offset = out.size();
  out += dir;
  put(out, 0x06054b50, 4);
  put(out, 0, 4);
  put(out, count, 2);
  put(out, count, 2);
  put(out, dir.size(), 4);
  put(out, dir_offset, 4);
  put(out, 0, 2);
  return out;
}

// The MLP's tensors of seed 7 under their own names; imports go into a seed-8 model.
struct MlpImport : ::testing::Test {
  std::unique_ptr<nn::Trainer> source = trainer("mlp", 7), target = trainer("mlp", 8);
  std::map<std::string, Tensor> tensors = parameters_of(*source);

  // Imports `t` and expects a qg::Error holding every fragment, with the target unchanged.
  void expect_rejected(const std::map<std::string, Tensor>& t,
                       const std::vector<std::string>& fragments) {
    const auto before = state_bytes(*target);
    expect_error(
        [&] { nn::import_weights(target->executor(), t, nn::torch_name_match, "'w.safetensors'"); },
        fragments);
    EXPECT_TRUE(state_bytes(*target) == before) << "a failed import changed the model";
  }
};

TEST_F(MlpImport, SafetensorsRoundTripGivesTheSourceModel) {
  const std::string path = temp_path("mlp.safetensors");
  save_safetensors(path, tensors);
  nn::ImportReport r = nn::import_weights_file(target->executor(), path);
  ::unlink(path.c_str());
  EXPECT_EQ(r.loaded.size(), tensors.size());
  EXPECT_TRUE(r.ignored.empty());
  for (const auto& [name, t] : parameters_of(*target))
    EXPECT_TRUE(same_bits(t, tensors.at(name))) << name;
  EXPECT_EQ(target->predict(testing::digits().test), source->predict(testing::digits().test));
}

TEST_F(MlpImport, NpzRoundTripAndContentDetection) {
  // ".npz" by name, and an unrecognised extension by content, for both formats.
  for (const std::string name : {"mlp.npz", "mlp_zip.bin"}) {
    const std::string path = temp_path(name);
    write_bytes(path, npz_bytes(tensors));
    auto other = trainer("mlp", 9);
    nn::import_weights_file(other->executor(), path);
    ::unlink(path.c_str());
    for (const auto& [n, t] : parameters_of(*other))
      EXPECT_TRUE(same_bits(t, tensors.at(n))) << name << " " << n;
  }
  const std::string path = temp_path("mlp_st.bin");
  save_safetensors(path, tensors);
  EXPECT_EQ(nn::read_weight_file(path).size(), tensors.size());
  ::unlink(path.c_str());
}

TEST_F(MlpImport, HalfBfloatAndDoubleConvertToF32) {
  // Values exact in f16 and bf16 (multiples of 1/64 below 4): every conversion is exact.
  std::map<std::string, Tensor> t;
  const DType dtypes[] = {DType::f16, DType::bf16, DType::f64, DType::f32};
  int k = 0;
  std::map<std::string, std::vector<double>> expected;
  for (const auto& [name, src] : tensors) {
    std::vector<double> v(static_cast<size_t>(src.numel()));
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<double>(static_cast<int>(i % 97) - 48) / 64.0;
    t[name] = Tensor::from_doubles(src.shape(), v, dtypes[k++ % 4]);
    expected[name] = v;
  }
  nn::import_weights(target->executor(), t);
  for (const auto& [name, got] : parameters_of(*target)) {
    EXPECT_EQ(got.dtype(), DType::f32);
    EXPECT_EQ(got.to_doubles(), expected.at(name)) << name;
  }
}

TEST_F(MlpImport, UnmatchedNamesAreAllListed) {
  auto t = tensors;
  t["fc9.weight"] = Tensor::zeros({2}, DType::f32);
  t["head.bias"] = Tensor::zeros({2}, DType::f32);
  expect_rejected(
      t, {"[nn.import] cannot import 'w.safetensors' (6 tensors) into a model of 4 parameters; "
          "nothing was changed",
          "2 file tensor(s) match no model parameter:\n    'fc9.weight'\n    'head.bias'"});
}

TEST_F(MlpImport, MissingParametersAreAllListed) {
  auto t = tensors;
  t.erase("fc1.bias");
  t.erase("fc2.weight");
  expect_rejected(t, {"2 model parameter(s) missing from the file:\n    fc1.bias f32[16]\n    "
                      "fc2.weight f32[10, 16]"});
}

TEST_F(MlpImport, ShapeMismatchNamesBothShapes) {
  auto t = tensors;
  t["fc1.weight"] = Tensor::zeros({64, 16}, DType::f32);  // transposed
  expect_rejected(
      t, {"1 shape/dtype mismatch(es):\n    'fc1.weight': the file holds f32[64, 16], the model "
          "needs f32[16, 64]"});
}

TEST_F(MlpImport, IntegerDtypeIsRejected) {
  auto t = tensors;
  t["fc1.bias"] = Tensor::zeros({16}, DType::i64);
  t["fc2.bias"] = Tensor::zeros({10}, DType::boolean);
  expect_rejected(t, {"'fc1.bias' (i64[16]): dtype i64 cannot load into a f32 parameter",
                      "'fc2.bias' (bool[10]): dtype bool cannot load into a f32 parameter"});
}

TEST_F(MlpImport, NonFiniteValuesAreRejected) {
  auto t = tensors;
  t["fc2.bias"] = tensors.at("fc2.bias").clone();
  t["fc2.bias"].data<float>()[3] = std::numeric_limits<float>::quiet_NaN();
  t["fc1.bias"] = Tensor::from_doubles({16}, std::vector<double>(16, 1e300), DType::f64);
  expect_rejected(t,
                  {"'fc2.bias' (f32[10]): 1 of its 10 values are not finite in f32",
                   "'fc1.bias' (f64[16]): 16 of its 16 values are not finite in f32 (NaN, Inf, or "
                   "beyond the f32 range)"});
}

TEST_F(MlpImport, EveryProblemIsReportedInOneError) {
  auto t = tensors;
  t.erase("fc2.bias");
  t["extra"] = Tensor::zeros({1}, DType::f32);
  t["fc1.weight"] = Tensor::zeros({1}, DType::f32);
  expect_rejected(t, {"1 file tensor(s) match no model parameter:\n    'extra'",
                      "1 model parameter(s) missing from the file:\n    fc2.bias f32[10]",
                      "'fc1.weight': the file holds f32[1], the model needs f32[16, 64]"});
}

TEST_F(MlpImport, TwoNamesForOneParameterConflict) {
  auto t = tensors;
  t["module.fc1.bias"] = tensors.at("fc1.bias");
  expect_rejected(
      t, {"1 name conflict(s):\n    'fc1.bias' and 'module.fc1.bias' both map to 'fc1.bias'"});
}

TEST_F(MlpImport, CorruptFilesNameTheReader) {
  const auto before = state_bytes(*target);
  const std::string st = temp_path("bad.safetensors"), npz = temp_path("bad.npz");
  save_safetensors(st, tensors);
  std::string bytes = read_bytes(st);
  write_bytes(st, bytes.substr(0, bytes.size() - 5));  // truncated data buffer
  write_bytes(npz, npz_bytes(tensors).substr(0, 100));
  expect_error([&] { nn::import_weights_file(target->executor(), st); },
               {"[nn.import] cannot read weights from '" + st + "' as safetensors: [safetensors]"});
  expect_error([&] { nn::import_weights_file(target->executor(), npz); },
               {"[nn.import] cannot read weights from '" + npz + "' as .npz: [npz]"});
  expect_error(
      [&] { nn::import_weights_file(target->executor(), temp_path("absent.safetensors")); },
      {"[nn.import]", "absent.safetensors"});
  ::unlink(st.c_str());
  ::unlink(npz.c_str());
  EXPECT_TRUE(state_bytes(*target) == before);
}

TEST_F(MlpImport, NameTableRenamesAndIgnores) {
  std::map<std::string, Tensor> t;
  for (const auto& [name, v] : tensors) t["layers." + name] = v;
  t["step"] = Tensor::zeros({}, DType::i64);
  std::map<std::string, std::string> table{{"step", ""}};
  for (const auto& [name, v] : tensors) table["layers." + name] = name;
  nn::ImportReport r = nn::import_weights(target->executor(), t, nn::name_table(table));
  EXPECT_EQ(r.loaded.size(), 4u);
  ASSERT_EQ(r.ignored.size(), 1u);
  EXPECT_EQ(r.ignored[0].second, "ignored by the name table");
  EXPECT_NE(r.summary().find(
                "imported 4 tensors (4 renamed); ignored 1:\n  step (ignored by the name table)"),
            std::string::npos)
      << r.summary();
  for (const auto& [name, got] : parameters_of(*target))
    EXPECT_TRUE(same_bits(got, tensors.at(name)));
}

TEST(TorchNames, Rules) {
  using V = std::vector<std::string>;
  EXPECT_EQ(nn::torch_name_match("fc1.weight").candidates, V{"fc1.weight"});
  EXPECT_EQ(nn::torch_name_match("module.fc1.weight").candidates, V{"fc1.weight"});
  EXPECT_EQ(nn::torch_name_match("conv1.conv.weight").candidates,
            (V{"conv1.conv.weight", "conv1.weight"}));
  EXPECT_EQ(nn::torch_name_match("conv1.0.weight").candidates,
            (V{"conv1.0.weight", "conv1.weight"}));
  EXPECT_EQ(nn::torch_name_match("conv1.1.running_var").candidates,
            (V{"conv1.1.running_var", "conv1.bn.running_var"}));
  EXPECT_NE(nn::torch_name_match("conv1.bn.num_batches_tracked").ignore_reason.find("momentum"),
            std::string::npos);
  EXPECT_NE(
      nn::torch_name_match("fc1.activation_post_process.scale").ignore_reason.find("observer"),
      std::string::npos);
  EXPECT_NE(
      nn::torch_name_match("conv1.weight_fake_quant.zero_point").ignore_reason.find("observer"),
      std::string::npos);
  EXPECT_TRUE(nn::torch_name_match("weight_fake_quantizer").ignore_reason.empty());
}

// A CNN under PyTorch's names: a module pair .conv/.bn per block, BN counters, and a torch
// QAT model's observer entries (ignored); then fuse_modules' sequential names.
TEST(CnnImport, TorchStateDictNamesLoadAndObserversAreIgnored) {
  auto source = trainer("cnn", 7), target = trainer("cnn", 8, nn::QConfig::w4a8());
  const auto own = parameters_of(*source);
  const auto observers_before = state_bytes(*target, false);
  for (bool fused : {false, true}) {
    std::map<std::string, Tensor> t;
    for (const auto& [name, v] : own) {
      std::string torch_name = name;
      const size_t bn = name.find(".bn.");
      if (name.rfind("conv", 0) == 0 && bn == std::string::npos)
        torch_name = name.substr(0, name.find('.')) + (fused ? ".0.weight" : ".conv.weight");
      else if (fused && bn != std::string::npos)
        torch_name = name.substr(0, bn) + ".1." + name.substr(bn + 4);
      t[torch_name] = v;
    }
    for (const char* b : {"conv1", "conv2", "conv3"})
      t[std::string(b) + (fused ? ".1" : ".bn") + ".num_batches_tracked"] =
          Tensor::scalar(40, DType::i64);
    t["conv1.weight_fake_quant.scale"] = Tensor::zeros({8}, DType::f32);
    t["quant.activation_post_process.zero_point"] = Tensor::zeros({1}, DType::i64);
    nn::ImportReport r = nn::import_weights(target->executor(), t);
    EXPECT_EQ(r.loaded.size(), own.size());
    EXPECT_EQ(r.ignored.size(), 5u);
    for (const auto& [name, got] : parameters_of(*target))
      EXPECT_TRUE(same_bits(got, own.at(name))) << name;
  }
  // Observer statistics and the batch norms' flags are not parameters: untouched.
  EXPECT_TRUE(state_bytes(*target, false) == observers_before);
  expect_error([&] { nn::import_weights(target->executor(), {}); },
               {"17 model parameter(s) missing from the file", "conv1.bn.running_mean f32[8]"});
}

TEST(TransformerImport, RoundTripUnderOwnNames) {
  auto source = trainer("transformer", 7), target = trainer("transformer", 8);
  const auto own = parameters_of(*source);
  const std::string path = temp_path("transformer.safetensors");
  save_safetensors(path, own);
  EXPECT_EQ(nn::import_weights_file(target->executor(), path).loaded.size(), own.size());
  ::unlink(path.c_str());
  const auto& test = testing::digits().test;
  EXPECT_EQ(target->predict(test), source->predict(test));
}

}  // namespace
}  // namespace qg
