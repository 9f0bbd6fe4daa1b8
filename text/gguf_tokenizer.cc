#include "text/gguf_tokenizer.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/gguf.h"
#include "common/utf8.h"
#include "text/hf_stage_util.h"
#include "text/hf_tokenizer_text.h"

namespace conveyor {
namespace {

using json = nlohmann::json;

// llama.cpp's llama_token_type (tokenizer.ggml.token_type).
constexpr int64_t kTypeUnknown = 2;
constexpr int64_t kTypeControl = 3;
constexpr int64_t kTypeUserDefined = 4;

// --- Pre-tokenizers by name -------------------------------------------------------------

// The split regexes llama.cpp hard-codes per tokenizer.ggml.pre, as the models' own
// tokenizer.json files write them (Oniguruma syntax, which HfTokenizer's Split runs).
// GPT-2's is ByteLevel's built-in one (use_regex).
constexpr const char* kLlama3Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Split = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N})"
                                    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kTekkenSplit =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*)"
    R"(|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kGpt4oSplit =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

enum class PreStyle { kGpt2, kDigitsGpt2, kSplit };
struct PreTokenizerInfo {
  PreStyle style;
  const char* split = nullptr;  // kSplit's regex.
  // llama.cpp's ignore_merges for this pre-tokenizer (Llama 3's and Tekken's
  // tokenizer.json say so too): a word that is a token is that token.
  bool ignore_merges = false;
};

const std::map<std::string, PreTokenizerInfo, std::less<>>& PreTokenizers() {
  static const auto* table = new std::map<std::string, PreTokenizerInfo, std::less<>>{
      {"default", {PreStyle::kGpt2}},
      {"gpt2", {PreStyle::kGpt2}},
      // Digits one by one, then GPT-2's regex (SmolLM's and StarCoder's tokenizer.json).
      {"smollm", {PreStyle::kDigitsGpt2}},
      {"starcoder", {PreStyle::kDigitsGpt2}},
      {"llama-bpe", {PreStyle::kSplit, kLlama3Split, true}},
      {"llama3", {PreStyle::kSplit, kLlama3Split, true}},
      {"llama-v3", {PreStyle::kSplit, kLlama3Split, true}},
      {"smaug-bpe", {PreStyle::kSplit, kLlama3Split, false}},
      {"dbrx", {PreStyle::kSplit, kLlama3Split, false}},
      {"falcon3", {PreStyle::kSplit, kLlama3Split, false}},
      {"qwen2", {PreStyle::kSplit, kQwen2Split, false}},
      {"deepseek-r1-qwen", {PreStyle::kSplit, kQwen2Split, false}},
      {"megrez", {PreStyle::kSplit, kQwen2Split, false}},
      {"tekken", {PreStyle::kSplit, kTekkenSplit, true}},
      {"gpt-4o", {PreStyle::kSplit, kGpt4oSplit, false}},
      {"llama4", {PreStyle::kSplit, kGpt4oSplit, false}},
  };
  return *table;
}

json ByteLevelPreTokenizer(bool use_regex) {
  return {{"type", "ByteLevel"},
          {"add_prefix_space", false},
          {"trim_offsets", true},
          {"use_regex", use_regex}};
}

json PreTokenizerDocument(const PreTokenizerInfo& info) {
  switch (info.style) {
    case PreStyle::kGpt2:
      return ByteLevelPreTokenizer(/*use_regex=*/true);
    case PreStyle::kDigitsGpt2:
      return {{"type", "Sequence"},
              {"pretokenizers",
               {{{"type", "Digits"}, {"individual_digits", true}},
                ByteLevelPreTokenizer(/*use_regex=*/true)}}};
    case PreStyle::kSplit:
      return {{"type", "Sequence"},
              {"pretokenizers",
               {{{"type", "Split"},
                 {"pattern", {{"Regex", info.split}}},
                 {"behavior", "Isolated"},
                 {"invert", false}},
                ByteLevelPreTokenizer(/*use_regex=*/false)}}};
  }
  return nullptr;
}

// --- Reading the metadata ---------------------------------------------------------------

class MetadataReader {
 public:
  explicit MetadataReader(const GgufFile& file) : file_(file) {}

