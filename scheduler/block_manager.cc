#include "scheduler/block_manager.h"

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <utility>

namespace conveyor::scheduler {
namespace {

// The splitmix64 finalizer: a cheap bijective mix with good avalanche.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t HashBlockTokens(uint64_t parent_hash, std::span<const int32_t> tokens) {
  uint64_t hash = Mix(parent_hash);
  for (int32_t token : tokens) hash = Mix(hash ^ static_cast<uint32_t>(token));
  return hash;
}

}  // namespace

BlockTable::BlockTable(BlockTable&& other) noexcept
    : manager_(std::exchange(other.manager_, nullptr)),
      blocks_(std::exchange(other.blocks_, {})),
      num_committed_blocks_(std::exchange(other.num_committed_blocks_, 0)),
      chain_hash_(std::exchange(other.chain_hash_, 0)),
      chain_serial_(std::exchange(other.chain_serial_, 0)) {}

BlockTable& BlockTable::operator=(BlockTable&& other) noexcept {
  if (this != &other) {
    Release();
    manager_ = std::exchange(other.manager_, nullptr);
    blocks_ = std::exchange(other.blocks_, {});
    num_committed_blocks_ = std::exchange(other.num_committed_blocks_, 0);
    chain_hash_ = std::exchange(other.chain_hash_, 0);
    chain_serial_ = std::exchange(other.chain_serial_, 0);
  }
  return *this;
}

BlockTable::~BlockTable() { Release(); }

void BlockTable::Release() {
  if (manager_ != nullptr) manager_->ReleaseTable(*this);
}

BlockManager::BlockManager(int num_blocks, int block_size, bool enable_prefix_caching)
    : block_size_(block_size),
      enable_prefix_caching_(enable_prefix_caching),
      hash_fn_(&HashBlockTokens),
      blocks_(num_blocks),
      block_tokens_(enable_prefix_caching ? static_cast<size_t>(num_blocks) * block_size : 0) {
  assert(num_blocks >= 0 && block_size > 0);
  // Lowest ids first, so that allocation order is easy to follow in logs and tests.
  free_blocks_.reserve(num_blocks);
  for (int32_t block = num_blocks - 1; block >= 0; --block) free_blocks_.push_back(block);
  if (enable_prefix_caching) cached_blocks_.reserve(num_blocks);
}

void BlockManager::Reset(int num_blocks) {
  assert(num_blocks >= 0);
  for ([[maybe_unused]] const Block& b : blocks_) assert(b.ref_count == 0);
  blocks_.assign(num_blocks, Block());
  block_tokens_.assign(enable_prefix_caching_ ? static_cast<size_t>(num_blocks) * block_size_ : 0,
                       0);
  free_blocks_.clear();
  for (int32_t block = num_blocks - 1; block >= 0; --block) free_blocks_.push_back(block);
  cached_blocks_.clear();
  lru_oldest_ = lru_newest_ = -1;
  num_evictable_ = 0;
}

BlockManager::PrefixMatch BlockManager::AcquirePrefix(std::span<const int32_t> tokens) {
  PrefixMatch match;
  BlockTable& table = match.table;
  table.manager_ = this;
  if (!enable_prefix_caching_ || tokens.empty()) return match;

  const int max_blocks = static_cast<int>((tokens.size() - 1) / block_size_);
  for (int i = 0; i < max_blocks; ++i) {
    const std::span<const int32_t> block_tokens =
        tokens.subspan(static_cast<size_t>(i) * block_size_, block_size_);
    const uint64_t hash = hash_fn_(table.chain_hash_, block_tokens);
    const auto it = cached_blocks_.find(hash);
    if (it == cached_blocks_.end() ||
        !CachedContentEquals(it->second, table.chain_serial_, block_tokens)) {
      break;
    }
    AddRef(it->second);
    table.blocks_.push_back(it->second);
    table.num_committed_blocks_ = i + 1;
    table.chain_hash_ = hash;
    table.chain_serial_ = blocks_[it->second].serial;
  }
  prefix_queries_ += max_blocks;
  prefix_hits_ += table.num_blocks();
  match.num_cached_tokens = table.num_blocks() * block_size_;
  return match;
}

bool BlockManager::EnsureCapacity(BlockTable& table, int num_tokens) {
  assert(table.manager_ == nullptr || table.manager_ == this);
  const int num_new_blocks = BlocksNeeded(table, num_tokens);
  if (!CanAllocate(num_new_blocks)) return false;
  table.manager_ = this;
  for (int i = 0; i < num_new_blocks; ++i) table.blocks_.push_back(TakeBlock());
  return true;
}

BlockTable BlockManager::Share(const BlockTable& source, int num_blocks) {
  assert(num_blocks >= 0 && num_blocks <= source.num_blocks());
  BlockTable table;
  table.manager_ = this;
  table.blocks_.assign(source.blocks_.begin(), source.blocks_.begin() + num_blocks);
  for (int32_t block : table.blocks_) AddRef(block);
  // Committed from the first block on when the table computes (CommitComputed finds the
  // shared blocks cached already, or caches them).
  return table;
}

int BlockManager::BlocksNeeded(const BlockTable& table, int num_tokens) const {
  assert(num_tokens >= 0);
  const int blocks_for_tokens = (num_tokens + block_size_ - 1) / block_size_;
  return std::max(0, blocks_for_tokens - table.num_blocks());
}

