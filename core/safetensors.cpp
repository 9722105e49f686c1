#include "core/safetensors.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>
#include <vector>

#include "core/file_io.h"
#include "core/printable.h"

namespace qg {

namespace {

using nlohmann::json;

// The header is JSON text; real files hold a few hundred bytes per tensor. 100 MB is the
// limit the format's reference implementation uses too.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

struct DTypeName {
  const char* name;
  DType dtype;
};
constexpr DTypeName kDTypes[] = {
    {"F32", DType::f32}, {"F16", DType::f16}, {"BF16", DType::bf16},
    {"I64", DType::i64}, {"F64", DType::f64}, {"I32", DType::i32},
    {"I8", DType::i8},   {"U8", DType::u8},   {"BOOL", DType::boolean}};

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin;
  uint64_t end;
};

// Duplicate keys are legal JSON that nlohmann::json silently collapses (the last one wins);
// a safetensors file with two tensors of one name is corrupt, so the parse callback records
// the top-level keys as they are read.
struct KeyRecorder {
  std::set<std::string> seen;
  std::string duplicate;
  bool operator()(int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && parsed.is_string()) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!seen.insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  }
};

// An unsigned integer JSON value (shape entry or offset), or a qg::Error saying what it is.
uint64_t get_unsigned(const json& v, const std::string& what, const std::string& name,
                      const char* field) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) {
    QG_FAIL("safetensors", what, ": tensor '", printable(name), "': ", field, " entry ",
            v.get<int64_t>(), " is negative");
  }
  QG_FAIL("safetensors", what, ": tensor '", printable(name), "': ", field, " entry ",
          printable(v.dump()), " is not a non-negative integer");
}

Entry parse_entry(const std::string& name, const json& v, uint64_t buffer_bytes,
                  const std::string& what) {
  const std::string pname = printable(name);
  QG_CHECK(v.is_object(), "safetensors", what, ": tensor '", pname,
           "': entry is not an object: ", printable(v.dump()));
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    QG_CHECK(v.contains(field), "safetensors", what, ": tensor '", pname, "': missing field '",
             field, "'");
  }
  Entry e;
  e.name = name;
  const json& dt = v.at("dtype");
  QG_CHECK(dt.is_string(), "safetensors", what, ": tensor '", pname,
           "': dtype is not a string: ", printable(dt.dump()));
  const auto& dts = dt.get_ref<const std::string&>();
  auto it = std::find_if(std::begin(kDTypes), std::end(kDTypes),
                         [&](const DTypeName& d) { return dts == d.name; });
  QG_CHECK(it != std::end(kDTypes), "safetensors", what, ": tensor '", pname,
           "': unsupported dtype '", printable(dts),
           "' (supported: F32, F16, BF16, I64, F64, I32, I8, U8, BOOL)");
  e.dtype = it->dtype;

  const json& shape = v.at("shape");
  QG_CHECK(shape.is_array(), "safetensors", what, ": tensor '", pname,
           "': shape is not an array: ", printable(shape.dump()));
  // The product of the non-zero dimensions must fit too: a tensor's strides are computed
  // from it even when another dimension is 0.
  uint64_t numel = 1, extent = 1;
  constexpr auto kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  for (const json& d : shape) {
    const uint64_t n = get_unsigned(d, what, name, "shape");
    QG_CHECK(n <= kMax && (n == 0 || extent <= kMax / n / 8), "safetensors", what, ": tensor '",
             pname, "': shape ", printable(shape.dump()), " overflows");
    numel *= n;
    if (n != 0) extent *= n;
    e.shape.push_back(static_cast<int64_t>(n));
  }

  const json& off = v.at("data_offsets");
  QG_CHECK(off.is_array() && off.size() == 2, "safetensors", what, ": tensor '", pname,
           "': data_offsets ", printable(off.dump()), " is not a [begin, end] pair");
  e.begin = get_unsigned(off[0], what, name, "data_offsets");
  e.end = get_unsigned(off[1], what, name, "data_offsets");
  QG_CHECK(e.begin <= e.end, "safetensors", what, ": tensor '", pname, "': data_offsets [", e.begin,
           ", ", e.end, "] are not in order");
  QG_CHECK(e.end <= buffer_bytes, "safetensors", what, ": tensor '", pname, "': data_offsets [",
           e.begin, ", ", e.end, "] end past the data buffer (", buffer_bytes, " bytes)");
  const uint64_t want = numel * dtype_size(e.dtype);
  QG_CHECK(e.end - e.begin == want, "safetensors", what, ": tensor '", pname, "': ", dts, " ",
           shape_str(e.shape), " needs ", want, " bytes but data_offsets [", e.begin, ", ", e.end,
           "] hold ", e.end - e.begin);
  return e;
}

