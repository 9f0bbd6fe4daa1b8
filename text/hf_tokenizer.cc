#include "text/hf_tokenizer.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/utf8.h"
#include "nlohmann/json.hpp"
#include "text/hf_tokenizer_bpe.h"
#include "text/hf_tokenizer_components.h"
#include "text/hf_tokenizer_text.h"

namespace conveyor {
namespace hf {

using json = nlohmann::json;

// One entry of tokenizer.json's "added_tokens".
struct AddedToken {
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;

  bool operator==(const AddedToken&) const = default;
};

// A stretch of text [begin, end) between added tokens (id -1), or an added token.
struct Segment {
  size_t begin;
  size_t end;
  int id;
};

// Finds the added tokens in text as HF does with aho-corasick's leftmost-longest matching:
// the match that starts first, the longest of those starting there. A byte trie; a table
// of first bytes lets the scan skip text that cannot start a token.
class TokenTrie {
 public:
  TokenTrie() : node_value_(1, -1) { first_bytes_.fill(false); }

  bool empty() const { return node_value_.size() == 1; }

  // Adds `pattern` (non-empty) with `value`; a pattern added twice keeps its first value.
  void Add(std::string_view pattern, int value) {
    int node = 0;
    first_bytes_[static_cast<unsigned char>(pattern[0])] = true;
    for (const char c : pattern) {
      const auto [it, inserted] = edges_.try_emplace(EdgeKey(node, c), 0);
      if (inserted) {
        it->second = static_cast<int>(node_value_.size());
        node_value_.push_back(-1);
      }
      node = it->second;
    }
    if (node_value_[node] < 0) node_value_[node] = value;
  }

  // Finds the first match at or after `from`; false when there is none.
  bool Find(std::string_view text, size_t from, size_t* begin, size_t* end, int* value) const {
    for (size_t i = from; i < text.size(); ++i) {
      if (!first_bytes_[static_cast<unsigned char>(text[i])]) continue;
      int node = 0;
      int best_value = -1;
      size_t best_end = 0;
      for (size_t j = i; j < text.size(); ++j) {
        const auto it = edges_.find(EdgeKey(node, text[j]));
        if (it == edges_.end()) break;
        node = it->second;
        if (node_value_[node] >= 0) {
          best_value = node_value_[node];
          best_end = j + 1;
        }
      }
      if (best_value >= 0) {
        *begin = i;
        *end = best_end;
        *value = best_value;
        return true;
      }
    }
    return false;
  }

 private:
  static uint64_t EdgeKey(int node, char c) {
    return static_cast<uint64_t>(node) << 8 | static_cast<unsigned char>(c);
  }

  std::vector<int> node_value_;  // Per node: the value of the pattern ending there, or -1.
  absl::flat_hash_map<uint64_t, int> edges_;
  std::array<bool, 256> first_bytes_;
};

// The added tokens: their ids, as HF assigns them, and the two tries HF splits text with
// (raw text for tokens with normalized=false, normalized text for the others).
class AddedVocabulary {
 public:
  static absl::StatusOr<std::unique_ptr<AddedVocabulary>> Parse(const json* added_tokens,
                                                                const BpeModel& model,
                                                                const Normalizer* normalizer) {
    auto vocab = std::make_unique<AddedVocabulary>();
    if (added_tokens == nullptr || added_tokens->is_null()) return vocab;
    if (!added_tokens->is_array()) {
      return absl::InvalidArgumentError("added_tokens must be an array");
    }
    std::vector<AddedToken> tokens;
    for (size_t i = 0; i < added_tokens->size(); ++i) {
      const json& entry = (*added_tokens)[i];
      const std::string where = absl::StrCat("added_tokens[", i, "]");
      if (!entry.is_object()) return absl::InvalidArgumentError(where + " must be an object");
      AddedToken token;
      for (const auto& status : {ReadString(entry, "content", where, &token.content),
                                 ReadBool(entry, "single_word", where, &token.single_word),
                                 ReadBool(entry, "lstrip", where, &token.lstrip),
                                 ReadBool(entry, "rstrip", where, &token.rstrip),
                                 ReadBool(entry, "normalized", where, &token.normalized),
                                 ReadBool(entry, "special", where, &token.special)}) {
        if (!status.ok()) return status;
      }
      if (FindInvalidUtf8(token.content) != std::string_view::npos) {
        return absl::InvalidArgumentError(where + ".content is not valid UTF-8");
      }
      tokens.push_back(std::move(token));
    }
    // HF ignores the "id" written in the file: a token in the model's vocabulary keeps
    // that id, any other gets the next one after the vocabulary and the tokens so far
    // (AddedVocabulary::add_tokens). In files HF wrote, the two agree.
    std::vector<const AddedToken*> specials;  // In file order, first of each content.
    for (const AddedToken& token : tokens) {
      if (token.special && !token.content.empty() &&
          vocab->special_contents_.insert(token.content).second) {
        specials.push_back(&token);
      }
    }
    std::vector<const AddedToken*> plain;
    int max_added = -1;
    for (const AddedToken& token : tokens) {
      if (token.content.empty()) continue;
      // An identical token seen before is skipped. (One content only ever has one id, so
      // an identical token can only sit under that id.)
      const int known = vocab->IdOfAdded(token.content);
      if (const AddedToken* existing = vocab->ById(known);
          existing != nullptr && *existing == token) {
        continue;
      }
      int id = vocab->IdOf(token.content, model);
      if (id < 0) {
        const int entries = model.vocab_entries();
        id = max_added < 0 ? entries
                           : (max_added >= entries || entries == 0 ? max_added + 1 : entries);
      }
      vocab->content_to_id_[token.content] = id;
      vocab->by_id_[id] = token;
      max_added = std::max(max_added, id);
      if (!vocab->special_contents_.contains(token.content)) plain.push_back(&token);
    }
    vocab->max_id_ = max_added;
    // The tries: special tokens first, then the others, each in file order.
    specials.insert(specials.end(), plain.begin(), plain.end());
    for (const AddedToken* token : specials) {
      const int id = vocab->IdOf(token->content, model);
      if (!token->normalized) {
        vocab->raw_.Add(token->content, id);
        continue;
      }
      std::string pattern = token->content;
      if (normalizer != nullptr) {
        if (absl::Status s = normalizer->Normalize(&pattern); !s.ok()) return s;
      }
      // An empty pattern would match everywhere; no real tokenizer has one.
      if (!pattern.empty()) vocab->normalized_.Add(pattern, id);
    }
    return vocab;
  }

