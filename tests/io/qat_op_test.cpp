// `qat op` end to end: runs the real binary (QG_QAT, set by ctest) on .npy files and checks
// outputs, state round-trips and that each kind of bad request exits 2 with a clear message.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "core/npy.h"
#include "tests/common/qat_process.h"

namespace qg {
namespace {

using testing::CmdResult;
using testing::find_qat;
using testing::run_qat;

class QatOp : public ::testing::Test {
 protected:
  void SetUp() override {
    qat_ = find_qat();
    ASSERT_FALSE(qat_.empty()) << "qat binary not found: set QG_QAT or build the qat target";
    dir_ = ::testing::TempDir() + "qg_qat_op_test_" + std::to_string(::getpid());
    std::system(("mkdir -p '" + dir_ + "'").c_str());
  }
  void TearDown() override {
    if (!dir_.empty()) std::system(("rm -rf '" + dir_ + "'").c_str());
  }
  std::string path(const std::string& name) const { return dir_ + "/" + name + ".npy"; }
  std::string save(const std::string& name, const Tensor& t) const {
    save_npy(path(name), t);
    return path(name);
  }
  CmdResult run(const std::string& args) const { return run_qat(qat_, "op " + args); }
  void expect_error(const std::string& args, const std::string& needle) const {
    CmdResult r = run(args);
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << r.output;
  }
  // Arguments feeding a fake_quantize with scale 0.5, zero point 0, signed 4-bit.
  std::string fq_inputs() const {
    save("x", Tensor::from_doubles({5}, {0.25, 0.75, -1.2, 100.0, -0.0}));
    save("s", Tensor::from_doubles({1}, {0.5}));
    save("z", Tensor::from_doubles({1}, {0}, DType::i32));
    return "fake_quantize --in x=" + path("x") + " --in scale=" + path("s") +
           " --in zero_point=" + path("z") + " ";
  }

  std::string qat_, dir_;
};

TEST_F(QatOp, RunsFakeQuantizeWithTypedAttributes) {
  CmdResult r = run(fq_inputs() + "--out y=" + path("y") + " --out mask=" + path("m") +
                    " --attr bits=4 --attr signed=true");
  ASSERT_EQ(r.status, 0) << r.output;
  // x / 0.5 = 0.5, 1.5, -2.4, 200, -0 -> rint: 0, 2, -2, 200 (clamped to 7), -0.
  EXPECT_EQ(load_npy(path("y")).to_doubles(), (std::vector<double>{0.0, 1.0, -1.0, 3.5, 0.0}));
  // Mask bits LSB first: elements 0, 1, 2, 4 in range -> 0b10111.
  EXPECT_EQ(load_npy(path("m")).to_doubles(), (std::vector<double>{23}));
}

TEST_F(QatOp, StateInAndOut) {
  save("x", Tensor::from_doubles({3}, {-1.0, 2.0, 0.5}));
  save("min0", Tensor::from_doubles({1}, {-4.0}));
  CmdResult r = run("minmax_observer --in x=" + path("x") + " --state min=" + path("min0") +
                    " --state-out min=" + path("min1") + " --state-out max=" + path("max1"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(load_npy(path("min1")).to_doubles(), (std::vector<double>{-4.0}));
  EXPECT_EQ(load_npy(path("max1")).to_doubles(), (std::vector<double>{2.0}));
  // In eval mode the statistics do not move.
  r = run("minmax_observer --eval --in x=" + path("x") + " --state-out min=" + path("min2"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(load_npy(path("min2")).at(0), std::numeric_limits<double>::infinity());
}

TEST_F(QatOp, MissingInputUnknownOutputAndStateAreNamed) {
  save("x", Tensor::from_doubles({3}, {-1.0, 2.0, 0.5}));
  expect_error("fake_quantize --in x=" + path("x"), "missing required input(s): scale, zero_point");
  expect_error(fq_inputs() + "--out nope=" + path("y"), "unknown output 'nope'");
  expect_error(fq_inputs() + "--in extra=" + path("x"), "unknown input 'extra'");
  expect_error("minmax_observer --in x=" + path("x") + " --state-out bogus=" + path("b"),
               "unknown state 'bogus'");
}

TEST_F(QatOp, StateTypeMustMatchExactly) {
  save("x", Tensor::from_doubles({3}, {-1.0, 2.0, 0.5}));
  save("min64", Tensor::from_doubles({1}, {-4.0}, DType::f64));
  expect_error("minmax_observer --in x=" + path("x") + " --state min=" + path("min64"),
               "state 'min' must be f32[1]");
}

TEST_F(QatOp, AttributesAreParsedByTheirSchemaType) {
  expect_error(fq_inputs() + "--attr bits=four", "attribute 'bits' expects an integer");
  expect_error(fq_inputs() + "--attr signed=yes", "expects true/false/1/0");
  expect_error(fq_inputs() + "--attr nonsense=1", "unknown attribute 'nonsense'");
  expect_error(fq_inputs() + "--attr bits=40", "bits");
  expect_error(fq_inputs() + "--attr bits", "expects NAME=VALUE");
}

TEST_F(QatOp, BadFilesAndOpsAreReported) {
  expect_error("no_such_op --in x=" + path("x"), "no_such_op");
  expect_error(fq_inputs() + "--in x=" + path("absent"), "names 'x' twice");
  std::string bad = dir_ + "/bad.npy";
  std::system(("printf 'hello' > '" + bad + "'").c_str());
  save("s", Tensor::from_doubles({1}, {0.5}));
  save("z", Tensor::from_doubles({1}, {0}, DType::i32));
  expect_error(
      "fake_quantize --in x=" + bad + " --in scale=" + path("s") + " --in zero_point=" + path("z"),
      "too short");
}

TEST_F(QatOp, HelpDocumentsTheInterface) {
  CmdResult r = run("--help");
  EXPECT_EQ(r.status, 0);
  for (const char* flag :
       {"--in", "--out", "--attr", "--state", "--state-out", "--eval", "--device", "int list"}) {
    EXPECT_NE(r.output.find(flag), std::string::npos) << flag;
  }
}

}  // namespace
}  // namespace qg
