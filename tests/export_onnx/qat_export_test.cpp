// `qat export` end to end (the real binary, QG_QAT set by ctest): a checkpoint exports
// without options (it names its model), an older checkpoint with the model options, and each
// bad input is a clear error (exit 2) that writes nothing: a checkpoint of another model, a
// corrupt checkpoint, an unwritable output.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>

#include "tests/common/qat_process.h"
#include "tests/train/train_util.h"
#include "train/checkpoint.h"

namespace qg {
namespace {

using testing::CmdResult;
using testing::find_qat;
using testing::run_qat;

#ifdef QG_WITH_ONNX

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

class QatExport : public ::testing::Test, public testing::DigitsFixture {
 protected:
  void SetUp() override {
    qat_ = find_qat();
    ASSERT_FALSE(qat_.empty()) << "qat binary not found: set QG_QAT or build the qat target";
    dir_ = ::testing::TempDir() + "qg_qat_export_test_" + std::to_string(::getpid());
    std::system(("mkdir -p '" + dir_ + "'").c_str());
    // A W8A8 MLP 64-8-10 after one epoch, as `qat train --width 8 --depth 1 --weight-bits 8
    // --act-bits 8` would write it.
    nn::Trainer t(config(nn::QConfig::w8a8(), 8), train, test);
    t.train_epoch();
    checkpoint_ = dir_ + "/mlp.qgck";
    t.save_checkpoint(checkpoint_);
    out_ = dir_ + "/model.onnx";
  }
  void TearDown() override {
    if (!dir_.empty()) std::system(("rm -rf '" + dir_ + "'").c_str());
  }
  CmdResult run(const std::string& args) const { return run_qat(qat_, "export " + args); }
  // Exit 2 with every fragment in the message, and no output file (nor its temporary).
  void expect_failure(const std::string& args, const std::vector<std::string>& fragments,
                      const std::string& out) const {
    CmdResult r = run(args);
    EXPECT_EQ(r.status, 2) << r.output;
    for (const auto& f : fragments) EXPECT_NE(r.output.find(f), std::string::npos) << r.output;
    EXPECT_FALSE(exists(out)) << out;
    EXPECT_FALSE(exists(out + ".tmp")) << out << ".tmp";
  }
  std::string qat_, dir_, checkpoint_, out_;
};

TEST_F(QatExport, ACheckpointExportsWithoutModelOptions) {
  CmdResult r = run("'" + checkpoint_ + "' --onnx '" + out_ + "' --reference '" + dir_ + "/ref'");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("mlp 64-8-10, W8A8"), std::string::npos) << r.output;
  EXPECT_TRUE(exists(out_));
  EXPECT_FALSE(exists(out_ + ".tmp"));
  for (const char* f : {"inputs.npy", "labels.npy", "logits.npy"})
    EXPECT_TRUE(exists(dir_ + "/ref/" + f)) << f;
}

TEST_F(QatExport, ACheckpointOfAnotherModelIsAnError) {
  expect_failure("'" + checkpoint_ + "' --onnx '" + out_ + "' --model cnn",
                 {"error:", "checkpoint", "written for 'mlp=64,8,10", "this trainer is 'cnn"},
                 out_);
  expect_failure("'" + checkpoint_ + "' --onnx '" + out_ + "' --weight-bits 4",
                 {"written for", "qconfig=W8A8", "qconfig=W4A8"}, out_);
}

TEST_F(QatExport, AnOlderCheckpointNeedsTheModelOptions) {
  // Strip the model description, as checkpoints written before `qat export` lack it.
  std::vector<nn::CheckpointSection> sections = nn::read_checkpoint(checkpoint_);
  for (auto& s : sections)
    if (s.name == "meta") s.payload = s.payload.substr(0, s.payload.find("\nmodel ") + 1);
  const std::string old = dir_ + "/old.qgck";
  nn::write_checkpoint(old, sections);
  // qat train's defaults (a 64-128-10 float MLP) are another model.
  expect_failure("'" + old + "' --onnx '" + out_ + "'", {"written for 'mlp=64,8,10"}, out_);
  CmdResult r =
      run("'" + old + "' --onnx '" + out_ + "' --width 8 --depth 1 --weight-bits 8 --act-bits 8");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("does not name its model"), std::string::npos) << r.output;
  EXPECT_TRUE(exists(out_));
}

TEST_F(QatExport, AMalformedModelDescriptionIsAnError) {
  std::vector<nn::CheckpointSection> sections = nn::read_checkpoint(checkpoint_);
  const std::string bad = dir_ + "/bad_meta.qgck";
  for (auto [from, to, message] :
       {std::tuple{"\nheads 4\n", "\nheads four\n", "meta 'heads' = 'four' is not valid"},
        {"\nhidden 8\n", "\nhidden 8,16\n", "hidden layers 8,16 differ in width"}}) {
    std::vector<nn::CheckpointSection> s = sections;
    for (auto& sec : s)
      if (sec.name == "meta") {
        const size_t at = sec.payload.find(from);
        ASSERT_NE(at, std::string::npos) << sec.payload;
        sec.payload.replace(at, std::string(from).size(), to);
      }
    nn::write_checkpoint(bad, s);
    expect_failure("'" + bad + "' --onnx '" + out_ + "'", {message}, out_);
  }
}

TEST_F(QatExport, ACorruptCheckpointIsAnError) {
  std::string bytes;
  {
    std::ifstream f(checkpoint_, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  const std::string bad = dir_ + "/corrupt.qgck";
  bytes[bytes.size() / 2] ^= 0x10;
  std::ofstream(bad, std::ios::binary) << bytes;
  expect_failure("'" + bad + "' --onnx '" + out_ + "'", {"checkpoint", "checksum mismatch"}, out_);
  std::ofstream(bad, std::ios::binary | std::ios::trunc) << "QGCK";
  expect_failure("'" + bad + "' --onnx '" + out_ + "'", {"truncated"}, out_);
  expect_failure("'" + dir_ + "/missing.qgck' --onnx '" + out_ + "'", {"cannot open"}, out_);
}

TEST_F(QatExport, AnUnwritableOutputIsAnError) {
  const std::string in_missing_dir = dir_ + "/no/such/dir/model.onnx";
  expect_failure("'" + checkpoint_ + "' --onnx '" + in_missing_dir + "'",
                 {"cannot create", "no/such/dir/model.onnx.tmp"}, in_missing_dir);
  // A path that is a directory: the rename fails and the temporary is removed.
  const std::string a_dir = dir_ + "/taken";
  std::system(("mkdir -p '" + a_dir + "/inside'").c_str());
  CmdResult r = run("'" + checkpoint_ + "' --onnx '" + a_dir + "'");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("cannot rename"), std::string::npos) << r.output;
  EXPECT_FALSE(exists(a_dir + ".tmp"));
}

#else
TEST(QatExport, SkippedWithoutOnnx) {
  GTEST_SKIP() << "built without libonnx-dev";
}
#endif

}  // namespace
}  // namespace qg
