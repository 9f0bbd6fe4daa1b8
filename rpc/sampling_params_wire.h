// SamplingParams (common/sampling_params.h) to and from the step protocol's message.
// On the wire, zero means "unset" for every field (proto3), so top_p and
// repetition_penalty of 0 read back as their defaults.
#pragma once

#include "common/sampling_params.h"
#include "worker.pb.h"

namespace conveyor {

inline worker::v1::SamplingParams ToWire(const SamplingParams& p) {
  worker::v1::SamplingParams w;
  w.set_temperature(p.temperature);
  w.set_top_k(p.top_k);
  w.set_top_p(p.top_p);
  w.set_min_p(p.min_p);
  w.set_repetition_penalty(p.repetition_penalty);
  w.set_presence_penalty(p.presence_penalty);
  w.set_frequency_penalty(p.frequency_penalty);
  w.set_seed(p.seed);
  w.set_num_logprobs(p.num_logprobs);
  for (const auto& [token, bias] : p.logit_bias) {
    worker::v1::LogitBias* entry = w.add_logit_bias();
    entry->set_token_id(token);
    entry->set_bias(bias);
  }
  return w;
}

inline SamplingParams FromWire(const worker::v1::SamplingParams& w) {
  SamplingParams p;
  p.temperature = w.temperature();
  p.top_k = w.top_k();
  p.top_p = w.top_p() == 0.0f ? 1.0f : w.top_p();
  p.min_p = w.min_p();
  p.repetition_penalty = w.repetition_penalty() == 0.0f ? 1.0f : w.repetition_penalty();
  p.presence_penalty = w.presence_penalty();
  p.frequency_penalty = w.frequency_penalty();
  p.seed = w.seed();
  p.num_logprobs = w.num_logprobs();
  p.logit_bias.reserve(w.logit_bias_size());
  for (const worker::v1::LogitBias& entry : w.logit_bias()) {
    p.logit_bias.emplace_back(entry.token_id(), entry.bias());
  }
  return p;
}

}  // namespace conveyor