  absl::Status Invalid(std::string_view key, std::string_view problem) const {
    return absl::InvalidArgumentError(
        absl::StrCat(file_.path(), ": ", hf::AsAbsl(key), " ", hf::AsAbsl(problem)));
  }
  absl::Status Unimplemented(std::string_view key, std::string_view problem) const {
    return absl::UnimplementedError(
        absl::StrCat(file_.path(), ": ", hf::AsAbsl(key), " ", hf::AsAbsl(problem)));
  }

  // The array under `key`, of elements all passing `check` (a GgufValue predicate named
  // `element` in messages); null when absent and !required.
  absl::StatusOr<const GgufArray*> Array(std::string_view key, bool required,
                                         std::string_view element) const {
    const GgufValue* value = file_.FindMetadata(key);
    if (value == nullptr) {
      if (required) return Invalid(key, "is missing");
      return nullptr;
    }
    const GgufArray* array = value->AsArray();
    if (array == nullptr) {
      return Invalid(key, absl::StrCat("must be an array of ", hf::AsAbsl(element), ", not a ",
                                       GgufValueTypeName(value->type())));
    }
    return array;
  }

  absl::StatusOr<std::vector<std::string>> Strings(std::string_view key, bool required) const {
    absl::StatusOr<const GgufArray*> array = Array(key, required, "strings");
    if (!array.ok()) return array.status();
    std::vector<std::string> out;
    if (*array == nullptr) return out;
    out.reserve((*array)->elements.size());
    for (size_t i = 0; i < (*array)->elements.size(); ++i) {
      const std::string* s = (*array)->elements[i].AsString();
      if (s == nullptr) {
        return Invalid(key, absl::StrCat("must be an array of strings, not of ",
                                         GgufValueTypeName((*array)->element_type)));
      }
      out.push_back(*s);
    }
    return out;
  }

  absl::StatusOr<std::vector<int64_t>> Ints(std::string_view key) const {
    absl::StatusOr<const GgufArray*> array = Array(key, false, "integers");
    if (!array.ok()) return array.status();
    std::vector<int64_t> out;
    if (*array == nullptr) return out;
    for (const GgufValue& element : (*array)->elements) {
      const std::optional<int64_t> v = element.AsInt();
      if (!v.has_value()) {
        return Invalid(key, absl::StrCat("must be an array of integers, not of ",
                                         GgufValueTypeName((*array)->element_type)));
      }
      out.push_back(*v);
    }
    return out;
  }

  absl::StatusOr<std::vector<double>> Floats(std::string_view key) const {
    absl::StatusOr<const GgufArray*> array = Array(key, false, "numbers");
    if (!array.ok()) return array.status();
    std::vector<double> out;
    if (*array == nullptr) return out;
    for (size_t i = 0; i < (*array)->elements.size(); ++i) {
      const std::optional<double> v = (*array)->elements[i].AsDouble();
      if (!v.has_value()) {
        return Invalid(key, absl::StrCat("must be an array of numbers, not of ",
                                         GgufValueTypeName((*array)->element_type)));
      }
      if (!std::isfinite(*v))
        return Invalid(absl::StrCat(hf::AsAbsl(key), "[", i, "]"), "is not finite");
      out.push_back(*v);
    }
    return out;
  }

  absl::StatusOr<std::optional<std::string>> String(std::string_view key) const {
    const GgufValue* value = file_.FindMetadata(key);
    if (value == nullptr) return std::nullopt;
    const std::string* s = value->AsString();
    if (s == nullptr) {
      return Invalid(key,
                     absl::StrCat("must be a string, not a ", GgufValueTypeName(value->type())));
    }
    return *s;
  }

  absl::StatusOr<bool> Bool(std::string_view key, bool fallback) const {
    const GgufValue* value = file_.FindMetadata(key);
    if (value == nullptr) return fallback;
    const bool* b = std::get_if<bool>(&value->value);
    if (b == nullptr) {
      return Invalid(key, absl::StrCat("must be a bool, not a ", GgufValueTypeName(value->type())));
    }
    return *b;
  }

