// `qat op NAME`: runs one op on .npy files. Users debug the quantization of real tensors
// with it, and the conformance suite (tests/conformance/qatop.py) drives every op through
// it, so the interface here and in qatop.py must stay in step.
#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <map>
#include <set>

#include "apps/qat/commands.h"
#include "core/npy.h"
#include "device/device_context.h"
#include "runtime/op_call.h"

namespace qg::cli {
namespace {

struct OpArgs {
  std::string op;
  std::vector<std::string> ins, outs, attrs, states, state_outs;
  bool eval = false;
  bool schema = false;
  std::string device = "cpu";
};

// Splits "NAME=VALUE" (the value may itself contain '=').
std::pair<std::string, std::string> split_pair(const std::string& text, const char* flag) {
  auto eq = text.find('=');
  QG_CHECK(eq != std::string::npos && eq > 0, "qat op", flag, " expects NAME=VALUE, got '", text,
           "'");
  return {text.substr(0, eq), text.substr(eq + 1)};
}

std::map<std::string, std::string> parse_pairs(const std::vector<std::string>& items,
                                               const char* flag) {
  std::map<std::string, std::string> out;
  for (const auto& item : items) {
    auto [k, v] = split_pair(item, flag);
    QG_CHECK(out.emplace(k, v).second, "qat op", flag, " names '", k, "' twice");
  }
  return out;
}

int64_t parse_int(const std::string& op, const std::string& name, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  QG_CHECK(!text.empty() && *end == '\0' && errno == 0, op, "attribute '", name,
           "' expects an integer, got '", text, "'");
  return v;
}

// Parses an attribute's text by the type its schema declares; a name the schema does not
// know is passed on as a string so the registry reports it with the list of known names.
Attr parse_attr(const OpDef& def, const std::string& name, const std::string& text) {
  const AttrSpec* spec = def.find_attr(name);
  if (spec == nullptr) return Attr(text);
  switch (spec->type) {
    case AttrType::integer:
      return Attr(parse_int(def.name, name, text));
    case AttrType::real: {
      char* end = nullptr;
      double v = std::strtod(text.c_str(), &end);
      QG_CHECK(!text.empty() && *end == '\0', def.name, "attribute '", name,
               "' expects a number, got '", text, "'");
      return Attr(v);
    }
    case AttrType::boolean:
      if (text == "true" || text == "1") return Attr(true);
      if (text == "false" || text == "0") return Attr(false);
      QG_FAIL(def.name, "attribute '", name, "' expects true/false/1/0, got '", text, "'");
    case AttrType::string:
      return Attr(text);
    case AttrType::int_list: {
      std::vector<int64_t> v;
      size_t start = 0;
      while (!text.empty() && start <= text.size()) {
        size_t comma = text.find(',', start);
        if (comma == std::string::npos) comma = text.size();
        v.push_back(parse_int(def.name, name, text.substr(start, comma - start)));
        start = comma + 1;
      }
      return Attr(v);
    }
  }
  QG_FAIL(def.name, "attribute '", name, "' has an unhandled type");
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& e : v) s += (s.empty() ? "" : ", ") + e;
  return s.empty() ? "none" : s;
}

void print_schema(const OpDef& def) {
  std::cout << def.name << ": " << def.doc << "\n  inputs:  " << join(def.inputs)
            << "\n  outputs: " << join(def.outputs) << "\n  attributes:\n";
  for (const auto& a : def.attrs) {
    std::cout << "    " << a.name << " (" << attr_type_name(a.type) << ", "
              << (a.default_value ? "default " + a.default_value->str()
                                  : (a.optional ? std::string("optional") : "required"))
              << "): " << a.doc << "\n";
  }
}

void run_op(const OpArgs& a) {
  const OpDef& def = OpRegistry::instance().get(a.op);
  if (a.schema) {
    print_schema(def);
    return;
  }
  QG_CHECK(!def.is_source, "qat op", "'", a.op, "' is a source op and cannot be run alone");
  QG_CHECK(a.device == "cpu" || a.device == "cuda", "qat op", "--device must be cpu or cuda, got '",
           a.device, "'");
  const Device device = a.device == "cuda" ? Device::cuda(0) : Device::cpu();

  // 1. Inputs: every schema input must be given, nothing else.
  auto ins = parse_pairs(a.ins, "--in");
  std::vector<std::string> missing;
  for (const auto& n : def.inputs)
    if (!ins.count(n)) missing.push_back(n);
  QG_CHECK(missing.empty(), a.op, "missing required input(s): ", join(missing),
           " (the op's inputs: ", join(def.inputs), ")");
  for (const auto& [n, p] : ins) {
    bool known = false;
    for (const auto& i : def.inputs) known = known || i == n;
    QG_CHECK(known, a.op, "unknown input '", n, "' (the op's inputs: ", join(def.inputs), ")");
  }
  auto outs = parse_pairs(a.outs, "--out");
  std::map<std::string, int> out_index;
  for (const auto& [n, p] : outs) {
    int idx = -1;
    for (size_t i = 0; i < def.outputs.size(); ++i)
      if (def.outputs[i] == n) idx = static_cast<int>(i);
    QG_CHECK(idx >= 0, a.op, "unknown output '", n, "' (the op's outputs: ", join(def.outputs),
             ")");
    out_index[n] = idx;
  }
  Attrs attrs;
  for (const auto& [k, v] : parse_pairs(a.attrs, "--attr")) attrs.set(k, parse_attr(def, k, v));

  // 2. The op prepared for the files' types, called directly (no graph, no executor).
  std::vector<Tensor> inputs;
  std::vector<TensorType> types;
  for (const auto& n : def.inputs) {
    Tensor t = load_npy(ins.at(n));
    types.push_back(TensorType{t.dtype(), t.shape()});
    inputs.push_back(t.to(device));
  }
  PreparedOp op(a.op, attrs, types, device.type);
  std::unique_ptr<DeviceContext> context = make_device_context(device);

  // 3. Initial state from files, checked against the StateSpec exactly.
  const std::vector<StateSpec>& specs = op.state_specs();
  std::vector<Tensor> states = op.initial_states(device);
  std::vector<std::string> state_names;
  for (const auto& s : specs) state_names.push_back(s.name);
  auto find_spec = [&](const std::string& n) -> size_t {
    for (size_t k = 0; k < specs.size(); ++k)
      if (specs[k].name == n) return k;
    QG_FAIL(a.op, "unknown state '", n, "' (the op's states: ", join(state_names), ")");
  };
  auto state_outs = parse_pairs(a.state_outs, "--state-out");
  for (const auto& [n, p] : state_outs) find_spec(n);
  for (const auto& [n, p] : parse_pairs(a.states, "--state")) {
    const StateSpec& spec = specs[find_spec(n)];
    Tensor t = load_npy(p);
    QG_CHECK(t.dtype() == spec.type.dtype && t.shape() == spec.type.shape, a.op, "state '", n,
             "' must be ", spec.type.str(), " but '", p, "' holds ", dtype_name(t.dtype()),
             shape_str(t.shape()));
    states[find_spec(n)] = t.to(device);
  }

  // 4. Run and write the results.
  std::vector<Tensor> got = op.run(*context, inputs, states, !a.eval);
  context->check_errors(nullptr);
  for (const auto& [n, idx] : out_index) save_npy(outs.at(n), got[idx].to(Device::cpu()));
  for (const auto& [n, p] : state_outs) save_npy(p, states[find_spec(n)].to(Device::cpu()));
}

}  // namespace

