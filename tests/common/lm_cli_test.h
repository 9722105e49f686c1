// The preconditions of the tests that run `qat train --model llama` on the Python tutorial
// (the recompute, --compare, trainer and data-parallel command-line tests).
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "data/text_corpus.h"
#include "data/tokenizer.h"

// qat links the ONNX exporter's libprotobuf, and the SentencePiece module is kept apart from it
// only by RTLD_DEEPBIND, which AddressSanitizer refuses: under ASan these tests skip.
#if defined(__SANITIZE_ADDRESS__)
#define QG_SKIP_UNDER_ASAN_TOKENIZER() \
  GTEST_SKIP() << "qat's tokenizer needs RTLD_DEEPBIND, which AddressSanitizer refuses"
#else
#define QG_SKIP_UNDER_ASAN_TOKENIZER() (void)0
#endif

// Skips the calling test where the tokenizer or the corpus is missing; otherwise declares
// `corpus_var` (the tutorial's folder) and `qat_var` (the qat program that ctest names in
// QG_QAT).
#define QG_REQUIRE_LM_CLI(corpus_var, qat_var)                                         \
  if (!::qg::nn::tokenizer_available()) GTEST_SKIP() << "built without SentencePiece"; \
  QG_SKIP_UNDER_ASAN_TOKENIZER();                                                      \
  const std::string corpus_var = ::qg::nn::default_text_corpus_dir() + "/tutorial";    \
  if (!std::filesystem::is_directory(corpus_var))                                      \
    GTEST_SKIP() << corpus_var << " is missing (python3.11-doc)";                      \
  const char* qat_var = std::getenv("QG_QAT");                                         \
  ASSERT_NE(qat_var, nullptr) << "ctest sets QG_QAT to the qat program"