  // The id of added token `content`, else of the model's entry, else -1.
  int IdOf(std::string_view content, const BpeModel& model) const {
    const auto it = content_to_id_.find(AsAbsl(content));
    return it != content_to_id_.end() ? it->second : model.TokenToId(content);
  }
  int IdOfAdded(std::string_view content) const {
    const auto it = content_to_id_.find(AsAbsl(content));
    return it != content_to_id_.end() ? it->second : -1;
  }
  const AddedToken* ById(int id) const {
    const auto it = by_id_.find(id);
    return it == by_id_.end() ? nullptr : &it->second;
  }
  bool IsSpecial(int id) const {
    const AddedToken* token = ById(id);
    return token != nullptr && special_contents_.contains(token->content);
  }
  int max_id() const { return max_id_; }

  // Cuts the added tokens of one trie out of `text` (HF's find_matches); the segments
  // cover the text in order.
  void Split(std::string_view text, bool normalized, std::vector<Segment>* out) const {
    out->clear();
    const TokenTrie& trie = normalized ? normalized_ : raw_;
    size_t done = 0;  // End of the last segment.
    size_t from = 0;  // Where the trie search resumes: the end of its last match.
    size_t begin, end;
    int id;
    while (trie.Find(text, from, &begin, &end, &id)) {
      from = end;
      const AddedToken& token = *ById(id);
      if (token.single_word) {
        const bool word_before = begin > 0 && IsRegexWordChar(CharBefore(text, begin));
        size_t next = end;
        const bool word_after = end < text.size() && IsRegexWordChar(NextChar(text, &next));
        if (word_before || word_after) continue;
      }
      if (token.lstrip) {
        size_t start = begin;
        while (start > 0 && IsWhitespace(CharBefore(text, start))) {
          do --start;
          while ((static_cast<unsigned char>(text[start]) & 0xC0) == 0x80);
        }
        begin = std::max(start, done);
      }
      if (token.rstrip) {
        while (end < text.size()) {
          size_t next = end;
          if (!IsWhitespace(NextChar(text, &next))) break;
          end = next;
        }
      }
      if (done < begin) out->push_back({done, begin, -1});
      out->push_back({begin, end, id});
      done = end;
    }
    if (done != text.size()) out->push_back({done, text.size(), -1});
  }

  bool has_raw() const { return !raw_.empty(); }
  bool has_normalized() const { return !normalized_.empty(); }