void add_op_command(CLI::App& app) {
  auto a = std::make_shared<OpArgs>();
  auto* cmd = app.add_subcommand(
      "op",
      "Run one op on .npy files.\n"
      "Inputs, outputs and states are named as in the op's schema (see --schema). Every op\n"
      "input must be given with --in; each becomes a graph input whose dtype and shape come\n"
      "from its file. Attributes are parsed by their declared type: int, float, bool\n"
      "(true/false/1/0), string, int list (comma-separated, e.g. axes=0,2). --state loads a\n"
      "state's initial value (dtype and shape must match the op's state exactly); --state-out\n"
      "writes a state after the run. Runs in training mode unless --eval. .npy files:\n"
      "little-endian f32, f64, f16, i8, u8, i32, i64, bool, C order.\n"
      "Errors are printed and exit with status 2.\n"
      "Example: qat op fake_quantize --in x=x.npy --in scale=s.npy --in zero_point=z.npy\n"
      "           --out y=y.npy --attr bits=8 --attr scope=channel --attr axis=-1");
  cmd->add_option("name", a->op, "The op to run (a registered op name)")->required();
  cmd->add_option("--in", a->ins, "NAME=PATH.npy: an op input")->type_name("NAME=PATH");
  cmd->add_option("--out", a->outs, "NAME=PATH.npy: an op output to write")->type_name("NAME=PATH");
  cmd->add_option("--attr", a->attrs, "k=v: an attribute, parsed by its schema type")
      ->type_name("K=V");
  cmd->add_option("--state", a->states, "NAME=PATH.npy: initial value of a state")
      ->type_name("NAME=PATH");
  cmd->add_option("--state-out", a->state_outs, "NAME=PATH.npy: write a state after the run")
      ->type_name("NAME=PATH");
  cmd->add_flag("--eval", a->eval, "Run in evaluation mode (default: training)");
  cmd->add_option("--device", a->device, "cpu (default) or cuda")->capture_default_str();
  cmd->add_flag("--schema", a->schema, "Print the op's inputs, outputs and attributes and exit");
  cmd->callback([a] { run_op(*a); });
}

}  // namespace qg::cli
