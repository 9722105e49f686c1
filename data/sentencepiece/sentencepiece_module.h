// The C interface of qg_sentencepiece, a loadable module that wraps Debian's libsentencepiece
// (data/tokenizer.cpp loads it with dlopen). libsentencepiece carries its own copy of
// protobuf-lite 3.14 and exports its symbols; a program that also loads libprotobuf 3.21
// (the ONNX exporter's) cannot link both, in either order: one library's start-up or version
// check fails against the other's symbols. Loaded with RTLD_LOCAL | RTLD_DEEPBIND, the module
// and libsentencepiece resolve their own symbols first and add none to the program's.
// Errors come back as text in `err` (NUL-terminated, truncated to err_size).
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

// A processor for the serialized model in `bytes`; null (and `err`) when it does not parse.
void* qg_spm_load(const char* bytes, size_t size, char* err, size_t err_size);
void qg_spm_free(void* processor);
int32_t qg_spm_piece_size(const void* processor);
int32_t qg_spm_eos_id(const void* processor);
// The piece of `id` into `out` (NUL-terminated, truncated); returns its full length.
size_t qg_spm_piece(const void* processor, int32_t id, char* out, size_t out_size);
// Encodes `text`; *ids receives a malloc'ed array (free with qg_spm_free_buffer). Returns the
// count, or -1 with `err`.
int64_t qg_spm_encode(const void* processor, const char* text, size_t size, int32_t** ids,
                      char* err, size_t err_size);
// Trains a model on the non-empty lines of `files` with SentencePiece's `keys` = `values`
// options; *model receives the serialized model (malloc'ed, free with qg_spm_free_buffer) and
// *model_size its length. Returns 0, or -1 with `err`.
int qg_spm_train(const char* const* files, size_t file_count, const char* const* keys,
                 const char* const* values, size_t option_count, char** model, size_t* model_size,
                 char* err, size_t err_size);
void qg_spm_free_buffer(void* buffer);
}
