#include "model/communicator.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"

namespace conveyor::model {
namespace {

class SingleRankCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  absl::Status AllReduceSum(void*, size_t) override { return absl::OkStatus(); }
  absl::Status AllGather(void*, size_t) override { return absl::OkStatus(); }
};

}  // namespace

std::unique_ptr<Communicator> MakeSingleRankCommunicator() {
  return std::make_unique<SingleRankCommunicator>();
}

absl::StatusOr<std::string_view> CollectiveIdPayload(std::string_view collective_id,
                                                     std::string_view prefix) {
  if (!collective_id.starts_with(prefix)) {
    // absl::StrCat takes no std::string_view in this Abseil.
    const std::string want(prefix.substr(0, prefix.size() - 1));
    const std::string kind(collective_id.substr(0, std::min(collective_id.find(':'), size_t{8})));
    return absl::InvalidArgumentError(
        absl::StrCat("collective_id is not a ", want, " id (it starts with \"", kind,
                     "\"): were the ranks started with different --backend flags?"));
  }
  return collective_id.substr(prefix.size());
}

}  // namespace conveyor::model
