#include "train/png_plot.h"

#include <zlib.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "train/checkpoint.h"

namespace qg::nn {
namespace {

void put_u32be(std::string& s, uint32_t v) {
  for (int i = 3; i >= 0; --i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void chunk(std::string& png, const char* type, const std::string& data) {
  put_u32be(png, static_cast<uint32_t>(data.size()));
  std::string td = std::string(type, 4) + data;
  png += td;
  put_u32be(png, static_cast<uint32_t>(crc32(crc32(0L, Z_NULL, 0),
                                             reinterpret_cast<const Bytef*>(td.data()),
                                             static_cast<uInt>(td.size()))));
}

// 3x5 glyphs, one bit per pixel, rows top to bottom, 3 bits per row (MSB = left).
int glyph(char c) {
  switch (c) {
    case '0':
      return 0x7B6F;  // 111 101 101 101 111
    case '1':
      return 0x2C97;  // 010 110 010 010 111
    case '2':
      return 0x73E7;  // 111 001 111 100 111
    case '3':
      return 0x73CF;  // 111 001 111 001 111
    case '4':
      return 0x5BC9;  // 101 101 111 001 001
    case '5':
      return 0x79CF;  // 111 100 111 001 111
    case '6':
      return 0x79EF;  // 111 100 111 101 111
    case '7':
      return 0x7249;  // 111 001 001 001 001
    case '8':
      return 0x7BEF;  // 111 101 111 101 111
    case '9':
      return 0x7BCF;  // 111 101 111 001 111
    case '.':
      return 0x0002;  // 000 000 000 000 010
    case '%':
      return 0x4A89;  // 100 101 010 001 001 (approximate)
    case '-':
      return 0x01C0;  // 000 000 111 000 000
    case 'V':
      return 0x5B6A;  // 101 101 101 101 010
    case 'A':
      return 0x2BED;  // 010 101 111 101 101
    case 'C':
      return 0x7927;  // 111 100 100 100 111
    case 'F':
      return 0x79E4;  // 111 100 111 100 100
    case 'L':
      return 0x4927;  // 100 100 100 100 111
    case 'N':
      return 0x7B6D;  // 111 101 101 101 101
    case 'O':
      return 0x7B6F;
    case 'P':
      return 0x7BE4;  // 111 101 111 100 100
    case 'Q':
      return 0x7B73;  // 111 101 101 110 011
    case 'S':
      return 0x79CF;
    case 'T':
      return 0x7492;  // 111 010 010 010 010
    case 'W':
      return 0x5B7D;  // 101 101 101 111 101
    case 'E':
      return 0x79E7;  // 111 100 111 100 111
    case 'R':
      return 0x7BF5;  // 111 101 111 110 101
    case 'U':
      return 0x5B6F;  // 101 101 101 101 111
    case 'Y':
      return 0x5A92;  // 101 101 010 010 010
    case 'I':
      return 0x7497;  // 111 010 010 010 111
    case 'D':
      return 0x6B6E;  // 110 101 101 101 110
    case 'X':
      return 0x5AAD;  // 101 101 010 101 101
    case 'G':
      return 0x796F;  // 111 100 101 101 111
    case 'H':
      return 0x5BED;  // 101 101 111 101 101
    case 'M':
      return 0x5FED;  // 101 111 111 101 101
    case 'K':
      return 0x5BAD;  // 101 101 110 101 101 (approximate)
    case '(':
      return 0x2922;  // 010 100 100 100 010
    case ')':
      return 0x224A;  // 010 001 001 001 010
    case 'B':
      return 0x6BAE;  // 110 101 110 101 110
    default:
      return 0;
  }
}

class Canvas {
 public:
  Canvas(int w, int h) : w_(w), h_(h), rgb_(static_cast<size_t>(w * h * 3), 255) {}
  void set(int x, int y, const uint8_t* c) {
    if (x < 0 || y < 0 || x >= w_ || y >= h_) return;
    std::copy(c, c + 3, rgb_.begin() + (static_cast<size_t>(y) * w_ + x) * 3);
  }
  void line(int x0, int y0, int x1, int y1, const uint8_t* c, int thick = 1) {
    int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0);
    int sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1, err = dx + dy;
    for (;;) {
      for (int t = 0; t < thick; ++t) {
        set(x0, y0 + t, c);
        set(x0 + t, y0, c);
      }
      if (x0 == x1 && y0 == y1) break;
      int e2 = 2 * err;
      if (e2 >= dy) err += dy, x0 += sx;
      if (e2 <= dx) err += dx, y0 += sy;
    }
  }
  void text(int x, int y, const std::string& s, const uint8_t* c, int scale = 2) {
    for (char ch : s) {
      int g = glyph(static_cast<char>(std::toupper(static_cast<unsigned char>(ch))));
      for (int r = 0; r < 5; ++r)
        for (int col = 0; col < 3; ++col)
          if (g & (1 << (14 - (r * 3 + col))))
            for (int a = 0; a < scale; ++a)
              for (int b = 0; b < scale; ++b) set(x + col * scale + a, y + r * scale + b, c);
      x += 4 * scale;
    }
  }
  const std::vector<uint8_t>& rgb() const { return rgb_; }

 private:
  int w_, h_;
  std::vector<uint8_t> rgb_;
};

const uint8_t kColors[][3] = {{31, 119, 180}, {255, 127, 14},  {44, 160, 44},
                              {214, 39, 40},  {148, 103, 189}, {140, 86, 75}};
const uint8_t kBlack[3] = {0, 0, 0};
const uint8_t kGrey[3] = {200, 200, 200};

std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, std::fabs(v) >= 10 ? "%.0f" : "%.3g", v);
  return b;
}

void draw_panel(Canvas& cv, int x0, int y0, int w, int h, const Panel& p) {
  const int left = x0 + 60, right = x0 + w - 20, top = y0 + 40, bottom = y0 + h - 40;
  double lo = INFINITY, hi = -INFINITY;
  int x_first = INT32_MAX, x_last = INT32_MIN;
  for (const auto& s : p.series) {
    for (double v : s.y)
      if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
    if (s.y.empty()) continue;
    x_first = std::min(x_first, s.x0);
    x_last = std::max(x_last, s.x0 + static_cast<int>(s.y.size()) - 1);
  }
  if (x_first > x_last) x_first = x_last = 1;
  if (!(lo <= hi)) lo = 0, hi = 1;
  if (hi - lo < 1e-12) hi = lo + 1;
  cv.text(left, y0 + 12, p.title, kBlack);
  for (int k = 0; k <= 4; ++k) {  // horizontal grid with value labels
    int y = bottom - (bottom - top) * k / 4;
    cv.line(left, y, right, y, kGrey);
    cv.text(x0 + 4, y - 5, fmt(lo + (hi - lo) * k / 4), kBlack);
  }
  cv.line(left, top, left, bottom, kBlack);
  cv.line(left, bottom, right, bottom, kBlack);
  cv.text(right - 24, bottom + 12, std::to_string(x_last), kBlack);
  cv.text(left, bottom + 12, std::to_string(x_first), kBlack);
  cv.text((left + right) / 2 - 20, bottom + 12, p.x_label, kBlack);
  const double span = x_last > x_first ? double(x_last - x_first) : 1.0;
  auto px = [&](int x) {
    return left + static_cast<int>((right - left) * double(x - x_first) / span);
  };
  auto py = [&](double v) {
    return bottom - static_cast<int>((bottom - top) * (v - lo) / (hi - lo));
  };
  // The legend goes in the corner the curves leave empty: bottom right when the first
  // series ends in the upper half (rising accuracy), top right otherwise (falling loss).
  bool legend_low =
      !p.series.empty() && !p.series[0].y.empty() && p.series[0].y.back() > (lo + hi) / 2;
  const int legend_top = legend_low ? bottom - 8 - 14 * static_cast<int>(p.series.size()) : top;
  for (size_t si = 0; si < p.series.size(); ++si) {
    const uint8_t* c = kColors[si % 6];
    const auto& y = p.series[si].y;
    const int x0 = p.series[si].x0;
    for (size_t i = 1; i < y.size(); ++i)
      if (std::isfinite(y[i - 1]) && std::isfinite(y[i]))
        cv.line(px(x0 + int(i) - 1), py(y[i - 1]), px(x0 + int(i)), py(y[i]), c, 2);
    if (y.size() == 1 && std::isfinite(y[0]))
      cv.line(px(x0), py(y[0]) - 2, px(x0), py(y[0]) + 2, c, 2);
    const int ly = legend_top + 8 + 14 * static_cast<int>(si);
    cv.line(right - 150, ly, right - 130, ly, c, 2);
    cv.text(right - 124, ly - 5, p.series[si].label, c);
  }
}

}  // namespace

