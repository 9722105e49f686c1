// `qat bench`: our side of the PERF.md comparison. Times every case (fused and unfused where
// the fusion pass applies) against a device copy of the same bytes in the same run, prints
// one table, and can write it as CSV, JSON and a PNG chart of the ratios.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>

#include "apps/qat/commands.h"
#include "bench/harness/perf_cases.h"
#include "core/thread_pool.h"
#include "runtime/backend.h"
#include "train/png_plot.h"

namespace qg::cli {

namespace {

struct BenchOptions {
  std::string device = "auto";
  bool quick = false, fused_only = false;
  int reps = 50;
  std::vector<int64_t> shape;
  std::string filter, csv, json, png;
};

void write_outputs(const BenchOptions& o, const std::vector<bench::Measurement>& rows) {
  if (!o.csv.empty()) {
    std::ofstream f(o.csv);
    f << "case,variant,us,copy_us,x_copy,kernels,moved_bytes,pool_copy_us,pool_copy_moved_us\n";
    for (const auto& m : rows)
      f << '"' << m.case_label << "\"," << m.variant << ',' << m.us << ',' << m.copy_us << ','
        << m.ratio() << ',' << m.kernels << ',' << m.moved_bytes << ',' << m.pool_copy_us << ','
        << m.pool_copy_moved_us << '\n';
    if (!f) QG_FAIL("bench", "could not write ", o.csv);
  }
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    f << "[\n";
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto& m = rows[i];
      f << "  {\"case\": \"" << m.case_label << "\", \"variant\": \"" << m.variant
        << "\", \"us\": " << m.us << ", \"copy_us\": " << m.copy_us << ", \"x_copy\": " << m.ratio()
        << ", \"kernels\": " << m.kernels << ", \"moved_bytes\": " << m.moved_bytes
        << ", \"pool_copy_us\": " << m.pool_copy_us
        << ", \"pool_copy_moved_us\": " << m.pool_copy_moved_us << "}"
        << (i + 1 < rows.size() ? "," : "") << "\n";
    }
    f << "]\n";
    if (!f) QG_FAIL("bench", "could not write ", o.json);
  }
  if (!o.png.empty()) {
    nn::Panel panel{"time / device copy, per case (x = case number in the table)", {}};
    std::map<std::string, nn::Series> by_variant;
    for (const auto& m : rows) {
      auto& s = by_variant[m.variant];
      s.label = m.variant == "-" ? "single op" : m.variant;
      s.y.push_back(m.ratio());
    }
    for (auto& [v, s] : by_variant) panel.series.push_back(s);
    nn::write_plot_png(o.png, {panel});
  }
}

// Empty filter: everything; else any of the '|'-separated texts.
bool matches_filter(const std::string& label, const std::string& filter) {
  if (filter.empty()) return true;
  size_t start = 0;
  for (;;) {
    const size_t bar = filter.find('|', start);
    const std::string part = filter.substr(start, bar == std::string::npos ? bar : bar - start);
    if (!part.empty() && label.find(part) != std::string::npos) return true;
    if (bar == std::string::npos) return false;
    start = bar + 1;
  }
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "bench", "Time the PERF.md cases against a device copy (fused and unfused)");
  auto o = std::make_shared<BenchOptions>();
  cmd->add_option("--device", o->device, "cpu, cuda or auto (cuda when present)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  cmd->add_flag("--quick", o->quick, "Small shapes only (a smoke run)");
  cmd->add_option("--reps", o->reps, "Timed launches per case (median reported)")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--filter", o->filter,
                  "Only cases whose label contains this text (several texts: separate by '|')");
  cmd->add_option("--shape", o->shape, "Replace the 2-D case shapes, e.g. --shape 8192,4096")
      ->delimiter(',')
      ->expected(2);
  cmd->add_flag("--fused-only", o->fused_only, "Time fusable cases fused only");
  cmd->add_option("--csv", o->csv, "Write the table as CSV");
  cmd->add_option("--json", o->json, "Write the table as JSON");
  cmd->add_option("--png", o->png, "Write a PNG chart of the ratios");
  cmd->callback([o] {
    Device device = Device::cpu();
    if (o->device == "cuda" || (o->device == "auto" && cuda_available())) device = Device::cuda();
    auto backend = make_backend(device);  // brings up the device (allocator, stream) first
    std::printf(
        "qat bench on %s (%s, %d CPU threads), median of %d launches; ratio = time / "
        "device copy of x\n",
        device.str().c_str(), o->quick ? "quick shapes" : "PERF.md shapes", num_threads(), o->reps);
    // On the CPU also: the thread-pool copies of x's bytes (pool) and of the bytes the
    // kernels move (mcopy, see bench::Measurement), and the achieved bandwidths.
    const bool cpu = device.is_cpu();
    if (cpu)
      std::printf(
          "pool = thread-pool copy of x in the kernels' chunks; mcopy = the same copy of the "
          "bytes the case's kernels read + write; GB/s = those bytes / time\n");
    std::printf("%-46s %-8s %10s %10s %7s %7s", "case", "variant", "us", "copy us", "x copy",
                "kernels");
    if (cpu)
      std::printf(" %10s %7s %9s %7s %10s %7s %7s", "pool us", "x pool", "moved MB", "GB/s",
                  "mcopy us", "x mcopy", "mc GB/s");
    std::printf("\n");
    std::vector<bench::Measurement> rows;
    for (const auto& c : bench::perf_cases(device.type, o->quick, o->shape)) {
      if (!matches_filter(c.label(), o->filter)) continue;
      try {
        for (const auto& m : bench::measure(c, device, o->reps, o->fused_only)) {
          std::printf("%-46s %-8s %10.2f %10.2f %7.2f %7d", m.case_label.c_str(), m.variant.c_str(),
                      m.us, m.copy_us, m.ratio(), m.kernels);
          if (cpu)
            std::printf(" %10.2f %7.2f %9.1f %7.2f %10.2f %7.2f %7.2f", m.pool_copy_us,
                        m.us / m.pool_copy_us, m.moved_bytes / 1e6, m.gbps(), m.pool_copy_moved_us,
                        m.us / m.pool_copy_moved_us, m.moved_bytes / m.pool_copy_moved_us / 1e3);
          std::printf("\n");
          rows.push_back(m);
        }
      } catch (const Error& e) {
        std::printf("%-46s skipped: %s\n", c.label().c_str(), e.what());
      }
      std::fflush(stdout);
    }
    write_outputs(*o, rows);
  });
}

}  // namespace qg::cli
