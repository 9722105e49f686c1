// The Hugging Face fixture (tests/import/fixtures/hf_llama_tiny, written by transformers'
// LlamaForCausalLM + save_pretrained: tests/import/make_hf_llama_fixture.py): each saved
// checkpoint imported into the llama model and run on the CPU gives transformers' logits;
// the sharded save gives the single file's parameters bit for bit; and `qat llama-logits`
// does the same from the command line.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <set>

#include "runtime/compile.h"
#include "tests/common/qat_process.h"
#include "tests/core/test_util.h"
#include "tests/import/hf_llama_util.h"

namespace qg {
namespace {

using testing::LlamaUnderTest;

const std::string kFixture = std::string(QG_IMPORT_TEST_DIR) + "/fixtures/hf_llama_tiny";

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// The fixture is committed; its absence is a failure, not a skip.
class HfFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(exists(kFixture + "/input_ids.npy"))
        << kFixture << " is missing: write it with tests/import/make_hf_llama_fixture.py "
        << "(needs transformers; see its header) and commit it";
    ids = load_npy(kFixture + "/input_ids.npy");
  }
  // The model of `folder`'s config.json, with the folder imported.
  std::unique_ptr<LlamaUnderTest> imported(const std::string& folder, nn::ImportReport* report) {
    const std::string dir = kFixture + "/" + folder;
    auto t =
        std::make_unique<LlamaUnderTest>(nn::load_hf_llama_config(dir), ids.size(0), ids.size(1));
    *report = nn::import_hf_llama(*t->ex, t->config, dir);
    return t;
  }
  Tensor ids;
};

// f32 throughout on both sides; only the summation orders differ (Eigen here, torch's CPU
// BLAS there). Through the fixture's 2 blocks (weights of std 0.2) each f32 forward lands
// within about 8e-7 x max |logit| of the f64 forward of the same weights (measured with torch
// over four seeds), so two of them differ by at most about twice that. The bound,
// 5e-6 x max(1, max |logit|), leaves a factor 3 and is far below what a wrong step moves
// (a norm weight not loaded or a wrong rope_theta: O(0.1) to O(1)).
void expect_tight(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  auto [err, scale] = testing::max_error(got, want);
  EXPECT_GT(scale, 1.0) << what << ": the fixture's logits should be well away from 0";
  EXPECT_LE(err, 5e-6 * std::max(1.0, scale)) << what << ": max |logit| " << scale;
  std::printf("%s: max |logit| %.3g, max error %.3g\n", what.c_str(), scale, err);
}

// The committed fixture comes from transformers (5.x) itself, not from a stand-in.
TEST_F(HfFixture, WrittenByTransformers) {
  const std::string p = testing::read_text(kFixture + "/provenance.json");
  EXPECT_NE(p.find("\"generator\": \"tests/import/make_hf_llama_fixture.py\""), std::string::npos)
      << p;
  EXPECT_NE(p.find("\"transformers\": \"5."), std::string::npos) << p;
}

TEST_F(HfFixture, F32CheckpointGivesTransformersLogits) {
  nn::ImportReport r;
  auto t = imported("f32", &r);
  EXPECT_EQ(r.loaded.size(), t->m.parameters.size());
  EXPECT_FALSE(t->config.tie_word_embeddings);
  expect_tight(t->logits(ids), load_npy(kFixture + "/logits_f32.npy"), "f32");
}

TEST_F(HfFixture, TiedCheckpointGivesTransformersLogits) {
  nn::ImportReport r;
  auto t = imported("tied", &r);
  ASSERT_TRUE(t->config.tie_word_embeddings);
  EXPECT_EQ(r.loaded.size(), t->m.parameters.size());
  // save_pretrained leaves out the tied lm_head.weight; a copy of it would be ignored.
  for (const auto& [file, reason] : r.ignored) EXPECT_EQ(file, "lm_head.weight") << reason;
  expect_tight(t->logits(ids), load_npy(kFixture + "/logits_tied.npy"), "tied");
}

// Every shard is read and the parameters are the single file's, bit for bit.
TEST_F(HfFixture, ShardedCheckpointGivesTheSingleFilesParameters) {
  nn::HfCheckpoint ck = nn::read_hf_checkpoint(kFixture + "/sharded");
  EXPECT_GE(ck.files.size(), 2u);
  nn::ImportReport r;
  auto sharded = imported("sharded", &r);
  auto single = imported("f32", &r);
  const auto a = sharded->params(), b = single->params();
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) EXPECT_TRUE(testing::same_bits(t, b.at(name))) << name;
  std::set<std::string> files;
  for (const auto& [name, file] : ck.source) files.insert(file);
  EXPECT_EQ(files.size(), ck.files.size());  // each shard contributed
}

