// The golden tests' error measure: the worst row's max|a − b| / max|b| over rows of `cols` values.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace m3::golden {

inline double max_row_rel_error(const std::vector<float>& a, const std::vector<float>& b, int64_t cols) {
  double worst = 0;
  for (size_t r = 0; r * cols < b.size(); ++r) {
    double scale = 1e-30, err = 0;
    for (int64_t c = 0; c < cols; ++c) {
      scale = std::max(scale, double(std::fabs(b[r * cols + c])));
      err = std::max(err, double(std::fabs(a[r * cols + c] - b[r * cols + c])));
    }
    worst = std::max(worst, err / scale);
  }
  return worst;
}

}  // namespace m3::golden
