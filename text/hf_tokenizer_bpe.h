// The BPE model of a tokenizer.json ("model": {"type": "BPE", ...}): turns one
// pre-tokenized piece of text into token ids by applying the ranked merges, as HF
// tokenizers' BPE does (byte_fallback, unk_token, fuse_unk, ignore_merges,
// continuing_subword_prefix and end_of_word_suffix included; dropout is refused, since it
// makes encoding random).
//
// Merging always picks the lowest-ranked pair, leftmost among equals, off a heap, so a
// word costs O(n log n) in its characters. Results for words under 256 bytes are cached
// (bounded, sharded by hash, safe to share between threads): most words repeat.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace conveyor::hf {

class BpeModel {
 public:
  // Builds the model from its JSON object; `where` locates it in error messages.
  static absl::StatusOr<std::unique_ptr<BpeModel>> Parse(const nlohmann::json& model,
                                                         const std::string& where);

  BpeModel(const BpeModel&) = delete;
  BpeModel& operator=(const BpeModel&) = delete;

  // Appends the ids of `word`, a non-empty piece of valid UTF-8. Fails only when a
  // character needs the unknown token and the vocabulary lacks it (as HF does).
  absl::Status Tokenize(std::string_view word, std::vector<int>* ids) const;

  // The id of vocabulary entry `token`, or -1.
  int TokenToId(std::string_view token) const;
  // The vocabulary entry with id `id`, or null.
  const std::string* IdToToken(int id) const;
  // Entries in the vocabulary (HF's get_vocab_size, which numbers added tokens from it).
  int vocab_entries() const { return static_cast<int>(vocab_.size()); }
  // The largest id in the vocabulary (-1 when empty).
  int max_id() const { return static_cast<int>(id_to_token_.size()) - 1; }

 private:
  struct MergeResult {
    int rank;
    int id;
  };
  static uint64_t PairKey(int left, int right) {
    return static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32 | static_cast<uint32_t>(right);
  }

  // Bounded word -> ids cache, safe for concurrent use.
  class Cache {
   public:
    bool Lookup(std::string_view word, std::vector<int>* ids) const;
    void Insert(std::string_view word, const std::vector<int>& ids, size_t from) const;

   private:
    static constexpr size_t kShards = 16;
    // Per shard; a full shard starts over, so the cache follows what the text is now.
    static constexpr size_t kShardCapacity = 8192;
    struct Shard {
      std::mutex mu;
      absl::flat_hash_map<std::string, absl::InlinedVector<int, 4>> words;
    };
    mutable std::array<Shard, kShards> shards_;
  };

  BpeModel() = default;
  absl::Status MergeWord(std::string_view word, std::vector<int>* ids) const;
  // The id of the one-character string `c` (UTF-8 bytes `text`), or -1.
  int CharId(char32_t c, std::string_view text) const;

  absl::flat_hash_map<std::string, int> vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_token_;  // Whether id_to_token_[id] is an entry.
  absl::flat_hash_map<uint64_t, MergeResult> merges_;
  // Ids of one-character entries by code point (BMP), for words without prefix/suffix.
  std::vector<int32_t> char_ids_;
  std::array<int, 256> byte_ids_;  // "<0xAB>" entries, with byte_fallback; else -1.
  int unk_id_ = -1;
  std::string unk_token_;  // Empty: characters outside the vocabulary are dropped.
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  Cache cache_;
};

}  // namespace conveyor::hf
