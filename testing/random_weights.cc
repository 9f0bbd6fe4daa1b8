#include "testing/random_weights.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace conveyor::testing {
namespace {

class RandomSource final : public model::WeightSource {
 public:
  explicit RandomSource(uint64_t seed) : seed_(seed) {}
  bool Contains(const std::string& name) const override { return true; }
  absl::Status ReadF32(const std::string& name, const std::vector<int64_t>& shape,
                       float* out) const override {
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    const bool is_norm = name.find("norm") != std::string::npos;
    const bool is_bias = name.ends_with(".bias");
    // Uniform in [-a, a] has variance a²/3. As tests/model_gen: embeddings of variance 1,
    // an LM head of variance 16/hidden (logits of std ~4, so greedy choices are rarely
    // near ties), projections of variance 1/fan_in.
    double variance = 0.0;
    if (shape.size() == 2) {
      variance = name == "model.embed_tokens.weight" ? 1.0
                 : name == "lm_head.weight"          ? 16.0 / shape[1]
                                                     : 1.0 / shape[1];
    }
    const double a = shape.size() == 2 ? std::sqrt(3.0 * variance) : 0.1;
    const uint64_t base = seed_ ^ std::hash<std::string>()(name);
    // splitmix64, whose i-th state is base + (i + 1)·γ: cheap, good enough for benchmark
    // weights, and indexable, so a large tensor (a Llama-3-8B shape has 0.5 G values in
    // its LM head) fills on every core with the same values as on one.
    auto fill = [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        uint64_t z = base + static_cast<uint64_t>(i + 1) * 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        const double u = (z >> 11) * 0x1.0p-53 * 2.0 - 1.0;
        out[i] = static_cast<float>(is_norm ? 1.0 + 0.1 * u : (is_bias ? 0.1 * u : a * u));
      }
    };
    constexpr int64_t kPerThread = int64_t{1} << 22;
    const int64_t threads = std::clamp<int64_t>(count / kPerThread, 1,
                                                std::max(1u, std::thread::hardware_concurrency()));
    std::vector<std::thread> pool;
    for (int64_t t = 1; t < threads; ++t) {
      pool.emplace_back(fill, count * t / threads, count * (t + 1) / threads);
    }
    fill(0, count / threads);
    for (std::thread& thread : pool) thread.join();
    return absl::OkStatus();
  }
  // Generates the whole tensor and keeps the slice, so that a shard holds exactly the
  // values the unsharded model has.
  absl::Status ReadF32Slice(const std::string& name, const std::vector<int64_t>& shape, int dim,
                            int64_t begin, int64_t end, float* out) const override {
    if (shape.empty() || shape.size() > 2 || dim < 0 || dim >= static_cast<int>(shape.size()) ||
        begin < 0 || begin > end || end > shape[dim]) {
      return absl::OutOfRangeError(absl::StrCat("slice [", begin, ", ", end, ") of dimension ", dim,
                                                " of random tensor '", name, "'"));
    }
    const int64_t rows = shape[0];
    const int64_t cols = shape.size() == 2 ? shape[1] : 1;
    std::vector<float> whole(rows * cols);
    RETURN_IF_ERROR(ReadF32(name, shape, whole.data()));
    if (dim == 0) {
      std::copy(whole.begin() + begin * cols, whole.begin() + end * cols, out);
      return absl::OkStatus();
    }
    for (int64_t row = 0; row < rows; ++row) {
      std::copy(whole.begin() + row * cols + begin, whole.begin() + row * cols + end,
                out + row * (end - begin));
    }
    return absl::OkStatus();
  }

 private:
  uint64_t seed_;
};

}  // namespace

std::unique_ptr<model::WeightSource> MakeRandomWeightSource(uint64_t seed) {
  return std::make_unique<RandomSource>(seed);
}

}  // namespace conveyor::testing