  // A token id under `key`: -1 when absent; an error unless an integer in [0, tokens).
  absl::StatusOr<int> TokenId(std::string_view key, size_t tokens) const {
    const GgufValue* value = file_.FindMetadata(key);
    if (value == nullptr) return -1;
    const std::optional<int64_t> id = value->AsInt();
    if (!id.has_value()) {
      return Invalid(key, absl::StrCat("must be an integer token id, not a ",
                                       GgufValueTypeName(value->type())));
    }
    if (*id < 0 || static_cast<uint64_t>(*id) >= tokens) {
      return Invalid(key, absl::StrCat("is ", *id, ", outside the vocabulary of ", tokens,
                                       " tokens (tokenizer.ggml.tokens)"));
    }
    return static_cast<int>(*id);
  }

 private:
  const GgufFile& file_;
};

// Whether every character of `token` is one of the byte-level alphabet's (GPT-2's
// bytes_to_unicode), i.e. the token is written as byte-level BPE writes its tokens.
bool IsByteLevelSpelled(std::string_view token) {
  if (FindInvalidUtf8(token) != std::string_view::npos) return false;
  const hf::ByteAlphabet& bytes = hf::Bytes();
  for (size_t i = 0; i < token.size();) {
    if (bytes.ByteOf(NextChar(token, &i)) < 0) return false;
  }
  return true;
}

// Merges derived from a sentencepiece vocabulary's scores, as transformers'
// generate_merges(vocab, vocab_scores) does for a GGUF without merges: every split of a
// token into two tokens is a merge ranked by the token's score (higher first), then by
// the longer left part, then the longer right part (in characters); among equals, tokens
// in vocabulary order and, within a token, by the parts' ids.
std::vector<std::pair<std::string, std::string>> MergesFromScores(
    const std::vector<std::string>& tokens, const std::vector<double>& scores) {
  // Python's {token: index} and dict(zip(tokens, scores)): a repeated token keeps its
  // last id and score but its first position.
  absl::flat_hash_map<std::string_view, int> id_of;
  absl::flat_hash_map<std::string_view, double> score_of;
  std::vector<int> order;  // First occurrence of each token.
  for (int i = 0; i < static_cast<int>(tokens.size()); ++i) {
    const std::string_view t = tokens[i];
    if (!id_of.contains(t)) order.push_back(i);
    id_of[t] = i;
    score_of[t] = scores[i];
  }
  struct Merge {
    int left;  // Token index of the parts (their last ids).
    int right;
    double score;
    size_t left_chars;
    size_t right_chars;
  };
  std::vector<Merge> merges;
  std::vector<size_t> boundaries;
  std::vector<Merge> local;
  for (const int i : order) {
    const std::string_view t = tokens[i];
    boundaries.clear();
    for (size_t at = 0; at < t.size();) {
      NextChar(t, &at);
      boundaries.push_back(at);
    }
    const size_t chars = boundaries.size();
    local.clear();
    for (size_t k = 0; k + 1 < chars; ++k) {
      const size_t cut = boundaries[k];
      const auto left = id_of.find(t.substr(0, cut));
      if (left == id_of.end()) continue;
      const auto right = id_of.find(t.substr(cut));
      if (right == id_of.end()) continue;
      local.push_back({left->second, right->second, score_of[t], k + 1, chars - k - 1});
    }
    std::stable_sort(local.begin(), local.end(), [](const Merge& a, const Merge& b) {
      return std::pair(a.left, a.right) < std::pair(b.left, b.right);
    });
    merges.insert(merges.end(), local.begin(), local.end());
  }
  // sorted(..., reverse=True) is stable too.
  std::stable_sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) {
    return std::tuple(a.score, a.left_chars, a.right_chars) >
           std::tuple(b.score, b.left_chars, b.right_chars);
  });
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(merges.size());
  for (const Merge& m : merges) out.emplace_back(tokens[m.left], tokens[m.right]);
  return out;
}

json AddedToken(const std::string& content, int id, bool special) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", special}};
}

// [BOS] $A [EOS] as the flags say.
json PostProcessor(const std::vector<std::string>& tokens, int bos, int eos, bool add_bos,
                   bool add_eos) {
  json single = json::array();
  json special_tokens = json::object();
  const auto add_special = [&](int id) {
    single.push_back({{"SpecialToken", {{"id", tokens[id]}, {"type_id", 0}}}});
    special_tokens[tokens[id]] = {{"id", tokens[id]}, {"ids", {id}}, {"tokens", {tokens[id]}}};
  };
  if (add_bos) add_special(bos);
  single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  if (add_eos) add_special(eos);
  return {{"type", "TemplateProcessing"},
          {"single", single},
          {"pair", single},
          {"special_tokens", special_tokens}};
}

}  // namespace

