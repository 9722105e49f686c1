// qat: the qatgraph command-line program.
#include <iostream>

#include "apps/qat/commands.h"
#include "core/error.h"
#include "core/thread_pool.h"

int main(int argc, char** argv) {
  CLI::App app{"qat - quantization-aware training engine (qatgraph)"};
  app.require_subcommand(1);
  // A global option, accepted before or after the subcommand (subcommands inherit
  // fallthrough); its callback runs before the subcommand's.
  app.fallthrough();
  app.add_option_function<int>(
         "--threads", [](int n) { qg::set_num_threads(n); },
         "CPU threads for the CPU backend's kernels (default: QG_NUM_THREADS, else the CPUs "
         "this process may run on); results are identical for every count")
      ->check(CLI::Range(1, 4096));
  qg::cli::add_gradcheck_command(app);
  qg::cli::add_op_command(app);
  qg::cli::add_op_serve_command(app);
  qg::cli::add_crosscheck_command(app);
  qg::cli::add_train_command(app);
  qg::cli::add_bench_command(app);
  qg::cli::add_memplan_command(app);
  qg::cli::add_layer_command(app);
  qg::cli::add_steps_command(app);
  qg::cli::add_export_command(app);
  qg::cli::add_llama_logits_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const qg::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