 private:
  static char32_t CharBefore(std::string_view text, size_t at) {
    size_t start = at - 1;
    while ((static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
    return NextChar(text, &start);
  }

  absl::flat_hash_map<std::string, int> content_to_id_;
  absl::flat_hash_map<int, AddedToken> by_id_;
  absl::flat_hash_set<std::string> special_contents_;
  int max_id_ = -1;
  TokenTrie raw_;
  TokenTrie normalized_;
};

}  // namespace hf

namespace {

using json = nlohmann::json;

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  return contents.str();
}

// A tokenizer_config.json special token: "<s>", {"content": "<s>", ...} or null.
std::string SpecialTokenName(const json& config, std::string_view key) {
  const auto it = config.find(key);
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    const auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
  }
  return "";
}

// Adds `source: ` in front of an error's message.
absl::Status InFile(const absl::Status& status, std::string_view source) {
  return absl::Status(status.code(), absl::StrCat(hf::AsAbsl(source), ": ", status.message()));
}

}  // namespace

HfTokenizer::HfTokenizer() = default;
HfTokenizer::~HfTokenizer() = default;

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::Load(
    const std::string& tokenizer_json_path, const std::string& tokenizer_config_path) {
  absl::StatusOr<std::string> json_text = ReadWholeFile(tokenizer_json_path);
  if (!json_text.ok()) return json_text.status();
  std::string config_text;
  std::error_code ec;
  if (!tokenizer_config_path.empty() && std::filesystem::exists(tokenizer_config_path, ec)) {
    absl::StatusOr<std::string> config = ReadWholeFile(tokenizer_config_path);
    if (!config.ok()) return config.status();
    config_text = *std::move(config);
    if (config_text.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(tokenizer_config_path, " is empty"));
    }
  }
  return Parse(*json_text, tokenizer_json_path, config_text, tokenizer_config_path);
}

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::Parse(std::string_view json_text,
                                                                std::string_view source,
                                                                std::string_view config_json,
                                                                std::string_view config_source) {
  const json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  absl::StatusOr<std::unique_ptr<HfTokenizer>> built = Build(root, source);
  if (!built.ok()) return built.status();
  std::unique_ptr<HfTokenizer> tokenizer = *std::move(built);
  if (!config_json.empty()) {
    const json config = json::parse(config_json, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(hf::AsAbsl(config_source), ": not a JSON object"));
    }
    const auto id_of = [&](std::string_view key) {
      const std::string name = SpecialTokenName(config, key);
      return name.empty() ? -1 : tokenizer->TokenToId(name);
    };
    tokenizer->bos_id_ = id_of("bos_token");
    tokenizer->eos_id_ = id_of("eos_token");
    tokenizer->pad_id_ = id_of("pad_token");
  }
  return tokenizer;
}

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::FromDocument(const json& document,
                                                                       std::string_view source,
                                                                       const SpecialIds& ids,
                                                                       std::string_view kind) {
  absl::StatusOr<std::unique_ptr<HfTokenizer>> built = Build(document, source);
  if (!built.ok()) return built.status();
  std::unique_ptr<HfTokenizer> tokenizer = *std::move(built);
  tokenizer->kind_ = std::string(kind);
  tokenizer->bos_id_ = ids.bos;
  tokenizer->eos_id_ = ids.eos;
  tokenizer->pad_id_ = ids.pad;
  return tokenizer;
}

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::Build(const json& root,
                                                                std::string_view source) {
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(hf::AsAbsl(source), ": not a JSON object"));
  }
  std::unique_ptr<HfTokenizer> tokenizer(new HfTokenizer());
  const auto field = [&root](std::string_view key) -> const json* {
    const auto it = root.find(key);
    return it == root.end() || it->is_null() ? nullptr : &*it;
  };

  const json* model = field("model");
  if (model == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(hf::AsAbsl(source), ": no \"model\""));
  }
  std::string model_type = "BPE";  // Files without a type hold BPE fields.
  if (absl::Status s = hf::ReadString(*model, "type", "model", &model_type); !s.ok()) {
    return InFile(s, source);
  }
  if (model_type != "BPE") {
    return absl::InvalidArgumentError(absl::StrCat(hf::AsAbsl(source),
                                                   ": model: unknown or unsupported model type \"",
                                                   model_type, "\" (only BPE)"));
  }
  absl::StatusOr<std::unique_ptr<hf::BpeModel>> bpe = hf::BpeModel::Parse(*model, "model");
  if (!bpe.ok()) return InFile(bpe.status(), source);
  tokenizer->model_ = *std::move(bpe);

  if (const json* normalizer = field("normalizer")) {
    auto parsed = hf::ParseNormalizer(*normalizer, "normalizer");
    if (!parsed.ok()) return InFile(parsed.status(), source);
    tokenizer->normalizer_ = *std::move(parsed);
  }
  if (const json* pre_tokenizer = field("pre_tokenizer")) {
    auto parsed = hf::ParsePreTokenizer(*pre_tokenizer, "pre_tokenizer");
    if (!parsed.ok()) return InFile(parsed.status(), source);
    tokenizer->pre_tokenizer_ = *std::move(parsed);
  }
  if (const json* decoder = field("decoder")) {
    auto parsed = hf::ParseDecoder(*decoder, "decoder");
    if (!parsed.ok()) return InFile(parsed.status(), source);
    tokenizer->decoder_ = *std::move(parsed);
  }
  auto added = hf::AddedVocabulary::Parse(field("added_tokens"), *tokenizer->model_,
                                          tokenizer->normalizer_.get());
  if (!added.ok()) return InFile(added.status(), source);
  tokenizer->added_ = *std::move(added);

  if (const json* post_processor = field("post_processor")) {
    auto parsed = hf::ParsePostProcessor(*post_processor, "post_processor");
    if (!parsed.ok()) return InFile(parsed.status(), source);
    tokenizer->post_processor_ = *std::move(parsed);
  }
  tokenizer->vocab_size_ = std::max(tokenizer->model_->max_id(), tokenizer->added_->max_id()) + 1;
  return tokenizer;
}

