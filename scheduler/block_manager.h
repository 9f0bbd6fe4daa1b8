// The scheduler's ledger of KV-cache blocks: who holds which block, which blocks are free,
// and which full blocks hold a prefix that a later request may reuse (prefix caching).
// Pure bookkeeping: the KV memory itself lives on the workers (model/kv_cache.h).
//
// A block is in exactly one of three states:
//   free       ref count 0, not cached: on the free list;
//   evictable  ref count 0, cached: still hittable, on an LRU list, reclaimed oldest first;
//   used       ref count > 0, held by at least one BlockTable (shared when cached).
// A cached block is keyed by hash(parent's hash, its tokens). A lookup also compares the
// tokens and the parent's identity, so a hash collision can never serve wrong KV.
//
// Not thread-safe: the scheduler loop owns the manager and every table.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace conveyor::scheduler {

class BlockManager;

// The KV blocks of one sequence, in order: block i holds token positions
// [i * block_size, (i + 1) * block_size). Move-only; returns its blocks to the manager when
// destroyed or Release()d, so no code path can leak a block. Must not outlive its manager.
class BlockTable {
 public:
  BlockTable() = default;
  BlockTable(const BlockTable&) = delete;
  BlockTable& operator=(const BlockTable&) = delete;
  BlockTable(BlockTable&& other) noexcept;
  // Releases this table's own blocks, then takes over `other`'s.
  BlockTable& operator=(BlockTable&& other) noexcept;
  ~BlockTable();

  const std::vector<int32_t>& blocks() const { return blocks_; }
  int num_blocks() const { return static_cast<int>(blocks_.size()); }

  // Returns every block to the manager; the table is left empty and may be grown again.
  void Release();

 private:
  friend class BlockManager;

  BlockManager* manager_ = nullptr;
  std::vector<int32_t> blocks_;
  // The contents of the first `num_committed_blocks_` blocks are in the prefix cache (in
  // these blocks, or in identical ones computed first by another sequence). `chain_hash_`
  // and `chain_serial_` identify the cached block holding the last of them.
  int num_committed_blocks_ = 0;
  uint64_t chain_hash_ = 0;
  uint64_t chain_serial_ = 0;
};

class BlockManager {
 public:
  BlockManager(int num_blocks, int block_size, bool enable_prefix_caching);
  BlockManager(const BlockManager&) = delete;
  BlockManager& operator=(const BlockManager&) = delete;

  struct PrefixMatch {
    BlockTable table;
    int num_cached_tokens = 0;  // A multiple of block_size, < tokens.size() (or 0).
  };

  // Takes references on the longest run of cached full blocks that prefixes `tokens`,
  // leaving at least one token to compute (so at most (size - 1) / block_size blocks).
  // Counts the blocks asked for as queries and those found as hits. With prefix caching
  // off, returns an empty match and counts nothing.
  PrefixMatch AcquirePrefix(std::span<const int32_t> tokens);

  // Grows `table` to hold `num_tokens` tokens, reclaiming the oldest evictable blocks when
  // the free list runs out. Returns false, changing nothing, if too few blocks are free or
  // evictable. Never shrinks a table.
  bool EnsureCapacity(BlockTable& table, int num_tokens);

  // A new table holding the first `num_blocks` blocks of `source` (which must have that
  // many), each shared: their ref counts go up, and no sequence writes them again (a
  // sequence only writes the KV of the tokens it computes, after the blocks it shares).
  // How the n choices of one request share their prompt's blocks.
  BlockTable Share(const BlockTable& source, int num_blocks);

  // Returns how many blocks EnsureCapacity(table, num_tokens) would take.
  int BlocksNeeded(const BlockTable& table, int num_tokens) const;

  // Returns whether `num_new_blocks` blocks can be taken now (free or evictable).
  bool CanAllocate(int num_new_blocks) const { return num_new_blocks <= num_free_blocks(); }

  // Records that the first `num_computed_tokens` of `tokens` (the sequence's whole token
  // list) have their KV in `table`'s blocks: the full blocks among them become hittable by
  // later requests. A block whose content is already cached stays private (no duplicates).
  void CommitComputed(BlockTable& table, std::span<const int32_t> tokens, int num_computed_tokens);

  // Starts over with `num_blocks` empty blocks and an empty prefix cache: the workers'
  // KV cache is new (they were re-initialised after a failure). Every table must have
  // been released; the counters of prefix lookups carry on.
  void Reset(int num_blocks);

  int num_blocks() const { return static_cast<int>(blocks_.size()); }
  int block_size() const { return block_size_; }
  // Blocks that can be taken: never used or freed, plus evictable cached blocks.
  int num_free_blocks() const { return static_cast<int>(free_blocks_.size()) + num_evictable_; }
  // Blocks held by at least one table.
  int num_used_blocks() const { return num_blocks() - num_free_blocks(); }
  // Blocks in the prefix cache, held or evictable.
  int num_cached_blocks() const { return static_cast<int>(cached_blocks_.size()); }
  // Full prompt blocks looked up by AcquirePrefix, and how many of them were found.
  uint64_t prefix_queries() const { return prefix_queries_; }
  uint64_t prefix_hits() const { return prefix_hits_; }

 private:
  friend class BlockTable;
  friend class BlockManagerTestPeer;

  // Hash of a full block from its parent's hash (0 for the first block) and its tokens.
  using BlockHashFn = uint64_t (*)(uint64_t parent_hash, std::span<const int32_t> tokens);

  struct Block {
    int32_t ref_count = 0;
    // Cached blocks only: a serial unique over the manager's life (0 = not cached), the
    // key in `cached_blocks_`, and the serial of the block holding the previous block's
    // content when this one was computed (0 for a sequence's first block).
    uint64_t serial = 0;
    uint64_t hash = 0;
    uint64_t parent_serial = 0;
    // Links of the LRU list of evictable blocks (-1 at the ends or when not on it).
    int32_t lru_prev = -1;
    int32_t lru_next = -1;
  };

  // Returns whether `block` is cached with exactly these tokens after this parent.
  bool CachedContentEquals(int32_t block, uint64_t parent_serial,
                           std::span<const int32_t> tokens) const;
  // Caches `block` under `hash`, which must be unused in `cached_blocks_`.
  void Cache(int32_t block, uint64_t hash, uint64_t parent_serial, std::span<const int32_t> tokens);

  // Takes a block off the free list, else evicts the least recently used cached block.
  int32_t TakeBlock();
  void AddRef(int32_t block);
  void DropRef(int32_t block);
  void ReleaseTable(BlockTable& table);
  // Removes `block` from the prefix cache; an evictable block moves to the free list.
  void Uncache(int32_t block);

  void LruPushNewest(int32_t block);
  void LruRemove(int32_t block);

  const int block_size_;
  const bool enable_prefix_caching_;
  BlockHashFn hash_fn_;  // Replaceable by tests, to force collisions.
  std::vector<Block> blocks_;
  std::vector<int32_t> block_tokens_;  // block_size tokens per block; valid if cached.
  std::vector<int32_t> free_blocks_;   // A stack: the next block taken is at the back.
  int32_t lru_oldest_ = -1;
  int32_t lru_newest_ = -1;
  int num_evictable_ = 0;
  absl::flat_hash_map<uint64_t, int32_t> cached_blocks_;  // Hash -> cached block.
  uint64_t last_serial_ = 0;
  uint64_t prefix_queries_ = 0;
  uint64_t prefix_hits_ = 0;
};

}  // namespace conveyor::scheduler