std::string encode_png(int width, int height, const std::vector<uint8_t>& rgb) {
  QG_CHECK(width > 0 && height > 0 && rgb.size() == static_cast<size_t>(width) * height * 3, "png",
           "image ", width, "x", height, " needs ", width * height * 3, " bytes, got ", rgb.size());
  std::string raw;
  raw.reserve(static_cast<size_t>(height) * (width * 3 + 1));
  for (int y = 0; y < height; ++y) {
    raw.push_back(0);  // filter type 0 (none)
    raw.append(reinterpret_cast<const char*>(rgb.data()) + static_cast<size_t>(y) * width * 3,
               static_cast<size_t>(width) * 3);
  }
  uLongf cap = compressBound(static_cast<uLong>(raw.size()));
  std::string z(cap, '\0');
  int rc = compress2(reinterpret_cast<Bytef*>(&z[0]), &cap,
                     reinterpret_cast<const Bytef*>(raw.data()), static_cast<uLong>(raw.size()), 9);
  QG_CHECK(rc == Z_OK, "png", "zlib compress2 failed with code ", rc);
  z.resize(cap);
  std::string png("\x89PNG\r\n\x1a\n", 8);
  std::string ihdr;
  put_u32be(ihdr, static_cast<uint32_t>(width));
  put_u32be(ihdr, static_cast<uint32_t>(height));
  ihdr += std::string("\x08\x02\x00\x00\x00", 5);  // 8-bit RGB, deflate, no interlace
  chunk(png, "IHDR", ihdr);
  chunk(png, "IDAT", z);
  chunk(png, "IEND", "");
  return png;
}

void write_plot_png(const std::string& path, const std::vector<Panel>& panels) {
  const int pw = 480, h = 360;
  int w = pw * static_cast<int>(std::max<size_t>(panels.size(), 1));
  Canvas cv(w, h);
  for (size_t i = 0; i < panels.size(); ++i)
    draw_panel(cv, static_cast<int>(i) * pw, 0, pw, h, panels[i]);
  write_file_atomic(path, encode_png(w, h, cv.rgb()));
}

}  // namespace qg::nn