void BlockManager::CommitComputed(BlockTable& table, std::span<const int32_t> tokens,
                                  int num_computed_tokens) {
  assert(num_computed_tokens >= 0 && static_cast<size_t>(num_computed_tokens) <= tokens.size());
  assert(num_computed_tokens <= table.num_blocks() * block_size_);
  assert(table.manager_ == this || table.blocks_.empty());
  if (!enable_prefix_caching_) return;

  const int num_full_blocks = num_computed_tokens / block_size_;
  for (int i = table.num_committed_blocks_; i < num_full_blocks; ++i) {
    const int32_t block = table.blocks_[i];
    const std::span<const int32_t> block_tokens =
        tokens.subspan(static_cast<size_t>(i) * block_size_, block_size_);
    const uint64_t hash = hash_fn_(table.chain_hash_, block_tokens);
    const auto it = cached_blocks_.find(hash);
    uint64_t serial;
    if (blocks_[block].serial != 0) {
      // A shared block (BlockManager::Share) that the table it came from has cached.
      assert(CachedContentEquals(block, table.chain_serial_, block_tokens));
      serial = blocks_[block].serial;
    } else if (it != cached_blocks_.end() &&
               CachedContentEquals(it->second, table.chain_serial_, block_tokens)) {
      // Another sequence computed this content first; this copy stays private, and the
      // chain continues through the cached one so that later blocks can still be found.
      serial = blocks_[it->second].serial;
    } else {
      // A different content under this hash (a collision, or a block whose parent was
      // evicted, which no lookup can reach any more): the newer content takes the slot.
      if (it != cached_blocks_.end()) Uncache(it->second);
      Cache(block, hash, table.chain_serial_, block_tokens);
      serial = blocks_[block].serial;
    }
    table.num_committed_blocks_ = i + 1;
    table.chain_hash_ = hash;
    table.chain_serial_ = serial;
  }
}

bool BlockManager::CachedContentEquals(int32_t block, uint64_t parent_serial,
                                       std::span<const int32_t> tokens) const {
  // Comparing the parent's serial, not its hash, makes the check cover the whole prefix:
  // by induction the parent holds exactly the tokens before these.
  return blocks_[block].parent_serial == parent_serial &&
         std::equal(tokens.begin(), tokens.end(),
                    block_tokens_.begin() + static_cast<std::ptrdiff_t>(block) * block_size_);
}

void BlockManager::Cache(int32_t block, uint64_t hash, uint64_t parent_serial,
                         std::span<const int32_t> tokens) {
  Block& b = blocks_[block];
  assert(b.serial == 0);
  b.serial = ++last_serial_;
  b.hash = hash;
  b.parent_serial = parent_serial;
  std::copy(tokens.begin(), tokens.end(),
            block_tokens_.begin() + static_cast<std::ptrdiff_t>(block) * block_size_);
  const bool inserted = cached_blocks_.emplace(hash, block).second;
  assert(inserted);
  (void)inserted;
}

void BlockManager::Uncache(int32_t block) {
  Block& b = blocks_[block];
  cached_blocks_.erase(b.hash);
  b.serial = 0;
  if (b.ref_count == 0) {
    LruRemove(block);
    free_blocks_.push_back(block);
  }
}

int32_t BlockManager::TakeBlock() {
  if (free_blocks_.empty()) {
    assert(lru_oldest_ >= 0);
    Uncache(lru_oldest_);
  }
  const int32_t block = free_blocks_.back();
  free_blocks_.pop_back();
  blocks_[block].ref_count = 1;
  return block;
}

void BlockManager::AddRef(int32_t block) {
  // Only a cached block can be found with ref count 0: it is evictable, so revive it.
  if (blocks_[block].ref_count == 0) LruRemove(block);
  ++blocks_[block].ref_count;
}

void BlockManager::DropRef(int32_t block) {
  Block& b = blocks_[block];
  assert(b.ref_count > 0);
  if (--b.ref_count > 0) return;
  if (b.serial != 0) {
    LruPushNewest(block);
  } else {
    free_blocks_.push_back(block);
  }
}

void BlockManager::ReleaseTable(BlockTable& table) {
  // Last block first, so it becomes the older evictable one: a block is reachable only
  // through its parents, so the parents should be the last to go.
  for (size_t i = table.blocks_.size(); i > 0; --i) DropRef(table.blocks_[i - 1]);
  table.manager_ = nullptr;
  table.blocks_.clear();
  table.num_committed_blocks_ = 0;
  table.chain_hash_ = 0;
  table.chain_serial_ = 0;
}

void BlockManager::LruPushNewest(int32_t block) {
  Block& b = blocks_[block];
  b.lru_prev = lru_newest_;
  b.lru_next = -1;
  if (lru_newest_ >= 0) {
    blocks_[lru_newest_].lru_next = block;
  } else {
    lru_oldest_ = block;
  }
  lru_newest_ = block;
  ++num_evictable_;
}

void BlockManager::LruRemove(int32_t block) {
  Block& b = blocks_[block];
  if (b.lru_prev >= 0) {
    blocks_[b.lru_prev].lru_next = b.lru_next;
  } else {
    lru_oldest_ = b.lru_next;
  }
  if (b.lru_next >= 0) {
    blocks_[b.lru_next].lru_prev = b.lru_prev;
  } else {
    lru_newest_ = b.lru_prev;
  }
  b.lru_prev = -1;
  b.lru_next = -1;
  --num_evictable_;
}

}  // namespace conveyor::scheduler
