#include "text/hf_tokenizer_bpe.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "text/hf_tokenizer_components.h"
#include "text/hf_tokenizer_text.h"

namespace conveyor::hf {
namespace {

using json = nlohmann::json;

// HF caches words shorter than this (its MAX_LENGTH); longer ones are rarely repeated.
constexpr size_t kMaxCachedWordBytes = 256;
constexpr size_t kCharTableSize = 0x10000;

struct Symbol {
  int id;
  int prev;  // Index of the live symbol before, or -1.
  int next;  // Index of the live symbol after, or -1.
  int len;   // Bytes of the word it covers; 0 once merged into the symbol before it.
};

struct Candidate {
  int rank;
  int pos;  // Index of the pair's left symbol.
  int id;   // What the pair merges into.
};

// Orders the heap so that its top is the lowest rank, then the leftmost position.
bool AfterInHeap(const Candidate& a, const Candidate& b) {
  return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
}

absl::Status Invalid(const std::string& where, std::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", AsAbsl(message)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::Parse(const json& model,
                                                          const std::string& where) {
  std::unique_ptr<BpeModel> bpe(new BpeModel());
  if (absl::Status s = ReadString(model, "unk_token", where, &bpe->unk_token_); !s.ok()) return s;
  if (absl::Status s =
          ReadString(model, "continuing_subword_prefix", where, &bpe->continuing_subword_prefix_);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ReadString(model, "end_of_word_suffix", where, &bpe->end_of_word_suffix_);
      !s.ok()) {
    return s;
  }
  for (const auto& [key, flag] :
       {std::pair{"fuse_unk", &bpe->fuse_unk_}, std::pair{"byte_fallback", &bpe->byte_fallback_},
        std::pair{"ignore_merges", &bpe->ignore_merges_}}) {
    if (absl::Status s = ReadBool(model, key, where, flag); !s.ok()) return s;
  }
  if (const auto it = model.find("dropout"); it != model.end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() != 0.0) {
      return Invalid(where, "dropout is not supported (it makes encoding random); set it to null");
    }
  }

  const auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object()) {
    return Invalid(where, "vocab must be an object of token: id");
  }
  bpe->vocab_.reserve(vocab->size());
  for (const auto& [token, id] : vocab->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (1 << 30)) {
      return Invalid(where, absl::StrCat("vocab[\"", token, "\"] must be a non-negative id"));
    }
    const int i = id.get<int>();
    bpe->vocab_.emplace(token, i);
    if (static_cast<size_t>(i) >= bpe->id_to_token_.size()) {
      bpe->id_to_token_.resize(i + 1);
      bpe->has_token_.resize(i + 1);
    }
    if (!bpe->has_token_[i]) {
      bpe->id_to_token_[i] = token;
      bpe->has_token_[i] = true;
    }
  }

  const auto merges = model.find("merges");
  if (merges != model.end() && !merges->is_null()) {
    if (!merges->is_array()) return Invalid(where, "merges must be an array");
    bpe->merges_.reserve(merges->size());
    const size_t prefix_bytes = bpe->continuing_subword_prefix_.size();
    for (size_t rank = 0; rank < merges->size(); ++rank) {
      const json& merge = (*merges)[rank];
      std::string left, right;
      // Older files write "a b", newer ones ["a", "b"].
      if (merge.is_string()) {
        const std::string& text = merge.get_ref<const std::string&>();
        const size_t space = text.find(' ');
        if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
          return Invalid(where, absl::StrCat("merges[", rank, "] \"", text,
                                             "\" is not two tokens separated by a space"));
        }
        left = text.substr(0, space);
        right = text.substr(space + 1);
      } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
                 merge[1].is_string()) {
        left = merge[0].get<std::string>();
        right = merge[1].get<std::string>();
      } else {
        return Invalid(where, absl::StrCat("merges[", rank, "] must be \"a b\" or [\"a\", \"b\"]"));
      }
      if (right.size() < prefix_bytes) {
        return Invalid(where, absl::StrCat("merges[", rank, "]: \"", right,
                                           "\" is shorter than continuing_subword_prefix"));
      }
      std::string merged = left + right.substr(prefix_bytes);
      const int left_id = bpe->TokenToId(left);
      const int right_id = bpe->TokenToId(right);
      const int merged_id = bpe->TokenToId(merged);
      for (const auto& [token, id] : {std::pair{&left, left_id}, std::pair{&right, right_id},
                                      std::pair{&merged, merged_id}}) {
        if (id < 0) {
          return Invalid(where, absl::StrCat("merges[", rank, "] uses \"", *token,
                                             "\", which is not in the vocabulary"));
        }
      }
      // A pair listed twice keeps its last rank, as HF's map does.
      bpe->merges_[PairKey(left_id, right_id)] = {static_cast<int>(rank), merged_id};
    }
  }

  bpe->char_ids_.assign(kCharTableSize, -1);
  for (const auto& [token, id] : bpe->vocab_) {
    size_t i = 0;
    if (token.empty()) continue;
    const char32_t c = NextChar(token, &i);
    if (i == token.size() && c < kCharTableSize) bpe->char_ids_[c] = id;
  }
  bpe->byte_ids_.fill(-1);
  if (bpe->byte_fallback_) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      bpe->byte_ids_[b] = bpe->TokenToId(name);
    }
  }
  if (!bpe->unk_token_.empty()) bpe->unk_id_ = bpe->TokenToId(bpe->unk_token_);
  return bpe;
}

int BpeModel::TokenToId(std::string_view token) const {
  const auto it = vocab_.find(AsAbsl(token));
  return it == vocab_.end() ? -1 : it->second;
}

