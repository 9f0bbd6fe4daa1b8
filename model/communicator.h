// Collective operations between the tensor-parallel ranks of one model replica, on
// activations in backend memory. LlamaModel (model/model.h) calls them in the same order
// on every rank: all-reduce after each row-parallel layer, all-gather of the logits.
//
// Implementations: one rank (no-ops), Gloo over TCP for the CPU backend
// (cpu/gloo_communicator.h), NCCL for the CUDA backend (cuda/nccl_communicator.h). The ranks find
// each other through a collective id that rank 0 creates (Worker.CreateCollectiveId) and
// the scheduler hands to every rank's Init; its first bytes name the implementation.
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace conveyor::model {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // In place on every rank: data[i] = Σ over ranks of data[i], for `count` activations
  // (the backend's compute dtype) in backend memory. Ordered after the backend work
  // queued so far and before any queued later: NCCL queues it on the CUDA backend's
  // stream (done when the backend synchronises), Gloo completes it before returning.
  // Every rank ends with the same bits.
  virtual absl::Status AllReduceSum(void* data, size_t count) = 0;

  // In place: `data` holds world_size() × count activations, this rank's part at offset
  // rank() × count; on return every part holds its rank's values. Ordered as AllReduceSum.
  virtual absl::Status AllGather(void* data, size_t count) = 0;
};

// The communicator of a replica with one rank: every collective is a no-op.
std::unique_ptr<Communicator> MakeSingleRankCommunicator();

// Collective ids start with one of these, so a rank given another implementation's id
// (ranks started with different backends) fails with a clear error.
inline constexpr std::string_view kGlooIdPrefix = "gloo:";
inline constexpr std::string_view kNcclIdPrefix = "nccl:";

// The payload of `collective_id` after `prefix`, or INVALID_ARGUMENT naming both.
absl::StatusOr<std::string_view> CollectiveIdPayload(std::string_view collective_id,
                                                     std::string_view prefix);

}  // namespace conveyor::model
