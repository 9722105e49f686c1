// `qat export` of `qat train --model llama` checkpoints, end to end (the real binary, QG_QAT
// set by ctest): a checkpoint with its config.json beside it exports without options and
// writes the greedy-decode reference (int4 weight-only too, its float zeros added after the
// INT4 DequantizeLinear); each bad input is a clear error (exit 2) that writes nothing: a
// corrupt checkpoint, a config.json of another model or none, a window longer than the
// model's positions, an unwritable output.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>

#include "core/npy.h"
#include "nn/llama_config.h"
#include "nn/qconfig.h"
#include "tests/common/qat_process.h"
#include "train/checkpoint.h"
#include "train/lm_trainer.h"

namespace qg {
namespace {

using testing::CmdResult;
using testing::find_qat;
using testing::run_qat;

#ifdef QG_WITH_ONNX

constexpr const char* kConfig =
    R"({"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 48,
        "max_position_embeddings": 32, "tie_word_embeddings": false})";

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

class QatExportLlama : public ::testing::Test {
 protected:
  void SetUp() override {
    qat_ = find_qat();
    ASSERT_FALSE(qat_.empty()) << "qat binary not found: set QG_QAT or build the qat target";
    dir_ = ::testing::TempDir() + "qg_qat_export_llama_test_" + std::to_string(::getpid());
    std::system(("mkdir -p '" + dir_ + "'").c_str());
    out_ = dir_ + "/model.onnx";
  }
  void TearDown() override {
    if (!dir_.empty()) std::system(("rm -rf '" + dir_ + "'").c_str());
  }
  // A checkpoint of `recipe` after one step on a synthetic stream, in DIR/<name>/ with the
  // model's config.json beside it, as `qat train --model llama` leaves it.
  std::string checkpoint(const std::string& recipe, const std::string& name,
                         const std::string& precision = "f32") {
    std::vector<int32_t> tokens(2048);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7) % 48);
    nn::LmTrainConfig c;
    c.model = nn::parse_llama_config(kConfig, "test");
    c.qconfig = nn::parse_recipe(recipe, 32);
    c.precision = nn::parse_precision(precision);
    c.batch = 2;
    c.seq = 16;
    c.lr.peak = 1e-3;
    c.lr.total = 1;
    nn::LmTrainer t(c, tokens, tokens);
    t.train_step();
    const std::string d = dir_ + "/" + name;
    std::system(("mkdir -p '" + d + "'").c_str());
    t.save_checkpoint(d + "/checkpoint.qgck");
    write_text(d + "/config.json", kConfig);
    return d + "/checkpoint.qgck";
  }
  CmdResult run(const std::string& args) const { return run_qat(qat_, "export " + args); }
  void expect_failure(const std::string& args, const std::vector<std::string>& fragments) const {
    CmdResult r = run(args);
    EXPECT_EQ(r.status, 2) << r.output;
    for (const auto& f : fragments) EXPECT_NE(r.output.find(f), std::string::npos) << r.output;
    EXPECT_FALSE(exists(out_)) << out_;
    EXPECT_FALSE(exists(out_ + ".tmp")) << out_ << ".tmp";
  }
  std::string qat_, dir_, out_;
};

TEST_F(QatExportLlama, ACheckpointExportsWithItsGreedyReference) {
  const std::string ck = checkpoint("8da4w", "q");
  CmdResult r = run("'" + ck + "' --onnx '" + out_ + "' --reference '" + dir_ +
                    "/ref' --prompts 3 --prompt-len 4 --new-tokens 5");
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* s : {"llama 8da4w group 32", "ONNX opset 21", "DequantizeLinear 8",
                        "reference: 3 prompts of 4 tokens, 5 greedy tokens each"})
    EXPECT_NE(r.output.find(s), std::string::npos) << s << "\n" << r.output;
  EXPECT_TRUE(exists(out_));
  EXPECT_EQ(load_npy(dir_ + "/ref/prompts.npy").shape(), (Shape{3, 4}));
  EXPECT_EQ(load_npy(dir_ + "/ref/tokens.npy").shape(), (Shape{3, 5}));
  EXPECT_EQ(load_npy(dir_ + "/ref/logits.npy").shape(), (Shape{3, 4, 48}));
}