std::string build_header(const std::map<std::string, Tensor>& tensors,
                         const std::map<std::string, std::string>& metadata,
                         std::vector<Tensor>* hosts) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    QG_CHECK(name != "__metadata__", "safetensors", "'__metadata__' cannot name a tensor");
    QG_CHECK(tensor.defined(), "safetensors", "tensor '", printable(name), "' is undefined");
    Tensor host = tensor.device().is_cpu() ? tensor : tensor.to(Device::cpu());
    QG_CHECK(host.is_contiguous(), "safetensors", "tensor '", printable(name),
             "' is not contiguous");
    const uint64_t end = offset + host.nbytes();
    header[name] = {{"dtype", safetensors_dtype_name(host.dtype())},
                    {"shape", host.shape()},
                    {"data_offsets", {offset, end}}};
    offset = end;
    hosts->push_back(std::move(host));
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {
    // dump() rejects strings that are not valid UTF-8.
    QG_FAIL("safetensors", "cannot encode the header: ", printable(e.what()));
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((uint64_t{text.size()} >> (8 * i)) & 0xff);
  return out + text;
}

}  // namespace

const char* safetensors_dtype_name(DType dtype) {
  for (const auto& d : kDTypes) {
    if (d.dtype == dtype) return d.name;
  }
  QG_FAIL("safetensors", "dtype ", dtype_name(dtype), " has no safetensors name");
}

std::map<std::string, Tensor> parse_safetensors(std::string_view bytes, const std::string& what,
                                                std::map<std::string, std::string>* metadata) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  QG_CHECK(bytes.size() >= 8, "safetensors", what, ": file too short (", bytes.size(),
           " bytes) for the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | p[i];
  QG_CHECK(n <= kMaxHeaderBytes, "safetensors", what, ": header length ", n,
           " is absurdly large (limit ", kMaxHeaderBytes, ")");
  QG_CHECK(n <= bytes.size() - 8, "safetensors", what, ": header length ", n,
           " runs past the end of the file (", bytes.size(), " bytes)");
  const std::string_view text = bytes.substr(8, n);
  const uint64_t buffer_bytes = bytes.size() - 8 - n;
  const char* buffer = bytes.data() + 8 + n;

  KeyRecorder keys;
  json header;
  try {
    header = json::parse(text.begin(), text.end(), std::ref(keys));
  } catch (const json::exception& e) {
    QG_FAIL("safetensors", what, ": header is not valid JSON (", printable(e.what()), ")");
  }
  QG_CHECK(header.is_object(), "safetensors", what, ": header is not a JSON object but ",
           header.type_name());
  QG_CHECK(keys.duplicate.empty(), "safetensors", what, ": duplicate tensor name '",
           printable(keys.duplicate), "'");

  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      QG_CHECK(value.is_object(), "safetensors", what,
               ": __metadata__ is not an object: ", printable(value.dump()));
      for (const auto& [k, v] : value.items()) {
        QG_CHECK(v.is_string(), "safetensors", what, ": __metadata__ value of '", printable(k),
                 "' is not a string: ", printable(v.dump()));
        if (metadata) (*metadata)[k] = v.get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(name, value, buffer_bytes, what));
  }

  // Two tensors must not share bytes (empty tensors hold none, so they cannot overlap).
  std::vector<const Entry*> by_offset;
  for (const Entry& e : entries) {
    if (e.end > e.begin) by_offset.push_back(&e);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const Entry* a, const Entry* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const Entry& a = *by_offset[i - 1];
    const Entry& b = *by_offset[i];
    QG_CHECK(b.begin >= a.end, "safetensors", what, ": tensors '", printable(a.name), "' [",
             a.begin, ", ", a.end, ") and '", printable(b.name), "' [", b.begin, ", ", b.end,
             ") overlap");
  }

  std::map<std::string, Tensor> out;
  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    if (e.end > e.begin) std::memcpy(t.raw_data(), buffer + e.begin, e.end - e.begin);
    if (e.dtype == DType::boolean) {
      // Normalise to 0/1 so a stray byte cannot produce an invalid C++ bool.
      auto* b = static_cast<unsigned char*>(t.raw_data());
      for (int64_t i = 0; i < t.numel(); ++i) b[i] = b[i] != 0;
    }
    out.emplace(e.name, std::move(t));
  }
  return out;
}

std::map<std::string, Tensor> load_safetensors(const std::string& path,
                                               std::map<std::string, std::string>* metadata) {
  return parse_safetensors(read_file_bytes(path, "safetensors"), path, metadata);
}

std::string encode_safetensors(const std::map<std::string, Tensor>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  std::vector<Tensor> hosts;
  std::string out = build_header(tensors, metadata, &hosts);
  for (const Tensor& t : hosts) out.append(static_cast<const char*>(t.raw_data()), t.nbytes());
  return out;
}

void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<Tensor> hosts;
  const std::string header = build_header(tensors, metadata, &hosts);
  std::vector<std::pair<const void*, size_t>> chunks{{header.data(), header.size()}};
  for (const Tensor& t : hosts) chunks.emplace_back(t.raw_data(), t.nbytes());
  write_file_replacing(path, "safetensors", chunks);
}

}  // namespace qg