bool IsGgufPath(std::string_view path) { return absl::EndsWith(hf::AsAbsl(path), ".gguf"); }

std::vector<std::string> KnownGgufPreTokenizers() {
  std::vector<std::string> names;
  for (const auto& [name, info] : PreTokenizers()) names.push_back(name);
  return names;
}

namespace {

// The keys both documents need.
struct TokenizerBasics {
  bool byte_level = false;  // "gpt2", else "llama".
  std::vector<std::string> tokens;
  std::vector<int64_t> types;  // Empty when the file has none (all normal).
  int bos = -1;
  int eos = -1;
  int unk = -1;
  int pad = -1;
  bool add_bos = false;
  bool add_eos = false;
  bool add_space_prefix = true;
};

absl::StatusOr<TokenizerBasics> ReadBasics(const MetadataReader& meta) {
  TokenizerBasics b;
  absl::StatusOr<std::optional<std::string>> model_kind = meta.String("tokenizer.ggml.model");
  if (!model_kind.ok()) return model_kind.status();
  if (!model_kind->has_value()) {
    return meta.Invalid("tokenizer.ggml.model",
                        "is missing: the file carries no tokenizer (serve it from a model "
                        "directory with tokenizer.json instead)");
  }
  const std::string& kind = **model_kind;
  b.byte_level = kind == "gpt2";
  if (!b.byte_level && kind != "llama") {
    return meta.Unimplemented(
        "tokenizer.ggml.model",
        absl::StrCat("is \"", kind,
                     "\"; Conveyor reads \"gpt2\" (byte-level BPE) and \"llama\" "
                     "(sentencepiece-style BPE) vocabularies"));
  }
  absl::StatusOr<std::vector<std::string>> tokens = meta.Strings("tokenizer.ggml.tokens", true);
  if (!tokens.ok()) return tokens.status();
  b.tokens = *std::move(tokens);
  const size_t n = b.tokens.size();
  if (n == 0) return meta.Invalid("tokenizer.ggml.tokens", "is empty");
  if (n >= (size_t{1} << 30)) return meta.Invalid("tokenizer.ggml.tokens", "is too long");
  absl::StatusOr<std::vector<int64_t>> types = meta.Ints("tokenizer.ggml.token_type");
  if (!types.ok()) return types.status();
  if (!types->empty() && types->size() != n) {
    return meta.Invalid("tokenizer.ggml.token_type",
                        absl::StrCat("has ", types->size(), " entries for ", n, " tokens"));
  }
  b.types = *std::move(types);
  for (const auto& [key, id] : {std::pair{"tokenizer.ggml.bos_token_id", &b.bos},
                                std::pair{"tokenizer.ggml.eos_token_id", &b.eos},
                                std::pair{"tokenizer.ggml.unknown_token_id", &b.unk},
                                std::pair{"tokenizer.ggml.padding_token_id", &b.pad}}) {
    absl::StatusOr<int> read = meta.TokenId(key, n);
    if (!read.ok()) return read.status();
    *id = *read;
  }
  // llama.cpp adds BOS to a sentencepiece vocabulary unless the file says otherwise, and
  // not to a byte-level one (transformers' GGUF loader does the same).
  for (const auto& [key, flag, fallback] :
       {std::tuple{"tokenizer.ggml.add_bos_token", &b.add_bos, !b.byte_level},
        std::tuple{"tokenizer.ggml.add_eos_token", &b.add_eos, false},
        std::tuple{"tokenizer.ggml.add_space_prefix", &b.add_space_prefix, true}}) {
    absl::StatusOr<bool> read = meta.Bool(key, fallback);
    if (!read.ok()) return read.status();
    *flag = *read;
  }
  if (b.add_bos && b.bos < 0) {
    return meta.Invalid("tokenizer.ggml.add_bos_token",
                        "is true but the file has no tokenizer.ggml.bos_token_id");
  }
  if (b.add_eos && b.eos < 0) {
    return meta.Invalid("tokenizer.ggml.add_eos_token",
                        "is true but the file has no tokenizer.ggml.eos_token_id");
  }
  return b;
}

absl::StatusOr<json> ConfigOf(const MetadataReader& meta, const TokenizerBasics& b) {
  const auto token_or_null = [&](int id) { return id >= 0 ? json(b.tokens[id]) : json(nullptr); };
  json config = {{"bos_token", token_or_null(b.bos)}, {"eos_token", token_or_null(b.eos)},
                 {"unk_token", token_or_null(b.unk)}, {"pad_token", token_or_null(b.pad)},
                 {"add_bos_token", b.add_bos},        {"add_eos_token", b.add_eos}};
  absl::StatusOr<std::optional<std::string>> chat_template = meta.String("tokenizer.chat_template");
  if (!chat_template.ok()) return chat_template.status();
  if (chat_template->has_value()) {
    if (FindInvalidUtf8(**chat_template) != std::string_view::npos) {
      return meta.Invalid("tokenizer.chat_template", "is not valid UTF-8");
    }
    config["chat_template"] = **chat_template;
  }
  return config;
}

}  // namespace