TEST_F(QatExportLlama, Int4WeightOnlyExportsItsFloatZerosAfterTheInt4Dequantize) {
  const std::string ck = checkpoint("int4_weight_only", "w4");
  CmdResult r = run("'" + ck + "' --onnx '" + out_ + "' --reference '" + dir_ +
                    "/ref' --prompts 2 --prompt-len 4 --new-tokens 4");
  ASSERT_EQ(r.status, 0) << r.output;
  // Eight INT4 weights (q, k, v, o, gate, up, down, lm_head), each followed by its zeros' Add.
  for (const char* s : {"llama int4_weight_only group 32", "DequantizeLinear 8"})
    EXPECT_NE(r.output.find(s), std::string::npos) << s << "\n" << r.output;
  EXPECT_TRUE(exists(out_));
  EXPECT_EQ(load_npy(dir_ + "/ref/tokens.npy").shape(), (Shape{2, 4}));
}

// A model trained in bf16-mixed is built and exported in bf16-mixed (its GEMMs and
// activations are the arithmetic it trained with), never silently as an f32 model.
TEST_F(QatExportLlama, ABf16MixedCheckpointIsExportedInBf16) {
  const std::string ck = checkpoint("8da4w", "b", "bf16-mixed");
  CmdResult r = run("'" + ck + "' --onnx '" + out_ + "' --reference '" + dir_ +
                    "/ref' --prompts 2 --prompt-len 4 --new-tokens 4");
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* s : {"precision: bf16-mixed", "Cast pair", "DequantizeLinear 8"})
    EXPECT_NE(r.output.find(s), std::string::npos) << s << "\n" << r.output;
  EXPECT_TRUE(exists(out_));
}

TEST_F(QatExportLlama, ACorruptCheckpointIsAnError) {
  const std::string ck = checkpoint("8da4w", "q");
  std::string bytes;
  {
    std::ifstream f(ck, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  bytes[bytes.size() / 2] ^= 0x10;
  write_text(ck, bytes);
  expect_failure("'" + ck + "' --onnx '" + out_ + "'", {"checkpoint", "checksum mismatch"});
}

TEST_F(QatExportLlama, AConfigOfAnotherModelOrNoneIsAnError) {
  const std::string ck = checkpoint("8da4w", "q");
  const std::string other = dir_ + "/other.json";
  std::string text = kConfig;
  text.replace(text.find("\"hidden_size\": 32"), 17, "\"hidden_size\": 64");
  write_text(other, text);
  expect_failure("'" + ck + "' --onnx '" + out_ + "' --config '" + other + "'",
                 {"hidden = 64", "was trained with hidden = 32"});
  std::remove((dir_ + "/q/config.json").c_str());
  expect_failure("'" + ck + "' --onnx '" + out_ + "'", {"q/config.json"});
}

TEST_F(QatExportLlama, AWindowPastTheModelsPositionsIsAnError) {
  const std::string ck = checkpoint("w8a8_dynamic", "w8");
  expect_failure("'" + ck + "' --onnx '" + out_ + "' --prompt-len 8 --new-tokens 64",
                 {"8 + --new-tokens 64 = 72", "max_position_embeddings 32"});
}

TEST_F(QatExportLlama, AnUnwritableOutputIsAnError) {
  const std::string ck = checkpoint("8da4w", "q");
  const std::string in_missing_dir = dir_ + "/no/such/dir/model.onnx";
  CmdResult r = run("'" + ck + "' --onnx '" + in_missing_dir + "' --new-tokens 2");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("cannot create"), std::string::npos) << r.output;
  EXPECT_FALSE(exists(in_missing_dir + ".tmp"));
}

#else
TEST(QatExportLlama, SkippedWithoutOnnx) {
  GTEST_SKIP() << "built without libonnx-dev";
}
#endif

}  // namespace
}  // namespace qg