// The bf16 checkpoint into f32 parameters: the weights widen exactly, so the parameters are
// the f32 model's rounded to bf16 and the logits are transformers' f32 forward of those
// weights (tight). Against transformers' bf16 forward the tolerance is loose: that reference
// rounds every activation to bf16 (8 significant bits, a relative step of 2^-8) at some 20
// points per block, and the model amplifies those errors through the attention scores and
// the MLP; the difference is the bf16 reference's own rounding error, measured at up to 3.2%
// of max |logit| (max) and 1.7% of the RMS logit (RMS) over four seeds of a stand-in, and at
// 1.3% (0.0498 of 3.92) and 1.1% on the committed transformers 5.17 fixture. The bounds, 10%
// and 5%, allow 3x the stand-in's; the exactness of the import itself is the tight check
// above.
TEST_F(HfFixture, Bf16CheckpointIntoF32Parameters) {
  nn::HfCheckpoint ck = nn::read_hf_checkpoint(kFixture + "/bf16");
  for (const auto& [name, t] : ck.tensors) EXPECT_EQ(t.dtype(), DType::bf16) << name;
  nn::ImportReport r;
  auto t = imported("bf16", &r);
  auto f32 = imported("f32", &r);
  const auto f32_params = f32->params();
  for (const auto& [name, p] : t->params()) {
    EXPECT_EQ(p.dtype(), DType::f32) << name;
    EXPECT_TRUE(testing::same_bits(p, f32_params.at(name).cast(DType::bf16).cast(DType::f32)))
        << name << ": not the f32 weights rounded to nearest even";
  }
  const Tensor logits = t->logits(ids);
  expect_tight(logits, load_npy(kFixture + "/logits_bf16_weights_f32.npy"), "bf16 weights, f32");

  const Tensor bf16_ref = load_npy(kFixture + "/logits_bf16.npy");
  auto [err, scale] = testing::max_error(logits, bf16_ref);
  const std::vector<double> got = logits.to_doubles(), want = bf16_ref.to_doubles();
  double sq_err = 0, sq_ref = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    sq_err += (got[i] - want[i]) * (got[i] - want[i]);
    sq_ref += want[i] * want[i];
  }
  const double rms_ratio = std::sqrt(sq_err / sq_ref);
  EXPECT_GT(err, 0.0) << "the bf16 reference should differ from an f32 forward";
  EXPECT_LE(err, 0.1 * scale) << "max |logit| " << scale;
  EXPECT_LE(rms_ratio, 0.05);
  std::printf("bf16 forward: max |logit| %.3g, max error %.3g, RMS error / RMS logit %.3g\n", scale,
              err, rms_ratio);
}

// Into a compiled step that has already run twice (its static run has bound the parameter
// buffers): the import writes into those buffers, so the next run sees the checkpoint.
TEST_F(HfFixture, ImportIntoACompiledStepThatHasRun) {
  const std::string dir = kFixture + "/f32";
  const nn::LlamaConfig c = nn::load_hf_llama_config(dir);
  Graph g;
  nn::LlamaModel m = nn::build_llama(g, c, ids.size(0), ids.size(1), nn::QConfig::float32(), 1);
  CompileOptions options;
  options.outputs = {m.logits};
  CompiledStep step(g, TrainingSpec{}, options);
  const Executor::Feeds feeds{{"input_ids", ids}, {"labels", nn::next_token_labels(ids)}};
  const Tensor want = load_npy(kFixture + "/logits_f32.npy");
  for (int i = 0; i < 2; ++i) step.forward(feeds, {m.logits}, false);
  ASSERT_EQ(step.last_path({m.logits}, false, false), RunPath::launch);
  EXPECT_GT(testing::max_error(step.forward(feeds, {m.logits}, false)[0], want).first, 0.1);
  nn::import_hf_llama(step.executor(), c, dir);
  expect_tight(step.forward(feeds, {m.logits}, false)[0].clone(), want, "compiled step");
}

TEST_F(HfFixture, QatLlamaLogitsCommand) {
  const std::string qat = testing::find_qat();
  ASSERT_FALSE(qat.empty()) << "qat binary not found: set QG_QAT or build the qat target";
  const std::string out = testing::fresh_dir("cli") + "/logits.npy";
  testing::CmdResult r = testing::run_qat(qat, "llama-logits '" + kFixture + "/sharded' --ids '" +
                                                   kFixture + "/input_ids.npy' --out '" + out +
                                                   "' --compare '" + kFixture + "/logits_f32.npy'");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("imported 21 tensors"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("max |logits - reference| = "), std::string::npos) << r.output;
  expect_tight(load_npy(out), load_npy(kFixture + "/logits_f32.npy"), "qat llama-logits");

  // Another model's config: the named error, exit status 2.
  r = testing::run_qat(qat, "llama-logits '" + kFixture + "/f32' --tokens 1,2,3 --config '" +
                                kFixture + "/tied/config.json'");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("tie_word_embeddings: true (model) vs false (file)"), std::string::npos)
      << r.output;
  r = testing::run_qat(qat, "llama-logits '" + kFixture + "/f32' --tokens 1,2,128");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("token id 128 at position 2 is outside the vocabulary [0, 128)"),
            std::string::npos)
      << r.output;
  r = testing::run_qat(qat, "llama-logits '" + kFixture + "/f32' --tokens 1,x");
  EXPECT_NE(r.output.find("--tokens '1,x': 'x' is not an integer token id"), std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace qg