absl::StatusOr<GgufTokenizerDocuments> GgufTokenizerDocumentsOf(const GgufFile& file) {
  const MetadataReader meta(file);
  absl::StatusOr<TokenizerBasics> basics = ReadBasics(meta);
  if (!basics.ok()) return basics.status();
  const TokenizerBasics& b = *basics;
  const bool byte_level = b.byte_level;
  const std::vector<std::string>& tokens = b.tokens;
  const size_t n = tokens.size();
  const auto type_of = [&](size_t i) { return b.types.empty() ? int64_t{1} : b.types[i]; };
  GgufTokenizerDocuments docs;
  docs.ids = {b.bos, b.eos, b.pad};
  absl::StatusOr<json> config = ConfigOf(meta, b);
  if (!config.ok()) return config.status();
  docs.config = *std::move(config);

  // The vocabulary, as the BPE model sees it, and the added tokens.
  std::vector<std::string> vocab_tokens(n);
  json added = json::array();
  for (size_t i = 0; i < n; ++i) {
    const std::string& token = tokens[i];
    const int64_t type = type_of(i);
    const bool whole = type == kTypeControl || type == kTypeUnknown || type == kTypeUserDefined;
    if ((whole || !byte_level) && FindInvalidUtf8(token) != std::string_view::npos) {
      return meta.Invalid(absl::StrCat("tokenizer.ggml.tokens[", i, "]"), "is not valid UTF-8");
    }
    // convert_hf_to_gguf writes control and user-defined tokens of a byte-level vocabulary
    // as their text, the others in the byte alphabet; a token outside it is respelled so
    // (as transformers does), except a control or user-defined one, which keeps its text:
    // it is matched whole as an added token, as the original tokenizer.json did.
    if (byte_level && !whole && !IsByteLevelSpelled(token)) {
      hf::AppendByteChars(token, &vocab_tokens[i]);
    } else {
      vocab_tokens[i] = token;
    }
    if (whole && !token.empty()) {
      added.push_back(AddedToken(token, static_cast<int>(i), type != kTypeUserDefined));
    }
  }
  json vocab = json::object();
  for (size_t i = 0; i < n; ++i) vocab[vocab_tokens[i]] = i;

  // The merges: from the file, or derived from the scores.
  absl::StatusOr<std::vector<std::string>> file_merges =
      meta.Strings("tokenizer.ggml.merges", /*required=*/byte_level);
  if (!file_merges.ok()) return file_merges.status();
  json merges = json::array();
  if (file_merges->empty() && !byte_level) {
    absl::StatusOr<std::vector<double>> scores = meta.Floats("tokenizer.ggml.scores");
    if (!scores.ok()) return scores.status();
    if (scores->size() != n) {
      return meta.Invalid(
          "tokenizer.ggml.scores",
          scores->empty() ? "is missing (a llama vocabulary without tokenizer.ggml.merges "
                            "needs scores to derive its merges from)"
                          : absl::StrCat("has ", scores->size(), " entries for ", n, " tokens"));
    }
    for (auto& [left, right] : MergesFromScores(tokens, *scores)) {
      merges.push_back({std::move(left), std::move(right)});
    }
  } else {
    absl::flat_hash_map<std::string_view, int> known;
    for (size_t i = 0; i < n; ++i) known.emplace(vocab_tokens[i], static_cast<int>(i));
    for (size_t i = 0; i < file_merges->size(); ++i) {
      const std::string& merge = (*file_merges)[i];
      const std::string key = absl::StrCat("tokenizer.ggml.merges[", i, "]");
      const size_t space = merge.find(' ');
      if (space == std::string::npos || merge.find(' ', space + 1) != std::string::npos) {
        return meta.Invalid(key,
                            absl::StrCat("\"", merge, "\" is not two tokens separated by a space"));
      }
      const std::string left = merge.substr(0, space);
      const std::string right = merge.substr(space + 1);
      for (const std::string& part : {left, right, left + right}) {
        if (!known.contains(std::string_view(part))) {
          return meta.Invalid(key, absl::StrCat("(\"", merge, "\") names \"", part,
                                                "\", which is not in tokenizer.ggml.tokens"));
        }
      }
      merges.push_back({left, right});
    }
  }

  json model = {{"type", "BPE"},
                {"dropout", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"vocab", std::move(vocab)},
                {"merges", std::move(merges)}};
  json& doc = docs.tokenizer;
  doc = {{"version", "1.0"}, {"normalizer", nullptr}};
  if (byte_level) {
    absl::StatusOr<std::optional<std::string>> pre = meta.String("tokenizer.ggml.pre");
    if (!pre.ok()) return pre.status();
    const std::string pre_name = pre->value_or("default");
    const auto it = PreTokenizers().find(pre_name);
    if (it == PreTokenizers().end()) {
      return meta.Unimplemented(
          "tokenizer.ggml.pre",
          absl::StrCat("is \"", pre_name, "\", a pre-tokenizer Conveyor does not know (known: ",
                       absl::StrJoin(KnownGgufPreTokenizers(), ", "), ")"));
    }
    model["unk_token"] = nullptr;
    model["fuse_unk"] = false;
    model["byte_fallback"] = false;
    model["ignore_merges"] = it->second.ignore_merges;
    doc["pre_tokenizer"] = PreTokenizerDocument(it->second);
    doc["decoder"] = {{"type", "ByteLevel"},
                      {"add_prefix_space", true},
                      {"trim_offsets", true},
                      {"use_regex", true}};
  } else {
    // transformers' LlamaTokenizer: "▁" for spaces, one in front of the text (only at its
    // start, prepend_scheme "first"), byte fallback, and a decoder undoing both.
    model["unk_token"] = b.unk >= 0 ? json(vocab_tokens[b.unk]) : json(nullptr);
    model["fuse_unk"] = true;
    model["byte_fallback"] = true;
    model["ignore_merges"] = false;
    doc["pre_tokenizer"] = {{"type", "Metaspace"},
                            {"replacement", "\u2581"},
                            {"prepend_scheme", b.add_space_prefix ? "first" : "never"},
                            {"split", false}};
    json decoders = {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                     {{"type", "ByteFallback"}},
                     {{"type", "Fuse"}}};
    if (b.add_space_prefix) {
      decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    }
    doc["decoder"] = {{"type", "Sequence"}, {"decoders", std::move(decoders)}};
  }
  doc["model"] = std::move(model);
  doc["added_tokens"] = std::move(added);
  doc["post_processor"] = PostProcessor(tokens, b.bos, b.eos, b.add_bos, b.add_eos);

  return docs;
}

absl::StatusOr<std::unique_ptr<HfTokenizer>> LoadGgufTokenizer(const GgufFile& file) {
  absl::StatusOr<GgufTokenizerDocuments> docs = GgufTokenizerDocumentsOf(file);
  if (!docs.ok()) return docs.status();
  return HfTokenizer::FromDocument(docs->tokenizer,
                                   absl::StrCat(file.path(), " (its tokenizer.ggml.* metadata)"),
                                   docs->ids, "gguf");
}

absl::StatusOr<std::unique_ptr<HfTokenizer>> LoadGgufTokenizer(const std::string& path) {
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  if (!file.ok()) return file.status();
  return LoadGgufTokenizer(**file);
}

absl::StatusOr<json> LoadGgufTokenizerConfig(const std::string& path) {
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  if (!file.ok()) return file.status();
  const MetadataReader meta(**file);
  absl::StatusOr<TokenizerBasics> basics = ReadBasics(meta);
  if (!basics.ok()) return basics.status();
  return ConfigOf(meta, *basics);
}

}  // namespace conveyor
