// qat: the qatgraph command-line program.
#include <iostream>

#include "apps/qat/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"qat - quantization-aware training engine (qatgraph)"};
  app.require_subcommand(1);
  qg::cli::add_gradcheck_command(app);
  qg::cli::add_op_command(app);
  qg::cli::add_crosscheck_command(app);
  qg::cli::add_train_command(app);
  qg::cli::add_bench_command(app);
  qg::cli::add_memplan_command(app);
  qg::cli::add_layer_command(app);
  qg::cli::add_steps_command(app);
  qg::cli::add_export_command(app);
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
