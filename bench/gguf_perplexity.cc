// gguf_perplexity: the perplexity of a model (a GGUF file or an HF directory) on a text,
// computed the way llama.cpp's llama-perplexity computes it, so the two engines can be
// compared on the same file (bench/llamacpp/). The text is tokenized whole, with the
// tokens the model adds in front of a sequence (BOS); the tokens are cut into chunks of
// --ctx tokens (a partial last chunk is dropped); each chunk is one forward pass from an
// empty KV cache with its first token replaced by BOS (when the tokenizer adds one), and
// only its second half is scored: the logits at positions ctx/2 .. ctx-2 against the
// tokens at ctx/2+1 .. ctx-1. PPL = exp(mean negative log-likelihood) over all chunks;
// the ± is llama-perplexity's (the standard error of the mean NLL, times PPL).
//
// The weights and KV cache are stored as the worker would store them for the same
// --cpu_weight_dtype / --cpu_kv_dtype (model/cpu/cpu_device.h). --tokens_file reads
// whitespace-separated token ids instead of tokenizing (e.g. llama-tokenize's --ids
// output), so the models can be compared on identical tokens; --dump_tokens writes the ids
// this tool used.
//
// Usage: gguf_perplexity --model FILE.gguf --text FILE [--ctx 512] [--chunks N]
//        [--threads N] [--cpu_weight_dtype auto] [--cpu_kv_dtype auto]
//        [--tokens_file FILE] [--dump_tokens FILE]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/backend.h"
#include "model/cpu/cpu_device.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "text/tokenizer.h"

ABSL_FLAG(std::string, model, "", "GGUF file (or HF directory) to evaluate.");
ABSL_FLAG(std::string, text, "", "Text file to compute the perplexity on.");
ABSL_FLAG(std::string, tokens_file, "",
          "Whitespace-separated token ids to use instead of tokenizing --text.");
ABSL_FLAG(std::string, dump_tokens, "", "Write the token ids used here, one line.");
ABSL_FLAG(int, ctx, 512, "Tokens per chunk (llama-perplexity's -c).");
ABSL_FLAG(int, chunks, -1, "Chunks to evaluate; -1: every whole chunk.");
ABSL_FLAG(int, threads, 0, "CPU threads; 0: one per core.");
ABSL_FLAG(std::string, cpu_weight_dtype, "auto", "As conveyor-worker's flag.");
ABSL_FLAG(std::string, cpu_kv_dtype, "auto", "As conveyor-worker's flag.");

