// Deterministic random weights for tests and benchmarks of model shapes we cannot ship
// (a Llama-3-8B shape in the step benchmark, TP layouts in tests).
#pragma once

#include <cstdint>
#include <memory>

#include "model/model.h"

namespace conveyor::testing {

// Random weights with the scales of tests/model_gen (uniform: embeddings of variance 1,
// an untied LM head of variance 16/hidden, projections of variance 1/fan_in, norms
// 1 ± 0.1, biases ± 0.1), the same for the same seed and tensor name. It has every
// tensor, lm_head.weight included: the config's tie_word_embeddings decides.
std::unique_ptr<model::WeightSource> MakeRandomWeightSource(uint64_t seed);

}  // namespace conveyor::testing
