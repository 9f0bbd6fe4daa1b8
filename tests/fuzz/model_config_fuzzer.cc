// Fuzzes checkpoint/model_config.h's ParseModelConfig on arbitrary config.json text. Beyond
// the sanitizers, it checks that what it accepts is a shape the model code can build:
// positive sizes, whole heads, KV heads that divide the attention heads, token ids inside
// the vocabulary.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "checkpoint/model_config.h"
#include "tests/fuzz/fuzz_support.h"

namespace conveyor::fuzz {
namespace {

void FuzzOne(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<ModelConfig> parsed = ParseModelConfig(text, "config.json");
  if (!parsed.ok()) {
    if (parsed.status().code() != absl::StatusCode::kInvalidArgument) {
      InvariantViolated("a rejection that is not INVALID_ARGUMENT", parsed.status().ToString());
    }
    return;
  }
  const ModelConfig& c = *parsed;
  const bool sizes_ok = c.vocab_size > 0 && c.hidden_size > 0 && c.intermediate_size > 0 &&
                        c.num_layers > 0 && c.num_attention_heads > 0 && c.num_kv_heads > 0 &&
                        c.head_dim > 0 && c.max_context_tokens > 0 &&
                        c.num_attention_heads % c.num_kv_heads == 0 && c.rms_norm_eps > 0 &&
                        c.rope_theta > 0;
  bool ids_ok = c.bos_token_id >= -1 && c.bos_token_id < c.vocab_size;
  for (int id : c.eos_token_ids) ids_ok &= id >= 0 && id < c.vocab_size;
  if (!sizes_ok || !ids_ok) {
    InvariantViolated("an accepted config the model cannot use",
                      absl::StrCat("vocab ", c.vocab_size, " hidden ", c.hidden_size, " heads ",
                                   c.num_attention_heads, "/", c.num_kv_heads, " head_dim ",
                                   c.head_dim, " layers ", c.num_layers, " context ",
                                   c.max_context_tokens, " bos ", c.bos_token_id));
  }
  (void)c.NumParameters();
}

}  // namespace
}  // namespace conveyor::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  conveyor::fuzz::FuzzOne(data, size);
  return 0;
}