namespace conveyor {
namespace {

constexpr int kBlockSize = 16;

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

absl::StatusOr<std::vector<int32_t>> ReadTokenIds(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  // llama-tokenize --ids prints a Python-style list: "[1, 2, 3]".
  std::replace_if(
      text->begin(), text->end(), [](char c) { return c == '[' || c == ']' || c == ','; }, ' ');
  std::istringstream in(*text);
  std::vector<int32_t> ids{std::istream_iterator<int32_t>(in), std::istream_iterator<int32_t>()};
  if (!in.eof()) return absl::InvalidArgumentError(absl::StrCat(path, ": not a list of ids"));
  return ids;
}

// The tokens of the text, and whether the tokenizer puts BOS in front of a sequence
// (llama_vocab_get_add_bos), as llama-perplexity's common_tokenize(add_special = true).
struct TextTokens {
  std::vector<int32_t> ids;
  bool add_bos = false;
  int bos = -1;
};

// Tokenizes `text` with the model's tokenizer; with `ids_path`, takes the ids from that
// file instead (the tokenizer then only says whether BOS is added).
absl::StatusOr<TextTokens> LoadTokens(const std::string& model, const std::string& text,
                                      const std::string& ids_path) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::Load(model);
  if (!tokenizer.ok()) return tokenizer.status();
  const std::string_view probe = ids_path.empty() ? std::string_view(text) : "probe";
  absl::StatusOr<std::vector<int>> framed = (*tokenizer)->EncodeWithSpecialTokens(probe);
  if (!framed.ok()) return framed.status();
  absl::StatusOr<std::vector<int>> plain = (*tokenizer)->Encode(probe);
  if (!plain.ok()) return plain.status();
  TextTokens out;
  out.bos = (*tokenizer)->bos_id();
  out.add_bos = out.bos >= 0 && framed->size() > plain->size() && framed->front() == out.bos;
  if (ids_path.empty()) {
    out.ids.assign(framed->begin(), framed->end());
  } else {
    absl::StatusOr<std::vector<int32_t>> ids = ReadTokenIds(ids_path);
    if (!ids.ok()) return ids.status();
    out.ids = *std::move(ids);
  }
  return out;
}

// Adds -log p(target) for each row of `logits` ([rows, vocab]) and its square, in double.
void AccumulateNll(const float* logits, int rows, int vocab, const int32_t* targets, double* nll,
                   double* nll2) {
  for (int r = 0; r < rows; ++r) {
    const float* row = logits + static_cast<size_t>(r) * vocab;
    const double max = *std::max_element(row, row + vocab);
    double sum = 0.0;
    for (int v = 0; v < vocab; ++v) sum += std::exp(row[v] - max);
    const double value = -(row[targets[r]] - max - std::log(sum));
    *nll += value;
    *nll2 += value * value;
  }
}

int Run() {
  const std::string path = absl::GetFlag(FLAGS_model);
  const int ctx = absl::GetFlag(FLAGS_ctx);
  if (path.empty() ||
      (absl::GetFlag(FLAGS_text).empty() && absl::GetFlag(FLAGS_tokens_file).empty()) || ctx < 4) {
    std::fprintf(stderr, "%s\n", absl::ProgramUsageMessage().data());
    return 2;
  }
  auto fail = [](const absl::Status& status) {
    std::fprintf(stderr, "gguf_perplexity: %s\n", status.ToString().c_str());
    return 1;
  };

  std::string text;
  if (!absl::GetFlag(FLAGS_text).empty()) {
    absl::StatusOr<std::string> read = ReadFile(absl::GetFlag(FLAGS_text));
    if (!read.ok()) return fail(read.status());
    text = *std::move(read);
  }
  absl::StatusOr<TextTokens> loaded_tokens =
      LoadTokens(path, text, absl::GetFlag(FLAGS_tokens_file));
  if (!loaded_tokens.ok()) return fail(loaded_tokens.status());
  const TextTokens tokens = *std::move(loaded_tokens);
  if (!absl::GetFlag(FLAGS_dump_tokens).empty()) {
    std::ofstream out(absl::GetFlag(FLAGS_dump_tokens));
    for (size_t i = 0; i < tokens.ids.size(); ++i) out << (i ? " " : "") << tokens.ids[i];
    out << "\n";
  }
  const int n_tokens = static_cast<int>(tokens.ids.size());
  if (n_tokens < 2 * ctx) {
    std::fprintf(stderr, "gguf_perplexity: %d tokens; a context of %d needs at least %d\n",
                 n_tokens, ctx, 2 * ctx);
    return 1;
  }
  int n_chunks = n_tokens / ctx;
  if (absl::GetFlag(FLAGS_chunks) >= 0) n_chunks = std::min(n_chunks, absl::GetFlag(FLAGS_chunks));

  absl::StatusOr<ModelConfig> config = model::LoadCheckpointConfig(path);
  if (!config.ok()) return fail(config.status());
  model::CpuDeviceOptions options;
  options.num_threads = absl::GetFlag(FLAGS_threads);
  absl::StatusOr<model::CpuWeightChoice> weights =
      model::ParseCpuWeightChoice(absl::GetFlag(FLAGS_cpu_weight_dtype));
  if (!weights.ok()) return fail(weights.status());
  absl::StatusOr<model::CpuKvChoice> kv =
      model::ParseCpuKvChoice(absl::GetFlag(FLAGS_cpu_kv_dtype));
  if (!kv.ok()) return fail(kv.status());
  options.weights = *weights;
  options.kv = *kv;
  std::unique_ptr<model::Device> device = model::MakeCpuDevice(options);
  absl::StatusOr<std::unique_ptr<kernels::Backend>> backend = device->MakeBackend(*config);
  if (!backend.ok()) return fail(backend.status());
  absl::StatusOr<std::unique_ptr<model::LlamaModel>> loaded =
      model::LlamaModel::Load(path, backend->get());
  if (!loaded.ok()) return fail(loaded.status());
  model::LlamaModel& m = **loaded;
  const ModelConfig& c = m.config();
  const int blocks = (ctx + kBlockSize - 1) / kBlockSize;
  absl::StatusOr<std::unique_ptr<model::KvCache>> cache = model::KvCache::Create(
      backend->get(), c.num_layers, m.local_num_kv_heads(), c.head_dim, kBlockSize, blocks);
  if (!cache.ok()) return fail(cache.status());

  std::printf("%s: backend %s, %d tokens (BOS %s), %d chunks of %d, scoring %d tokens each\n",
              path.c_str(), (*backend)->name().c_str(), n_tokens,
              tokens.add_bos ? "added" : "not added", n_chunks, ctx, ctx - ctx / 2 - 1);

  const int first = ctx / 2;
  const int vocab = c.vocab_size;
  model::ForwardBatch batch;
  std::vector<float> logits;
  double nll = 0.0, nll2 = 0.0;
  int64_t count = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int chunk = 0; chunk < n_chunks; ++chunk) {
    const int32_t* chunk_ids = tokens.ids.data() + static_cast<size_t>(chunk) * ctx;
    batch.Clear();
    batch.token_ids.assign(chunk_ids, chunk_ids + ctx);
    if (tokens.add_bos) batch.token_ids[0] = tokens.bos;
    batch.token_seq.assign(ctx, 0);
    batch.token_pos.resize(ctx);
    std::iota(batch.token_pos.begin(), batch.token_pos.end(), 0);
    batch.slot_mapping = batch.token_pos;  // Blocks 0, 1, ... in order.
    batch.num_seqs = 1;
    batch.max_blocks_per_seq = blocks;
    batch.block_tables.resize(blocks);
    std::iota(batch.block_tables.begin(), batch.block_tables.end(), 0);
    batch.logit_rows.resize(ctx - 1 - first);
    std::iota(batch.logit_rows.begin(), batch.logit_rows.end(), first);
    logits.resize(batch.logit_rows.size() * static_cast<size_t>(vocab));
    const absl::Status status = m.Forward(batch, **cache, logits.data());
    if (!status.ok()) return fail(status);
    const int rows = static_cast<int>(batch.logit_rows.size());
    AccumulateNll(logits.data(), rows, vocab, chunk_ids + first + 1, &nll, &nll2);
    count += rows;
    std::printf("[%d]%.4f,", chunk + 1, std::exp(nll / static_cast<double>(count)));
    std::fflush(stdout);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double mean = nll / static_cast<double>(count);
  const double variance = nll2 / static_cast<double>(count) - mean * mean;
  const double stderr_mean =
      variance > 0 ? std::sqrt(variance / static_cast<double>(count - 1)) : 0;
  const double ppl = std::exp(mean);
  std::printf("\nFinal estimate: PPL = %.4f +/- %.5f  (%lld tokens scored, %.1f s)\n", ppl,
              stderr_mean * ppl, static_cast<long long>(count), seconds);
  return 0;
}

}  // namespace
}  // namespace conveyor

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "gguf_perplexity --model FILE.gguf --text FILE [--ctx 512] [--chunks N] [--threads N] "
      "[--cpu_weight_dtype auto|f32|bf16|int8|gguf] [--cpu_kv_dtype auto|f32|bf16] "
      "[--tokens_file IDS] [--dump_tokens FILE]");
  absl::ParseCommandLine(argc, argv);
  return conveyor::Run();
}
