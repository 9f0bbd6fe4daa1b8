#include "grammar/token_mask.h"

#include <algorithm>
#include <utility>

namespace conveyor::grammar {

Vocabulary::Vocabulary(std::vector<std::string> token_bytes, std::vector<bool> special,
                       std::vector<int32_t> eos_ids)
    : bytes_(std::move(token_bytes)), eos_ids_(std::move(eos_ids)) {
  for (int32_t id = 0; id < size(); ++id) {
    // EOS is allowed where the sentence may end, never for its bytes.
    const bool is_special = (static_cast<size_t>(id) < special.size() && special[id]) ||
                            std::find(eos_ids_.begin(), eos_ids_.end(), id) != eos_ids_.end();
    if (!is_special && !bytes_[id].empty()) sorted_.push_back(id);
  }
  std::sort(sorted_.begin(), sorted_.end(),
            [&](int32_t a, int32_t b) { return bytes_[a] < bytes_[b]; });
  shared_prefix_.resize(sorted_.size(), 0);
  for (size_t i = 1; i < sorted_.size(); ++i) {
    const std::string& prev = bytes_[sorted_[i - 1]];
    const std::string& cur = bytes_[sorted_[i]];
    const size_t limit = std::min(prev.size(), cur.size());
    size_t k = 0;
    while (k < limit && prev[k] == cur[k]) ++k;
    shared_prefix_[i] = static_cast<int32_t>(k);
  }
}

Bitmask TokenMasker::Compute(Matcher& matcher) const {
  const Vocabulary& v = *vocabulary_;
  Bitmask mask((static_cast<size_t>(v.size()) + 31) / 32, 0);
  auto allow = [&](int32_t id) { mask[static_cast<size_t>(id) / 32] |= 1u << (id % 32); };
  if (matcher.CanEnd()) {
    for (int32_t eos : v.eos_ids_) allow(eos);
  }
  const size_t start = matcher.num_accepted();
  // The bytes of the current path the matcher holds beyond `start`, and how many of them.
  size_t depth = 0;
  const std::string* path = nullptr;
  for (size_t i = 0; i < v.sorted_.size();) {
    const int32_t id = v.sorted_[i];
    const std::string& bytes = v.bytes_[id];
    // Back to what this token shares with the bytes the matcher holds.
    size_t common = 0;
    if (path != nullptr) {
      const size_t limit = std::min({depth, bytes.size(), path->size()});
      while (common < limit && (*path)[common] == bytes[common]) ++common;
    }
    matcher.Rollback(depth - common);
    depth = common;
    path = &bytes;
    bool ok = true;
    while (depth < bytes.size()) {
      if (!matcher.AcceptByte(static_cast<uint8_t>(bytes[depth]))) {
        ok = false;
        break;
      }
      ++depth;
    }
    if (ok) {
      allow(id);
      ++i;
      continue;
    }
    // Refused at byte `depth`: every following token that shares bytes[0..depth] is refused
    // too.
    size_t j = i + 1;
    while (j < v.sorted_.size() && v.shared_prefix_[j] > static_cast<int32_t>(depth)) ++j;
    i = j;
  }
  matcher.Rollback(matcher.num_accepted() - start);
  return mask;
}

}  // namespace conveyor::grammar
