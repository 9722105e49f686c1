// Each `qat` subcommand lives in its own file and registers itself on the app here.
#pragma once

#include <CLI/CLI.hpp>

namespace qg::cli {

void add_gradcheck_command(CLI::App& app);
void add_op_command(CLI::App& app);
void add_op_serve_command(CLI::App& app);
void add_crosscheck_command(CLI::App& app);
void add_train_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_memplan_command(CLI::App& app);
void add_layer_command(CLI::App& app);
void add_steps_command(CLI::App& app);
void add_export_command(CLI::App& app);
void add_llama_logits_command(CLI::App& app);

}  // namespace qg::cli
