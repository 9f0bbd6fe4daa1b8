// Sampling where the logits are: a step's logit rows stay in backend memory and only the
// sampled tokens (and requested log-probabilities) travel to the host. On a GPU at
// batch 256 with a 128k vocabulary that saves copying 64 MiB of logits per step and
// sampling 32 M values on the host. StepRunner uses one when the worker has one (the
// CUDA backend); otherwise it copies the logits and uses Sampler (sampler.h), whose
// semantics a device sampler implements too: the same penalties, filters, order of
// candidates and counter-based random stream, so a seeded request draws the same tokens
// on either as far as their logits agree.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "model/model.h"
#include "model/sampler.h"

namespace conveyor::model {

// One logit row to sample, with what Sampler::Sample takes.
struct RowToSample {
  const SamplingParams* params = nullptr;
  std::span<const int32_t> prompt_tokens;
  std::span<const int32_t> output_tokens;
  uint64_t draw_index = 0;
  bool want_logprob = false;
};

class DeviceSampler {
 public:
  virtual ~DeviceSampler() = default;
  // Samples row i of `logits` per rows[i]; results[i] as Sampler::Sample returns it.
  // rows.size() == logits.rows <= the sampler's max_rows.
  virtual absl::Status Sample(const DeviceLogits& logits, std::span<const RowToSample> rows,
                              std::vector<SampleResult>* results) = 0;
  virtual int max_rows() const = 0;
};

}  // namespace conveyor::model
