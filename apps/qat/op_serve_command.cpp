// `qat op-serve`: runs many `qat op` calls in one process. Each line of stdin is one call's
// arguments (what follows `qat op`) as a JSON array of strings; each answer is one line of
// stdout, a JSON object {"rc": exit status, "stdout": text, "stderr": text}, exactly what
// the call would have printed and returned as its own process. The conformance suite
// (tests/conformance/qatop.py) sends its thousands of cases through it: starting a process
// costs about 0.1 s (most of it the CUDA libraries' load-time initialisation), the op itself
// microseconds.
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "apps/qat/commands.h"
#include "core/error.h"

namespace qg::cli {
namespace {

// One call, parsed and run as `main` would run `qat op ARGS...`.
nlohmann::json run_one(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  int rc = 0;
  std::streambuf* saved_out = std::cout.rdbuf(out.rdbuf());
  std::streambuf* saved_err = std::cerr.rdbuf(err.rdbuf());
  try {
    CLI::App app{"qat"};
    app.require_subcommand(1);
    add_op_command(app);
    std::vector<std::string> argv_text{"qat", "op"};
    argv_text.insert(argv_text.end(), args.begin(), args.end());
    std::vector<const char*> argv;
    for (const auto& a : argv_text) argv.push_back(a.c_str());
    try {
      app.parse(static_cast<int>(argv.size()), argv.data());
    } catch (const CLI::ParseError& e) {
      rc = app.exit(e, out, err);
    }
  } catch (const std::exception& e) {  // qg::Error included, as in main
    err << "error: " << e.what() << "\n";
    rc = 2;
  }
  std::cout.rdbuf(saved_out);
  std::cerr.rdbuf(saved_err);
  return {{"rc", rc}, {"stdout", out.str()}, {"stderr", err.str()}};
}

void serve() {
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    nlohmann::json request = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    nlohmann::json answer;
    if (!request.is_array()) {
      answer = {{"rc", 2},
                {"stdout", ""},
                {"stderr", "error: qat op-serve: a request is one JSON array of strings, got '" +
                               line.substr(0, 200) + "'\n"}};
    } else {
      std::vector<std::string> args;
      bool strings = true;
      for (const auto& a : request) {
        if (!a.is_string())
          strings = false;
        else
          args.push_back(a.get<std::string>());
      }
      answer = strings ? run_one(args)
                       : nlohmann::json{{"rc", 2},
                                        {"stdout", ""},
                                        {"stderr",
                                         "error: qat op-serve: every argument must be "
                                         "a JSON string\n"}};
    }
    std::cout << answer.dump() << std::endl;  // flushed: the client waits for this line
  }
}

}  // namespace

void add_op_serve_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "op-serve",
      "Run many `qat op` calls in one process: read one JSON array of arguments per line of\n"
      "stdin (the arguments after `qat op`), answer each with one JSON line\n"
      "{\"rc\": status, \"stdout\": text, \"stderr\": text}. Ends at the end of stdin.\n"
      "Example: echo '[\"fake_quantize\", \"--schema\"]' | qat op-serve");
  cmd->callback([] { serve(); });
}

}  // namespace qg::cli