int HfTokenizer::TokenToId(std::string_view token) const { return added_->IdOf(token, *model_); }

absl::StatusOr<std::vector<int>> HfTokenizer::Encode(std::string_view text) const {
  return EncodeImpl(text, /*add_special_tokens=*/false);
}

absl::StatusOr<std::vector<int>> HfTokenizer::EncodeWithSpecialTokens(std::string_view text) const {
  return EncodeImpl(text, /*add_special_tokens=*/true);
}

absl::StatusOr<std::vector<int>> HfTokenizer::EncodeImpl(std::string_view text,
                                                         bool add_special_tokens) const {
  if (const size_t bad = FindInvalidUtf8(text); bad != std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("the text is not valid UTF-8 (at byte ", bad, ")"));
  }
  std::vector<int> ids;
  ids.reserve(text.size() / 3 + 4);
  thread_local std::vector<hf::Segment> segments;
  thread_local std::vector<hf::Segment> normalized_segments;
  thread_local std::string normalized;
  if (added_->has_raw()) {
    added_->Split(text, /*normalized=*/false, &segments);
  } else {
    segments.assign(1, {0, text.size(), -1});
  }
  // `segments` is reused by nothing below, so iterating it is safe.
  for (const hf::Segment& segment : segments) {
    if (segment.id >= 0) {
      ids.push_back(segment.id);
      continue;
    }
    std::string_view stretch = text.substr(segment.begin, segment.end - segment.begin);
    if (stretch.empty()) continue;
    const bool at_start = segment.begin == 0;
    if (normalizer_ != nullptr) {
      normalized.assign(stretch);
      if (absl::Status s = normalizer_->Normalize(&normalized); !s.ok()) return s;
      stretch = normalized;
    }
    if (!added_->has_normalized()) {
      if (absl::Status s = TokenizeStretch(stretch, at_start, &ids); !s.ok()) return s;
      continue;
    }
    added_->Split(stretch, /*normalized=*/true, &normalized_segments);
    for (const hf::Segment& part : normalized_segments) {
      if (part.id >= 0) {
        ids.push_back(part.id);
        continue;
      }
      const std::string_view piece = stretch.substr(part.begin, part.end - part.begin);
      if (absl::Status s = TokenizeStretch(piece, at_start && part.begin == 0, &ids); !s.ok()) {
        return s;
      }
    }
  }
  if (add_special_tokens && post_processor_ != nullptr) post_processor_->Process(&ids);
  return ids;
}

absl::Status HfTokenizer::TokenizeStretch(std::string_view text, bool at_start,
                                          std::vector<int>* ids) const {
  if (text.empty()) return absl::OkStatus();
  if (pre_tokenizer_ == nullptr) return model_->Tokenize(text, ids);
  thread_local hf::PieceList in;
  thread_local hf::PieceList out;
  in.Clear();
  out.Clear();
  in.Add(text, at_start);
  if (absl::Status s = pre_tokenizer_->PreTokenize(in, &out); !s.ok()) return s;
  for (const hf::PieceList::Piece& piece : out.pieces()) {
    if (absl::Status s = model_->Tokenize(out.text(piece), ids); !s.ok()) return s;
  }
  return absl::OkStatus();
}

const std::string* HfTokenizer::IdToToken(int id) const {
  if (const hf::AddedToken* added = added_->ById(id)) return &added->content;
  return model_->IdToToken(id);
}

std::string HfTokenizer::Decode(const std::vector<int>& ids) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int id : ids) {
    if (const std::string* token = IdToToken(id)) tokens.push_back(*token);
  }
  if (decoder_ == nullptr) return absl::StrJoin(tokens, " ");
  decoder_->DecodeChain(&tokens);
  return absl::StrJoin(tokens, "");
}

std::string HfTokenizer::Piece(int id) const {
  const std::string* token = IdToToken(id);
  return token == nullptr ? "" : *token;
}

bool HfTokenizer::IsSpecial(int id) const { return added_->IsSpecial(id); }

}  // namespace conveyor
