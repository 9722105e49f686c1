// Line plots written as PNG without third-party plotting: series are drawn into an RGB pixel
// buffer (Bresenham lines, a 3x5 pixel font for labels) and encoded with zlib (one IDAT
// chunk, filter 0 per row, CRC32 per chunk as the PNG specification requires).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qg::nn {

struct Series {
  std::string label;
  std::vector<double> y;  // y[i] is plotted at x = x0 + i (epochs)
  int x0 = 1;
};

struct Panel {
  std::string title;
  std::vector<Series> series;
  std::string x_label = "EPOCH";
};

// Side-by-side panels, each with its own y range; writes `path` atomically.
void write_plot_png(const std::string& path, const std::vector<Panel>& panels);

// The PNG byte stream of an RGB image (width * height * 3 bytes).
std::string encode_png(int width, int height, const std::vector<uint8_t>& rgb);

}  // namespace qg::nn
