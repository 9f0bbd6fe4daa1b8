#include "scheduler/http/router_endpoints.h"

#include "nlohmann/json.hpp"

namespace conveyor::scheduler::openai {

std::string ServerInfoBody(const v1::ModelInfoResponse& info, std::string_view model_path) {
  const int64_t kv_tokens = static_cast<int64_t>(info.num_kv_blocks()) * info.kv_block_size();
  return Json{{"served_model_name", info.model()},
              {"model_path", model_path},
              {"tp_size", info.tensor_parallel_size()},
              {"dp_size", 1},
              {"max_running_requests", info.max_num_seqs()},
              {"max_total_tokens", kv_tokens},
              {"context_length", info.max_context_tokens()},
              {"page_size", info.kv_block_size()},
              {"schedule_policy", info.policy()},
              {"server", "conveyor"}}
      .dump();
}

std::string ModelInfoBody(const v1::ModelInfoResponse& info, std::string_view model_path) {
  return Json{{"model_path", model_path},
              {"served_model_name", info.model()},
              {"architectures", Json::array({info.architecture()})},
              {"is_generation", true}}
      .dump();
}

std::string LoadBody(int running, int waiting, int64_t kv_tokens) {
  return Json::array({Json{{"dp_rank", 0},
                           {"num_reqs", running + waiting},
                           {"num_waiting_reqs", waiting},
                           {"num_tokens", kv_tokens}}})
      .dump();
}

std::string RenderBody(Endpoint endpoint, std::string_view request_id, std::string_view model,
                       const std::vector<int32_t>& prompt_tokens,
                       const v1::GenerateRequest& generate, bool stream) {
  Json sampling = Json::object();
  if (generate.has_max_new_tokens()) sampling["max_tokens"] = generate.max_new_tokens();
  if (generate.has_temperature()) sampling["temperature"] = generate.temperature();
  if (generate.has_top_p()) sampling["top_p"] = generate.top_p();
  if (generate.has_top_k()) sampling["top_k"] = generate.top_k();
  if (generate.has_min_p()) sampling["min_p"] = generate.min_p();
  if (generate.has_repetition_penalty()) {
    sampling["repetition_penalty"] = generate.repetition_penalty();
  }
  if (generate.has_presence_penalty()) sampling["presence_penalty"] = generate.presence_penalty();
  if (generate.has_frequency_penalty()) {
    sampling["frequency_penalty"] = generate.frequency_penalty();
  }
  if (generate.has_seed()) sampling["seed"] = generate.seed();
  if (generate.has_n()) sampling["n"] = generate.n();
  if (!generate.stop().empty()) {
    sampling["stop"] =
        Json(std::vector<std::string>(generate.stop().begin(), generate.stop().end()));
  }
  if (!generate.stop_token_ids().empty()) {
    sampling["stop_token_ids"] = Json(
        std::vector<int32_t>(generate.stop_token_ids().begin(), generate.stop_token_ids().end()));
  }
  if (generate.ignore_eos()) sampling["ignore_eos"] = true;
  Json rendered{{"request_id", request_id},   {"model", model},
                {"token_ids", prompt_tokens}, {"sampling_params", std::move(sampling)},
                {"stream", stream},           {"token_offsets", nullptr}};
  if (endpoint == Endpoint::kCompletions) return Json::array({std::move(rendered)}).dump();
  return rendered.dump();
}

}  // namespace conveyor::scheduler::openai
