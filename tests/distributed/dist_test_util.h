// Helpers of the data-parallel tests: scratch folders, the files the worker ranks write, and
// the launch of N dist_worker ranks (tests/distributed/dist_worker.cpp).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "runtime/distributed/launch.h"
#include "runtime/distributed/process_group.h"

namespace qg::testing {

inline std::string scratch(const std::string& name) {
  std::string dir = ::testing::TempDir() + "qg_dist_" + name + "_" + std::to_string(::getpid());
  std::string cmd = "rm -rf '" + dir + "' && mkdir -p '" + dir + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  return dir;
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

inline std::vector<std::string> lines_of(const std::string& path) {
  std::vector<std::string> out;
  std::istringstream is(read_file(path));
  for (std::string l; std::getline(is, l);) out.push_back(l);
  return out;
}

// Runs `nproc` workers; returns the launcher's result.
inline dist::LaunchResult run_workers(int nproc, const std::vector<std::string>& args,
                                      std::chrono::milliseconds grace = std::chrono::seconds(60),
                                      std::vector<std::pair<std::string, std::string>> env = {}) {
  dist::LocalLaunch l;
  l.argv = {QG_DIST_WORKER};
  l.argv.insert(l.argv.end(), args.begin(), args.end());
  l.nproc = nproc;
  l.grace = grace;
  l.env = std::move(env);
  l.env.push_back({"QG_NUM_THREADS", "1"});  // CI has two cores for up to three ranks
  return dist::launch_local(l);
}

inline std::string result_file(const std::string& dir, const std::string& stem, int world,
                               int rank) {
  return dir + "/" + stem + "_w" + std::to_string(world) + "_r" + std::to_string(rank) + ".txt";
}

}  // namespace qg::testing

#define SKIP_WITHOUT_GLOO() \
  if (!::qg::dist::built_with_gloo()) GTEST_SKIP() << "built without Gloo (libgloo-dev)"
