// What the routers in front of several replicas read from a model server besides the
// OpenAI routes and /metrics (docs/scaling.md). SGLang's router (sglang-router) asks a
// server it registers for /server_info and /model_info (the model it serves, its shape)
// and polls /get_load for power-of-two routing; SGLang's own server names are kept, older
// /get_server_info and /get_model_info too. vllm-router's cache-aware policy (and llm-d's
// precise prefix-cache scorer) ask vLLM's Renderer API for a request's prompt tokens.
// Pure logic: the bodies, not the routes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "conveyor.pb.h"
#include "scheduler/http/openai_protocol.h"

namespace conveyor::scheduler::openai {

// GET /server_info: the served model (served_model_name, the id requests name; model_path,
// the directory or file it was loaded from) and the replica's capacity.
std::string ServerInfoBody(const v1::ModelInfoResponse& info, std::string_view model_path);
// GET /model_info: the model's path, architecture and that it generates.
std::string ModelInfoBody(const v1::ModelInfoResponse& info, std::string_view model_path);
// GET /get_load: one entry (SGLang has one per data-parallel rank; a Conveyor replica is
// one): requests running and waiting, and the tokens whose K/V the running ones hold (the
// router's load figure).
std::string LoadBody(int running, int waiting, int64_t kv_tokens);
// POST /v1/completions/render or /v1/chat/completions/render: the prompt's token ids as
// this server computes them (after the chat template; with BOS), without generating, in
// vLLM's GenerateRequest shape with the request's sampling in vLLM's names. A completion
// answers a list (vLLM's has one entry per prompt; a Conveyor completion has one prompt),
// a chat request one object.
std::string RenderBody(Endpoint endpoint, std::string_view request_id, std::string_view model,
                       const std::vector<int32_t>& prompt_tokens,
                       const v1::GenerateRequest& generate, bool stream);

}  // namespace conveyor::scheduler::openai
