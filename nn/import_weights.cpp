#include "nn/import_weights.h"

#include <cmath>
#include <sstream>

#include "core/allocator.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/npz.h"
#include "core/printable.h"
#include "core/safetensors.h"

namespace qg::nn {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool has_component(const std::string& name, const std::string& component) {
  return name == component || name.rfind(component + ".", 0) == 0 ||
         ends_with(name, "." + component) || name.find("." + component + ".") != std::string::npos;
}

std::string join(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

std::string type_str(const Tensor& t) {
  return std::string(dtype_name(t.dtype())) + shape_str(t.shape());
}

// The file tensor converted to the parameter's dtype, or an undefined tensor and `problem` set.
Tensor convert(const Tensor& src, DType want, std::string* problem) {
  if (is_floating(want) && is_floating(src.dtype())) {
    Tensor t = src.dtype() == want ? src : src.cast(want);
    int64_t bad = 0;
    for (double v : t.to_doubles()) bad += std::isfinite(v) ? 0 : 1;
    if (bad > 0) {
      *problem = std::to_string(bad) + " of its " + std::to_string(t.numel()) +
                 " values are not finite in " + dtype_name(want) +
                 (src.dtype() == DType::f64 ? " (NaN, Inf, or beyond the f32 range)" : "");
      return Tensor();
    }
    return t;
  }
  if (src.dtype() == want) return src;  // integer and bool: only the same dtype
  *problem = std::string("dtype ") + dtype_name(src.dtype()) + " cannot load into a " +
             dtype_name(want) + " parameter (floating tensors convert to a floating parameter; " +
             "integer and bool tensors need the same dtype)";
  return Tensor();
}

}  // namespace

NameMatch torch_name_match(const std::string& file_name) {
  std::string name = file_name;
  if (name.rfind("module.", 0) == 0) name = name.substr(7);  // DataParallel / DDP wrapper
  NameMatch m;
  if (ends_with(name, ".num_batches_tracked") || name == "num_batches_tracked") {
    m.ignore_reason =
        "BatchNorm's batch counter: torch reads it only when momentum is None, "
        "our batch_norm always uses momentum 0.1";
    return m;
  }
  if (has_component(name, "activation_post_process") || has_component(name, "weight_fake_quant")) {
    m.ignore_reason = "observer / fake-quant state: qparams come from calibration or QAT";
    return m;
  }
  m.candidates.push_back(name);
  auto replace_suffix = [&](const std::string& from, const std::string& to) {
    if (ends_with(name, from))
      m.candidates.push_back(name.substr(0, name.size() - from.size()) + to);
  };
  replace_suffix(".conv.weight", ".weight");  // a module holding .conv and .bn
  // fuse_modules' sequentials: index 0 the conv/linear, 1 the batch norm (2 the ReLU).
  const size_t dot = name.rfind('.');
  if (dot != std::string::npos) {
    const std::string head = name.substr(0, dot), leaf = name.substr(dot);
    if (ends_with(head, ".0")) m.candidates.push_back(head.substr(0, head.size() - 2) + leaf);
    if (ends_with(head, ".1") && head.size() > 2)
      m.candidates.push_back(head.substr(0, head.size() - 2) + ".bn" + leaf);
  }
  return m;
}

NameMapper name_table(std::map<std::string, std::string> table, NameMapper fallback) {
  return [table = std::move(table), fallback = std::move(fallback)](const std::string& file_name) {
    auto it = table.find(file_name);
    if (it == table.end()) return fallback(file_name);
    NameMatch m;
    if (it->second.empty())
      m.ignore_reason = "ignored by the name table";
    else
      m.candidates.push_back(it->second);
    return m;
  };
}

std::string ImportReport::summary() const {
  std::ostringstream os;
  os << "imported " << loaded.size() << " tensors";
  size_t renamed = 0;
  for (const auto& [file, model] : loaded) renamed += file != model ? 1 : 0;
  if (renamed) os << " (" << renamed << " renamed)";
  if (!ignored.empty()) {
    // Group by reason: a CNN's batch norms give one num_batches_tracked each.
    std::map<std::string, std::vector<std::string>> by_reason;
    for (const auto& [file, reason] : ignored) by_reason[reason].push_back(file);
    os << "; ignored " << ignored.size() << ":";
    for (const auto& [reason, files] : by_reason)
      os << "\n  " << join(files, ", ") << " (" << reason << ")";
  }
  return os.str();
}

std::map<std::string, Tensor> read_weight_file(const std::string& path) {
  const std::string bytes = read_file_bytes(path, "nn.import");
  bool npz;
  if (ends_with(path, ".npz"))
    npz = true;
  else if (ends_with(path, ".safetensors"))
    npz = false;
  else  // a ZIP local-file header, or the end record of an empty archive
    npz = bytes.rfind("PK\x03\x04", 0) == 0 || bytes.rfind("PK\x05\x06", 0) == 0;
  try {
    return npz ? parse_npz(bytes, path) : parse_safetensors(bytes, path);
  } catch (const Error& e) {
    QG_FAIL("nn.import", "cannot read weights from '", printable(path), "' as ",
            npz ? ".npz" : "safetensors", ": [", e.op(), "] ", e.message());
  }
}

ImportReport import_weights(Executor& exec, const std::map<std::string, Tensor>& tensors,
                            const NameMapper& mapper, const std::string& what) {
  const Graph& g = exec.graph();
  std::map<std::string, NodeId> params;  // every live parameter node, by value name
  for (NodeId id : g.parameters()) params[g.value(g.node(id).outputs[0]).name] = id;

  ImportReport report;
  std::vector<std::string> unmatched, conflicts, mismatches;
  std::map<std::string, std::string> claimed;  // model name -> file name
  std::vector<std::pair<NodeId, Tensor>> updates;
  for (const auto& [file_name, tensor] : tensors) {
    NameMatch m = mapper(file_name);
    if (!m.ignore_reason.empty()) {
      report.ignored.emplace_back(file_name, m.ignore_reason);
      continue;
    }
    std::string target;
    for (const std::string& c : m.candidates)
      if (params.count(c)) {
        target = c;
        break;
      }
    if (target.empty()) {
      std::string tried;
      if (m.candidates.size() != 1 || m.candidates[0] != file_name)
        tried = " (tried " + join(m.candidates, ", ") + ")";
      unmatched.push_back("'" + printable(file_name) + "'" + tried);
      continue;
    }
    auto [it, fresh] = claimed.emplace(target, file_name);
    if (!fresh) {
      conflicts.push_back("'" + printable(it->second) + "' and '" + printable(file_name) +
                          "' both map to '" + target + "'");
      continue;
    }
    const NodeId id = params.at(target);
    const Tensor& dst = exec.state(id, "value");
    const std::string as = target == file_name ? "" : " (as '" + target + "')";
    if (tensor.shape() != dst.shape()) {
      mismatches.push_back("'" + printable(file_name) + "'" + as + ": the file holds " +
                           type_str(tensor) + ", the model needs " + type_str(dst));
      continue;
    }
    std::string problem;
    Tensor converted = convert(tensor, dst.dtype(), &problem);
    if (!problem.empty()) {
      mismatches.push_back("'" + printable(file_name) + "'" + as + " (" + type_str(tensor) +
                           "): " + problem);
      continue;
    }
    updates.emplace_back(id, converted);
    report.loaded.emplace_back(file_name, target);
  }
  std::vector<std::string> missing;
  for (const auto& [name, id] : params)
    if (!claimed.count(name)) missing.push_back(name + " " + type_str(exec.state(id, "value")));

  if (!unmatched.empty() || !conflicts.empty() || !mismatches.empty() || !missing.empty()) {
    std::ostringstream os;
    os << "cannot import " << what << " (" << tensors.size() << " tensors) into a model of "
       << params.size() << " parameters; nothing was changed:";
    auto section = [&](const std::vector<std::string>& items, const std::string& title) {
      if (items.empty()) return;
      os << "\n  " << items.size() << ' ' << title << ":";
      for (const std::string& s : items) os << "\n    " << s;
    };
    section(unmatched, "file tensor(s) match no model parameter");
    section(missing, "model parameter(s) missing from the file");
    section(mismatches, "shape/dtype mismatch(es)");
    section(conflicts, "name conflict(s)");
    QG_FAIL("nn.import", os.str());
  }
  // Everything validated: commit, into each parameter's own buffer rather than a new one: a
  // compiled step's static run binds the state buffers once (and executors may share them),
  // so a replaced buffer would go unseen.
  for (auto& [id, t] : updates) {
    Tensor& dst = exec.state(id, "value");
    const Tensor src = t.is_contiguous() ? t : t.clone();
    copy_bytes(dst.raw_data(), dst.device(), src.raw_data(), src.device(), dst.nbytes());
  }
  return report;
}

ImportReport import_weights_file(Executor& exec, const std::string& path,
                                 const NameMapper& mapper) {
  return import_weights(exec, read_weight_file(path), mapper, "'" + printable(path) + "'");
}

}  // namespace qg::nn
