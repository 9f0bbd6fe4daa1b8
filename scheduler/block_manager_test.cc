#include "scheduler/block_manager.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace conveyor::scheduler {

// Reaches into the manager: forces hash collisions, and checks the internal invariants.
class BlockManagerTestPeer {
 public:
  static void SetHashFn(BlockManager& manager,
                        uint64_t (*hash_fn)(uint64_t, std::span<const int32_t>)) {
    manager.hash_fn_ = hash_fn;
  }

  // Checks every invariant of `manager`, given how many live tables hold each block.
  static void ExpectConsistent(const BlockManager& manager,
                               const std::vector<int>& expected_ref_counts) {
    const int n = manager.num_blocks();
    ASSERT_EQ(static_cast<int>(expected_ref_counts.size()), n);
    std::vector<int> on_free_list(n, 0);
    for (int32_t block : manager.free_blocks_) ++on_free_list[block];
    std::vector<int> on_lru(n, 0);
    int lru_size = 0;
    int32_t prev = -1;
    for (int32_t block = manager.lru_oldest_; block >= 0 && lru_size <= n;
         block = manager.blocks_[block].lru_next) {
      EXPECT_EQ(manager.blocks_[block].lru_prev, prev) << "block " << block;
      ++on_lru[block];
      ++lru_size;
      prev = block;
    }
    EXPECT_EQ(manager.lru_newest_, prev);
    EXPECT_EQ(lru_size, manager.num_evictable_);

    int num_unreferenced = 0;
    int num_cached = 0;
    for (int32_t block = 0; block < n; ++block) {
      const BlockManager::Block& b = manager.blocks_[block];
      EXPECT_EQ(b.ref_count, expected_ref_counts[block]) << "block " << block;
      const bool cached = b.serial != 0;
      if (cached) ++num_cached;
      if (b.ref_count > 0) {
        EXPECT_EQ(on_free_list[block] + on_lru[block], 0) << "used block " << block;
      } else {
        ++num_unreferenced;
        // Exactly one list: the free list if not cached, the LRU list if cached.
        EXPECT_EQ(on_free_list[block], cached ? 0 : 1) << "block " << block;
        EXPECT_EQ(on_lru[block], cached ? 1 : 0) << "block " << block;
      }
      if (cached) {
        const auto it = manager.cached_blocks_.find(b.hash);
        EXPECT_TRUE(it != manager.cached_blocks_.end() && it->second == block)
            << "cached block " << block << " is not under its hash";
      }
    }
    for (const auto& [hash, block] : manager.cached_blocks_) {
      EXPECT_EQ(manager.blocks_[block].hash, hash);
      EXPECT_NE(manager.blocks_[block].serial, 0u);
    }
    EXPECT_EQ(manager.num_cached_blocks(), num_cached);
    EXPECT_EQ(manager.num_free_blocks(), num_unreferenced);
    EXPECT_EQ(manager.num_free_blocks() + manager.num_used_blocks(), n);
  }
};

namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