const std::string* BpeModel::IdToToken(int id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_token_[id]) return nullptr;
  return &id_to_token_[id];
}

int BpeModel::CharId(char32_t c, std::string_view text) const {
  if (c < kCharTableSize) return char_ids_[c];
  return TokenToId(text);
}

absl::Status BpeModel::Tokenize(std::string_view word, std::vector<int>* ids) const {
  if (ignore_merges_) {
    if (const int id = TokenToId(word); id >= 0) {
      ids->push_back(id);
      return absl::OkStatus();
    }
  }
  const bool cacheable = word.size() < kMaxCachedWordBytes;
  if (cacheable && cache_.Lookup(word, ids)) return absl::OkStatus();
  const size_t from = ids->size();
  if (absl::Status s = MergeWord(word, ids); !s.ok()) return s;
  if (cacheable) cache_.Insert(word, *ids, from);
  return absl::OkStatus();
}

absl::Status BpeModel::MergeWord(std::string_view word, std::vector<int>* ids) const {
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Candidate> heap;
  thread_local std::string affixed;
  symbols.clear();
  const auto add = [](int id, int len) {
    const int n = static_cast<int>(symbols.size());
    if (n > 0) symbols.back().next = n;
    symbols.push_back({id, n - 1, -1, len});
  };

  // 1. One symbol per character (or per byte, with byte fallback), as HF's merge_word.
  const bool plain = continuing_subword_prefix_.empty() && end_of_word_suffix_.empty();
  int unk = -1;  // A pending unknown token, fused with the next with fuse_unk.
  int unk_len = 0;
  for (size_t i = 0; i < word.size();) {
    const size_t begin = i;
    const char32_t c = NextChar(word, &i);
    const int byte_len = static_cast<int>(i - begin);
    std::string_view piece = word.substr(begin, byte_len);
    int id;
    if (plain) {
      id = CharId(c, piece);
    } else {
      affixed.assign(begin > 0 ? continuing_subword_prefix_ : "");
      affixed.append(piece);
      if (i == word.size()) affixed.append(end_of_word_suffix_);
      piece = affixed;
      id = TokenToId(piece);
    }
    if (id >= 0) {
      if (unk >= 0) {
        add(unk, unk_len);
        unk = -1;
      }
      add(id, byte_len);
      continue;
    }
    if (byte_fallback_ && std::all_of(piece.begin(), piece.end(), [this](char b) {
          return byte_ids_[static_cast<unsigned char>(b)] >= 0;
        })) {
      // HF adds the bytes ahead of a pending unknown token; so does this.
      for (const char b : piece) add(byte_ids_[static_cast<unsigned char>(b)], 1);
      continue;
    }
    if (unk_token_.empty()) continue;  // No unknown token: HF drops the character.
    if (unk_id_ < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("the BPE model's unk_token \"", unk_token_, "\" is not in its vocabulary"));
    }
    if (unk >= 0 && fuse_unk_) {
      unk_len += byte_len;
    } else {
      if (unk >= 0) add(unk, unk_len);
      unk = unk_id_;
      unk_len = byte_len;
    }
  }
  if (unk >= 0) add(unk, unk_len);

  // 2. Merge the lowest-ranked pair, leftmost first, until none is left. Heap entries
  // go stale as symbols merge; each is checked against the pair it was made for.
  heap.clear();
  const auto find_merge = [this](int left, int right) -> const MergeResult* {
    const auto it = merges_.find(PairKey(left, right));
    return it == merges_.end() ? nullptr : &it->second;
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const MergeResult* m = find_merge(symbols[i].id, symbols[i + 1].id)) {
      heap.push_back({m->rank, static_cast<int>(i), m->id});
    }
  }
  std::make_heap(heap.begin(), heap.end(), AfterInHeap);
  const auto push = [](const Candidate& c) {
    heap.push_back(c);
    std::push_heap(heap.begin(), heap.end(), AfterInHeap);
  };
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), AfterInHeap);
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& left = symbols[top.pos];
    if (left.len == 0 || left.next < 0) continue;
    const Symbol right = symbols[left.next];
    const MergeResult* m = find_merge(left.id, right.id);
    if (m == nullptr || m->id != top.id) continue;
    symbols[left.next].len = 0;
    left.id = top.id;
    left.len += right.len;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) {
      if (const MergeResult* before = find_merge(symbols[left.prev].id, left.id)) {
        push({before->rank, left.prev, before->id});
      }
    }
    if (left.next >= 0) {
      if (const MergeResult* after = find_merge(left.id, symbols[left.next].id)) {
        push({after->rank, top.pos, after->id});
      }
    }
  }
  for (const Symbol& s : symbols) {
    if (s.len != 0) ids->push_back(s.id);
  }
  return absl::OkStatus();
}

bool BpeModel::Cache::Lookup(std::string_view word, std::vector<int>* ids) const {
  Shard& shard = shards_[absl::Hash<absl::string_view>()(AsAbsl(word)) % kShards];
  std::lock_guard<std::mutex> lock(shard.mu);
  const auto it = shard.words.find(AsAbsl(word));
  if (it == shard.words.end()) return false;
  ids->insert(ids->end(), it->second.begin(), it->second.end());
  return true;
}

void BpeModel::Cache::Insert(std::string_view word, const std::vector<int>& ids,
                             size_t from) const {
  Shard& shard = shards_[absl::Hash<absl::string_view>()(AsAbsl(word)) % kShards];
  std::lock_guard<std::mutex> lock(shard.mu);
  if (shard.words.size() >= kShardCapacity) shard.words.clear();
  shard.words.try_emplace(std::string(word), ids.begin() + static_cast<std::ptrdiff_t>(from),
                          ids.end());
}

}  // namespace conveyor::hf
