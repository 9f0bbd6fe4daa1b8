// The portable row kernels and the shared RMSNorm reduction.
// Compiled with -ffp-contract=off: RMSNorm and RoPE must round each product the way the
// vector kernels do, whatever the target flags.
#include "kernels/cpu/row_kernels.h"

#include <cmath>

namespace conveyor::kernels::internal {

float InverseRmsFromLanes(const double lanes[kRmsLanes], int hidden, float eps) {
  double s[kRmsLanes / 2];
  for (int i = 0; i < 8; ++i) s[i] = lanes[i] + lanes[i + 8];
  for (int i = 0; i < 4; ++i) s[i] += s[i + 4];
  for (int i = 0; i < 2; ++i) s[i] += s[i + 2];
  const double sum = s[0] + s[1];
  return static_cast<float>(1.0 / std::sqrt(sum / hidden + eps));
}

namespace {

// Sum of squares of x into lanes (element i into lane i % kRmsLanes), then the inverse RMS.
float InverseRms(const float* x, int hidden, float eps) {
  double lanes[kRmsLanes] = {};
  for (int i = 0; i < hidden; ++i) lanes[i % kRmsLanes] += static_cast<double>(x[i]) * x[i];
  return InverseRmsFromLanes(lanes, hidden, eps);
}

void RmsNorm(const float* x, const float* weight, int hidden, float eps, float* out) {
  const float inv = InverseRms(x, hidden, eps);
  for (int i = 0; i < hidden; ++i) out[i] = x[i] * inv * weight[i];
}

void AddRmsNorm(float* residual, const float* x, const float* weight, int hidden, float eps,
                float* out) {
  for (int i = 0; i < hidden; ++i) residual[i] += x[i];
  RmsNorm(residual, weight, hidden, eps, out);
}

void Rope(float* heads, int num_heads, int head_dim, const float* cos, const float* sin) {
  const int half = head_dim / 2;
  for (int h = 0; h < num_heads; ++h) {
    float* head = heads + static_cast<long>(h) * head_dim;
    for (int i = 0; i < half; ++i) {
      const float x1 = head[i];
      const float x2 = head[i + half];
      head[i] = x1 * cos[i] - x2 * sin[i];
      head[i + half] = x2 * cos[i] + x1 * sin[i];
    }
  }
}

void SiluMul(const float* gate, const float* up, int n, float* out) {
  for (int i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

}  // namespace

const RowKernels kPortableRowKernels = {"portable", RmsNorm, AddRmsNorm, Rope, SiluMul};

}  // namespace conveyor::kernels::internal