// Tokens start, start + 1, ..., start + count - 1.
std::vector<int32_t> Tokens(int32_t start, int count) {
  std::vector<int32_t> tokens(count);
  std::iota(tokens.begin(), tokens.end(), start);
  return tokens;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

uint64_t ConstantHash(uint64_t /*parent_hash*/, std::span<const int32_t> /*tokens*/) { return 42; }

// Ignores the parent: equal blocks collide whatever precedes them.
uint64_t ParentBlindHash(uint64_t /*parent_hash*/, std::span<const int32_t> tokens) {
  return std::accumulate(tokens.begin(), tokens.end(), uint64_t{0});
}

// Collides often, across positions and contents.
uint64_t WeakHash(uint64_t parent_hash, std::span<const int32_t> tokens) {
  return (parent_hash + static_cast<uint64_t>(tokens[0])) % 3;
}

// Every test ends with every block free and nothing referenced.
class BlockManagerTest : public ::testing::Test {
 protected:
  BlockManager& Make(int num_blocks, int block_size, bool enable_prefix_caching) {
    manager_ = std::make_unique<BlockManager>(num_blocks, block_size, enable_prefix_caching);
    return *manager_;
  }

  void TearDown() override {
    if (manager_ != nullptr) ExpectAllBlocksFree();
  }

  void ExpectAllBlocksFree() {
    EXPECT_EQ(manager_->num_free_blocks(), manager_->num_blocks());
    EXPECT_EQ(manager_->num_used_blocks(), 0);
    BlockManagerTestPeer::ExpectConsistent(*manager_, std::vector<int>(manager_->num_blocks(), 0));
  }

  // Runs a whole prompt as one prefill: reuses its cached prefix, computes the rest.
  BlockTable Prefill(const std::vector<int32_t>& tokens) {
    BlockManager::PrefixMatch match = manager_->AcquirePrefix(tokens);
    EXPECT_TRUE(manager_->EnsureCapacity(match.table, static_cast<int>(tokens.size())));
    manager_->CommitComputed(match.table, tokens, static_cast<int>(tokens.size()));
    return std::move(match.table);
  }

  void RunStress(uint32_t seed);

  std::unique_ptr<BlockManager> manager_;
};

TEST_F(BlockManagerTest, AllocatesWholeBlocksAndFreesThem) {
  BlockManager& manager = Make(8, 4, false);
  BlockTable a;
  EXPECT_TRUE(manager.EnsureCapacity(a, 0));
  EXPECT_EQ(a.num_blocks(), 0);
  EXPECT_TRUE(manager.EnsureCapacity(a, 5));
  EXPECT_THAT(a.blocks(), ElementsAre(0, 1));
  EXPECT_TRUE(manager.EnsureCapacity(a, 8));
  EXPECT_TRUE(manager.EnsureCapacity(a, 3));  // Never shrinks.
  EXPECT_EQ(a.num_blocks(), 2);
  EXPECT_TRUE(manager.EnsureCapacity(a, 9));
  EXPECT_THAT(a.blocks(), ElementsAre(0, 1, 2));

  BlockTable b;
  EXPECT_TRUE(manager.EnsureCapacity(b, 1));
  EXPECT_THAT(b.blocks(), ElementsAre(3));
  EXPECT_EQ(manager.num_used_blocks(), 4);
  EXPECT_EQ(manager.num_free_blocks(), 4);

  a.Release();
  EXPECT_EQ(a.num_blocks(), 0);
  EXPECT_EQ(manager.num_used_blocks(), 1);
  EXPECT_EQ(manager.num_free_blocks(), 7);
  a.Release();  // Releasing twice is harmless.
  EXPECT_EQ(manager.num_used_blocks(), 1);
}

TEST_F(BlockManagerTest, BlocksNeededAndCanAllocate) {
  BlockManager& manager = Make(4, 4, false);
  BlockTable table;
  EXPECT_EQ(manager.BlocksNeeded(table, 0), 0);
  EXPECT_EQ(manager.BlocksNeeded(table, 1), 1);
  EXPECT_EQ(manager.BlocksNeeded(table, 4), 1);
  EXPECT_EQ(manager.BlocksNeeded(table, 5), 2);
  ASSERT_TRUE(manager.EnsureCapacity(table, 8));
  EXPECT_EQ(manager.BlocksNeeded(table, 3), 0);
  EXPECT_EQ(manager.BlocksNeeded(table, 8), 0);
  EXPECT_EQ(manager.BlocksNeeded(table, 9), 1);
  EXPECT_TRUE(manager.CanAllocate(2));
  EXPECT_FALSE(manager.CanAllocate(3));
}

TEST_F(BlockManagerTest, FailedEnsureCapacityChangesNothing) {
  BlockManager& manager = Make(4, 4, true);
  BlockTable cached = Prefill(Tokens(0, 4));  // One block, cached.
  cached.Release();                           // Now evictable.
  BlockTable a;
  ASSERT_TRUE(manager.EnsureCapacity(a, 8));
  EXPECT_EQ(manager.num_free_blocks(), 2);

  BlockTable b;
  EXPECT_FALSE(manager.EnsureCapacity(b, 12));
  EXPECT_EQ(b.num_blocks(), 0);
  EXPECT_FALSE(manager.EnsureCapacity(a, 20));
  EXPECT_EQ(a.num_blocks(), 2);
  EXPECT_EQ(manager.num_free_blocks(), 2);
  EXPECT_EQ(manager.num_cached_blocks(), 1);  // Nothing evicted either.

  EXPECT_TRUE(manager.EnsureCapacity(b, 8));  // Takes the free block, then evicts.
  EXPECT_EQ(manager.num_free_blocks(), 0);
  EXPECT_EQ(manager.num_cached_blocks(), 0);
}

TEST_F(BlockManagerTest, DestructionReleasesBlocks) {
  BlockManager& manager = Make(4, 4, false);
  {
    BlockTable table;
    ASSERT_TRUE(manager.EnsureCapacity(table, 16));
    EXPECT_EQ(manager.num_free_blocks(), 0);
  }
  EXPECT_EQ(manager.num_free_blocks(), 4);
}

TEST_F(BlockManagerTest, MoveAssignmentReleasesTheTargetsBlocks) {
  BlockManager& manager = Make(4, 4, false);
  BlockTable a;
  BlockTable b;
  ASSERT_TRUE(manager.EnsureCapacity(a, 8));
  ASSERT_TRUE(manager.EnsureCapacity(b, 4));
  const std::vector<int32_t> b_blocks = b.blocks();
  a = std::move(b);
  EXPECT_EQ(a.blocks(), b_blocks);
  EXPECT_EQ(b.num_blocks(), 0);  // NOLINT(bugprone-use-after-move): moved-from is empty.
  EXPECT_EQ(manager.num_used_blocks(), 1);
  b.Release();  // NOLINT(bugprone-use-after-move): owns nothing, frees nothing.
  EXPECT_EQ(manager.num_used_blocks(), 1);
  // The moved-from table can be grown again.
  ASSERT_TRUE(manager.EnsureCapacity(b, 4));
  EXPECT_EQ(manager.num_used_blocks(), 2);
}

TEST_F(BlockManagerTest, MoveConstructionTransfersOwnership) {
  BlockManager& manager = Make(4, 4, false);
  BlockTable a;
  ASSERT_TRUE(manager.EnsureCapacity(a, 8));
  {
    BlockTable b(std::move(a));
    EXPECT_THAT(b.blocks(), ElementsAre(0, 1));
    EXPECT_EQ(a.num_blocks(), 0);  // NOLINT(bugprone-use-after-move)
    a.Release();                   // NOLINT(bugprone-use-after-move)
    EXPECT_EQ(manager.num_used_blocks(), 2);
  }
  EXPECT_EQ(manager.num_used_blocks(), 0);
}

TEST_F(BlockManagerTest, PrefixHitAfterCommitSharesBlocks) {
  BlockManager& manager = Make(16, 4, true);
  const std::vector<int32_t> prompt = Tokens(100, 10);
  BlockTable first = Prefill(prompt);
  EXPECT_THAT(first.blocks(), ElementsAre(0, 1, 2));
  EXPECT_EQ(manager.num_cached_blocks(), 2);  // The third block is partial.

  BlockManager::PrefixMatch second = manager.AcquirePrefix(prompt);
  EXPECT_EQ(second.num_cached_tokens, 8);
  EXPECT_THAT(second.table.blocks(), ElementsAre(0, 1));
  EXPECT_EQ(manager.num_used_blocks(), 3);  // Shared, not copied.

  // A prompt of exactly two blocks reuses only one: its last token must be computed.
  BlockManager::PrefixMatch exact = manager.AcquirePrefix(Tokens(100, 8));
  EXPECT_EQ(exact.num_cached_tokens, 4);
  EXPECT_THAT(exact.table.blocks(), ElementsAre(0));
}

TEST_F(BlockManagerTest, PartialBlocksAreNotShared) {
  BlockManager& manager = Make(8, 4, true);
  const std::vector<int32_t> prompt = Tokens(0, 6);
  BlockTable first = Prefill(prompt);
  EXPECT_EQ(manager.num_cached_blocks(), 1);

  BlockManager::PrefixMatch second = manager.AcquirePrefix(prompt);
  EXPECT_EQ(second.num_cached_tokens, 4);
  ASSERT_TRUE(manager.EnsureCapacity(second.table, 6));
  EXPECT_EQ(second.table.blocks()[0], first.blocks()[0]);
  EXPECT_NE(second.table.blocks()[1], first.blocks()[1]);
}

TEST_F(BlockManagerTest, CommitsOnlyComputedFullBlocks) {
  BlockManager& manager = Make(8, 4, true);
  const std::vector<int32_t> prompt = Tokens(0, 12);
  BlockTable table;
  ASSERT_TRUE(manager.EnsureCapacity(table, 12));
  manager.CommitComputed(table, prompt, 3);
  EXPECT_EQ(manager.num_cached_blocks(), 0);
  manager.CommitComputed(table, prompt, 5);
  EXPECT_EQ(manager.num_cached_blocks(), 1);
  manager.CommitComputed(table, prompt, 12);  // Chunked prefill continues the chain.
  EXPECT_EQ(manager.num_cached_blocks(), 3);

  BlockManager::PrefixMatch match = manager.AcquirePrefix(Concat(prompt, {7}));
  EXPECT_EQ(match.num_cached_tokens, 12);
  EXPECT_EQ(match.table.blocks(), table.blocks());
}

TEST_F(BlockManagerTest, SharedBlocksAreCountedOnceAndFreedWithTheirLastTable) {
  for (const bool caching : {false, true}) {
    SCOPED_TRACE(caching ? "prefix caching" : "no prefix caching");
    BlockManager& manager = Make(16, 4, caching);
    const std::vector<int32_t> prompt = Tokens(0, 10);  // Two full blocks and two tokens.
    BlockTable leader;
    ASSERT_TRUE(manager.EnsureCapacity(leader, 10));
    manager.CommitComputed(leader, prompt, 10);
    BlockTable shared = manager.Share(leader, 2);
    EXPECT_THAT(shared.blocks(), ElementsAre(leader.blocks()[0], leader.blocks()[1]));
    std::vector<BlockTable> choices;
    for (int i = 0; i < 3; ++i) {
      choices.push_back(manager.Share(shared, shared.num_blocks()));
      // Each choice computes the prompt's last two tokens and a generated one into a block
      // of its own.
      ASSERT_TRUE(manager.EnsureCapacity(choices.back(), 11));
      manager.CommitComputed(choices.back(), Concat(prompt, {100 + i}), 11);
    }
    EXPECT_EQ(manager.num_used_blocks(), 3 + 3);
    EXPECT_EQ(manager.num_cached_blocks(), caching ? 2 : 0);
    leader.Release();
    shared.Release();
    EXPECT_EQ(manager.num_used_blocks(), 2 + 3);  // The choices hold the prompt's blocks.
    choices.clear();
    EXPECT_EQ(manager.num_used_blocks(), 0);
    // With caching, the prompt's blocks stay hittable.
    EXPECT_EQ(manager.AcquirePrefix(prompt).num_cached_tokens, caching ? 8 : 0);
  }
}

TEST_F(BlockManagerTest, SharedBlocksCommittedFirstByTheSharerStayOneCacheEntry) {
  BlockManager& manager = Make(16, 4, true);
  const std::vector<int32_t> prompt = Tokens(0, 9);
  BlockTable leader;
  ASSERT_TRUE(manager.EnsureCapacity(leader, 9));
  BlockTable choice = manager.Share(leader, 2);
  ASSERT_TRUE(manager.EnsureCapacity(choice, 9));
  // The choice's answer arrives first: it caches the shared blocks, then the leader's
  // commit finds them cached in its own blocks.
  manager.CommitComputed(choice, prompt, 9);
  manager.CommitComputed(leader, prompt, 9);
  EXPECT_EQ(manager.num_cached_blocks(), 2);
  BlockManager::PrefixMatch match = manager.AcquirePrefix(Concat(prompt, {5}));
  EXPECT_EQ(match.num_cached_tokens, 8);
  EXPECT_THAT(match.table.blocks(), ElementsAre(leader.blocks()[0], leader.blocks()[1]));
}

TEST_F(BlockManagerTest, DivergentSuffixSharesOnlyTheCommonBlocks) {
  BlockManager& manager = Make(8, 4, true);
  const std::vector<int32_t> a_prompt = Tokens(0, 13);
  BlockTable a = Prefill(a_prompt);
  // Same first block; the second differs only in its last token.
  std::vector<int32_t> b_prompt = a_prompt;
  b_prompt[7] = 1000;
  BlockManager::PrefixMatch b = manager.AcquirePrefix(b_prompt);
  EXPECT_EQ(b.num_cached_tokens, 4);
  EXPECT_THAT(b.table.blocks(), ElementsAre(a.blocks()[0]));
  // B's third block equals A's but follows a different one: not a hit.
  EXPECT_EQ(manager.prefix_hits(), 1u);
}

TEST_F(BlockManagerTest, CountsQueriesAndHitsInBlocks) {
  BlockManager& manager = Make(8, 4, true);
  const std::vector<int32_t> prompt = Tokens(0, 10);
  BlockTable first = Prefill(prompt);
  EXPECT_EQ(manager.prefix_queries(), 2u);
  EXPECT_EQ(manager.prefix_hits(), 0u);
  { BlockManager::PrefixMatch second = manager.AcquirePrefix(prompt); }
  EXPECT_EQ(manager.prefix_queries(), 4u);
  EXPECT_EQ(manager.prefix_hits(), 2u);
  { BlockManager::PrefixMatch tiny = manager.AcquirePrefix(Tokens(0, 4)); }
  { BlockManager::PrefixMatch empty = manager.AcquirePrefix({}); }
  EXPECT_EQ(manager.prefix_queries(), 4u);
  EXPECT_EQ(manager.prefix_hits(), 2u);
}

TEST_F(BlockManagerTest, EvictsLeastRecentlyReleasedCachedBlockFirst) {
  BlockManager& manager = Make(4, 4, true);
  const std::vector<int32_t> x = Tokens(0, 4);
  const std::vector<int32_t> y = Tokens(10, 4);
  const std::vector<int32_t> z = Tokens(20, 4);
  BlockTable x_table = Prefill(x);
  BlockTable y_table = Prefill(y);
  BlockTable z_table = Prefill(z);
  ASSERT_EQ(manager.num_cached_blocks(), 3);
  y_table.Release();
  x_table.Release();
  z_table.Release();  // Evictable, oldest first: y (block 1), x (0), z (2).
  EXPECT_EQ(manager.num_free_blocks(), 4);

  BlockTable table;
  ASSERT_TRUE(manager.EnsureCapacity(table, 4));
  EXPECT_THAT(table.blocks(), ElementsAre(3));  // The never-used block goes first.
  EXPECT_EQ(manager.num_cached_blocks(), 3);
  ASSERT_TRUE(manager.EnsureCapacity(table, 8));
  EXPECT_THAT(table.blocks(), ElementsAre(3, 1));
  EXPECT_EQ(manager.num_cached_blocks(), 2);
  ASSERT_TRUE(manager.EnsureCapacity(table, 12));
  EXPECT_THAT(table.blocks(), ElementsAre(3, 1, 0));

  // Evicted blocks are no longer found; the survivor is.
  EXPECT_EQ(manager.AcquirePrefix(Concat(y, {1})).num_cached_tokens, 0);
  EXPECT_EQ(manager.AcquirePrefix(Concat(x, {1})).num_cached_tokens, 0);
  BlockManager::PrefixMatch z_match = manager.AcquirePrefix(Concat(z, {1}));
  EXPECT_EQ(z_match.num_cached_tokens, 4);
  EXPECT_THAT(z_match.table.blocks(), ElementsAre(2));
}

TEST_F(BlockManagerTest, ReleasedTableEvictsItsLastBlockFirst) {
  BlockManager& manager = Make(3, 4, true);
  const std::vector<int32_t> prompt = Tokens(0, 12);
  Prefill(prompt);  // The returned table is released at once.
  EXPECT_EQ(manager.num_cached_blocks(), 3);

  BlockTable table;
  ASSERT_TRUE(manager.EnsureCapacity(table, 4));
  EXPECT_THAT(table.blocks(), ElementsAre(2));
  // The two leading blocks survive, so the prefix is still found.
  BlockManager::PrefixMatch match = manager.AcquirePrefix(prompt);
  EXPECT_EQ(match.num_cached_tokens, 8);
  EXPECT_THAT(match.table.blocks(), ElementsAre(0, 1));
}

TEST_F(BlockManagerTest, HitOnEvictableBlockRevivesIt) {
  BlockManager& manager = Make(2, 4, true);
  const std::vector<int32_t> prompt = Tokens(0, 5);
  Prefill(prompt);
  EXPECT_EQ(manager.num_free_blocks(), 2);
  EXPECT_EQ(manager.num_cached_blocks(), 1);

  BlockManager::PrefixMatch match = manager.AcquirePrefix(prompt);
  EXPECT_THAT(match.table.blocks(), ElementsAre(0));
  EXPECT_EQ(manager.num_free_blocks(), 1);
  EXPECT_EQ(manager.num_used_blocks(), 1);
  // The revived block is no longer evictable.
  BlockTable other;
  EXPECT_FALSE(manager.EnsureCapacity(other, 8));
  ASSERT_TRUE(manager.EnsureCapacity(other, 4));
  EXPECT_THAT(other.blocks(), ElementsAre(1));
  EXPECT_EQ(manager.num_cached_blocks(), 1);
}

TEST_F(BlockManagerTest, SharedBlockStaysUsedUntilItsLastHolderLeaves) {
  BlockManager& manager = Make(8, 4, true);
  const std::vector<int32_t> prompt = Tokens(0, 9);
  BlockTable a = Prefill(prompt);
  BlockManager::PrefixMatch b = manager.AcquirePrefix(prompt);
  ASSERT_EQ(b.table.num_blocks(), 2);
  a.Release();
  EXPECT_EQ(manager.num_used_blocks(), 2);
  BlockManagerTestPeer::ExpectConsistent(manager, {1, 1, 0, 0, 0, 0, 0, 0});
  b.table.Release();
  EXPECT_EQ(manager.num_used_blocks(), 0);
  EXPECT_EQ(manager.num_cached_blocks(), 2);
}

TEST_F(BlockManagerTest, ContentComputedTwiceIsCachedOnce) {
  BlockManager& manager = Make(8, 4, true);
  const std::vector<int32_t> prompt = Tokens(0, 9);
  // Both start before either has committed, so neither hits.
  BlockManager::PrefixMatch a = manager.AcquirePrefix(prompt);
  BlockManager::PrefixMatch b = manager.AcquirePrefix(prompt);
  ASSERT_TRUE(manager.EnsureCapacity(a.table, 9));
  ASSERT_TRUE(manager.EnsureCapacity(b.table, 9));
  manager.CommitComputed(a.table, prompt, 9);
  manager.CommitComputed(b.table, prompt, 9);
  EXPECT_EQ(manager.num_cached_blocks(), 2);

  // B's chain goes on through A's blocks: its next block is found after them.
  const std::vector<int32_t> longer = Concat(prompt, {9, 10, 11});
  manager.CommitComputed(b.table, longer, 12);
  EXPECT_EQ(manager.num_cached_blocks(), 3);
  BlockManager::PrefixMatch c = manager.AcquirePrefix(Concat(longer, {12}));
  EXPECT_EQ(c.num_cached_tokens, 12);
  EXPECT_THAT(c.table.blocks(),
              ElementsAre(a.table.blocks()[0], a.table.blocks()[1], b.table.blocks()[2]));

  // B's private copies go to the free list, not the cache: taking every block that is
  // not cached evicts nothing.
  a.table.Release();
  b.table.Release();
  c.table.Release();
  BlockTable table;
  ASSERT_TRUE(manager.EnsureCapacity(table, 4 * 5));
  EXPECT_EQ(manager.num_cached_blocks(), 3);
  ASSERT_TRUE(manager.EnsureCapacity(table, 4 * 6));
  EXPECT_EQ(manager.num_cached_blocks(), 2);
}

TEST_F(BlockManagerTest, CollidingHashesNeverServeOtherTokens) {
  BlockManager& manager = Make(8, 4, true);
  BlockManagerTestPeer::SetHashFn(manager, &ConstantHash);
  const std::vector<int32_t> a_prompt = Tokens(0, 5);
  const std::vector<int32_t> b_prompt = Tokens(100, 5);
  BlockTable a = Prefill(a_prompt);
  EXPECT_EQ(manager.num_cached_blocks(), 1);
  EXPECT_EQ(manager.AcquirePrefix(b_prompt).num_cached_tokens, 0);

  // B's block takes the slot; A's is then no longer found, and is freed uncached.
  BlockTable b = Prefill(b_prompt);
  EXPECT_EQ(manager.num_cached_blocks(), 1);
  EXPECT_EQ(manager.AcquirePrefix(a_prompt).num_cached_tokens, 0);
  EXPECT_THAT(manager.AcquirePrefix(b_prompt).table.blocks(), ElementsAre(b.blocks()[0]));
  a.Release();
  b.Release();
  EXPECT_EQ(manager.num_cached_blocks(), 1);
}

TEST_F(BlockManagerTest, CollidingParentHashesNeverServeOtherPrefixes) {
  BlockManager& manager = Make(8, 4, true);
  BlockManagerTestPeer::SetHashFn(manager, &ParentBlindHash);
  // The second block of P has the same tokens, and so the same hash, as Q's first block,
  // but its KV was computed after P's first block.
  const std::vector<int32_t> p = {9, 9, 9, 9, 1, 2, 3, 4, 5};
  const std::vector<int32_t> q = {1, 2, 3, 4, 5};
  BlockTable p_table = Prefill(p);
  EXPECT_EQ(manager.num_cached_blocks(), 2);
  EXPECT_EQ(manager.AcquirePrefix(q).num_cached_tokens, 0);
  EXPECT_EQ(manager.AcquirePrefix(p).num_cached_tokens, 8);
}

TEST_F(BlockManagerTest, PrefixCachingDisabledCachesNothing) {
  BlockManager& manager = Make(4, 4, false);
  const std::vector<int32_t> prompt = Tokens(0, 9);
  BlockTable first = Prefill(prompt);
  EXPECT_EQ(manager.num_cached_blocks(), 0);
  BlockManager::PrefixMatch second = manager.AcquirePrefix(prompt);
  EXPECT_EQ(second.num_cached_tokens, 0);
  EXPECT_EQ(second.table.num_blocks(), 0);
  EXPECT_EQ(manager.prefix_queries(), 0u);
  EXPECT_EQ(manager.prefix_hits(), 0u);
  // The empty match is an ordinary table: it can grow.
  EXPECT_TRUE(manager.EnsureCapacity(second.table, 4));
}

// Many sequences admitted, prefilled in chunks, decoded, preempted and finished in random
// order, against a shadow of the KV each block holds. Checks after every operation that
// the manager's state is consistent, that a block is written only by its sole holder, and
// that every prefix hit holds exactly the KV of the tokens it stands for.
void BlockManagerTest::RunStress(uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  constexpr int kBlockSize = 4;
  constexpr int kMaxTokens = 48;
  BlockManager& manager = *manager_;
  std::mt19937 rng(seed);
  auto uniform = [&rng](int lo, int hi) { return std::uniform_int_distribution(lo, hi)(rng); };

  // A few shared system prompts make prefixes repeat.
  std::vector<std::vector<int32_t>> templates(3);
  for (auto& t : templates) {
    for (int i = 0; i < 20; ++i) t.push_back(uniform(0, 5));
  }
  struct Sequence {
    std::vector<int32_t> tokens;
    int num_computed = 0;
    BlockTable table;
  };
  std::vector<Sequence> running;
  // The tokens whose KV each block holds: those of its sequence up to the block's end.
  std::vector<std::vector<int32_t>> kv(manager.num_blocks());

  auto expected_ref_counts = [&] {
    std::vector<int> refs(manager.num_blocks(), 0);
    for (const Sequence& s : running) {
      for (int32_t block : s.table.blocks()) ++refs[block];
    }
    return refs;
  };
  auto remove = [&running](size_t i) {
    if (i + 1 != running.size()) std::swap(running[i], running.back());
    running.pop_back();
  };

  for (int op = 0; op < 3000 && !HasFailure(); ++op) {
    const int kind = running.empty() ? 0 : uniform(0, 9);
    if (kind <= 2) {  // Admit.
      Sequence s;
      const auto& t = templates[uniform(0, 2)];
      s.tokens.assign(t.begin(), t.begin() + uniform(0, static_cast<int>(t.size())));
      for (int i = uniform(1, 6); i > 0; --i) s.tokens.push_back(uniform(0, 5));
      BlockManager::PrefixMatch match = manager.AcquirePrefix(s.tokens);
      ASSERT_EQ(match.num_cached_tokens % kBlockSize, 0);
      ASSERT_LT(match.num_cached_tokens, static_cast<int>(s.tokens.size()));
      for (int i = 0; i < match.table.num_blocks(); ++i) {
        const auto end = s.tokens.begin() + static_cast<std::ptrdiff_t>(i + 1) * kBlockSize;
        ASSERT_THAT(kv[match.table.blocks()[i]], ElementsAreArray(s.tokens.begin(), end))
            << "a hit served KV of other tokens";
      }
      if (!manager.EnsureCapacity(match.table, match.num_cached_tokens + 1)) continue;
      s.num_computed = match.num_cached_tokens;
      s.table = std::move(match.table);
      running.push_back(std::move(s));
    } else if (kind <= 7) {  // Step: a prefill chunk, or one decode token.
      const size_t i = uniform(0, static_cast<int>(running.size()) - 1);
      Sequence& s = running[i];
      if (s.num_computed == static_cast<int>(s.tokens.size())) {
        s.tokens.push_back(uniform(0, 5));
      }
      const int end = std::min(static_cast<int>(s.tokens.size()), s.num_computed + uniform(1, 9));
      if (!manager.EnsureCapacity(s.table, end)) {
        remove(i);  // Preempted.
      } else {
        const std::vector<int> refs = expected_ref_counts();
        for (int pos = s.num_computed; pos < end; ++pos) {
          const int32_t block = s.table.blocks()[pos / kBlockSize];
          ASSERT_EQ(refs[block], 1) << "writing a shared block";
          kv[block].assign(s.tokens.begin(), s.tokens.begin() + pos + 1);
        }
        s.num_computed = end;
        manager.CommitComputed(s.table, s.tokens, s.num_computed);
        if (s.num_computed >= kMaxTokens) remove(i);
      }
    } else {  // Finish, by each of the ways a table can let go.
      const size_t i = uniform(0, static_cast<int>(running.size()) - 1);
      switch (uniform(0, 2)) {
        case 0:
          running[i].table.Release();
          break;
        case 1: {
          BlockTable other;
          (void)manager.EnsureCapacity(other, kBlockSize);  // Something for `=` to release.
          other = std::move(running[i].table);
          break;
        }
        default:
          break;  // Destroyed by remove().
      }
      remove(i);
    }
    BlockManagerTestPeer::ExpectConsistent(manager, expected_ref_counts());
    ASSERT_LE(manager.prefix_hits(), manager.prefix_queries());
  }
  EXPECT_GT(manager.prefix_hits(), 0u);
  running.clear();
}

TEST_F(BlockManagerTest, RandomizedStressKeepsInvariants) {
  for (uint32_t seed = 1; seed <= 5; ++seed) {
    Make(40, 4, true);
    RunStress(seed);
    ExpectAllBlocksFree();
  }
}

TEST_F(BlockManagerTest, RandomizedStressWithCollidingHashesKeepsInvariants) {
  for (uint32_t seed = 1; seed <= 5; ++seed) {
    Make(40, 4, true);
    BlockManagerTestPeer::SetHashFn(*manager_, &WeakHash);
    RunStress(seed);
    ExpectAllBlocksFree();
  }
}

}  // namespace
}  // namespace conveyor::scheduler
