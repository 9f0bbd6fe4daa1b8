#include "scheduler/worker_step_stream.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "rpc/grpc_status.h"
#include "rpc/scheduler_id_metadata.h"

namespace conveyor::scheduler {

namespace v1 = worker::v1;

WorkerStepStream::WorkerStepStream(v1::Worker::Stub* stub, std::string scheduler_id,
                                   std::chrono::milliseconds step_timeout)
    : stub_(stub), scheduler_id_(std::move(scheduler_id)), step_timeout_(step_timeout) {}

WorkerStepStream::~WorkerStepStream() {
  if (stream_ == nullptr || !ended_.ok()) return;
  // Whatever is still running is no longer wanted; the worker finishes the step it is
  // in and then sees the stream gone.
  context_->TryCancel();
  stream_->Finish().IgnoreError();
}

void WorkerStepStream::Open() {
  auto context = std::make_unique<grpc::ClientContext>();
  context->AddMetadata(kSchedulerIdMetadataKey, scheduler_id_);
  grpc::ClientContext* call_context = context.get();
  {
    // Visible to ExpireOverdue before the call starts: starting it waits for the
    // connection (a worker host that does not answer), which the step timeout bounds.
    std::lock_guard<std::mutex> lock(mu_);
    context_ = std::move(context);
    expired_ = false;
  }
  // No wait_for_ready: a worker that is down fails the step at once, as a unary call
  // would, and the engine's recovery takes over.
  stream_ = stub_->StepStream(call_context);
}

void WorkerStepStream::Send(const v1::StepRequest& request) {
  {
    // Counted as sent before the stream opens and the write, which can block (a
    // connection being made, flow control, a worker that stopped reading) until
    // ExpireOverdue cancels them.
    std::lock_guard<std::mutex> lock(mu_);
    sent_.push_back({request.step_id(), std::chrono::steady_clock::now() + step_timeout_});
  }
  if (stream_ == nullptr) Open();
  if (ended_.ok() && !stream_->Write(request)) End(/*cancel=*/true);
}

absl::StatusOr<v1::StepResponse> WorkerStepStream::Receive(uint64_t step_id) {
  for (;;) {
    uint64_t oldest = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (sent_.empty()) {
        return absl::InternalError(absl::StrCat("step ", step_id, " was not sent"));
      }
      oldest = sent_.front().step_id;
    }
    absl::StatusOr<v1::StepResponse> result = v1::StepResponse();
    if (!ended_.ok()) {
      result = ended_;
    } else {
      v1::StepStreamResponse answer;
      if (!stream_->Read(&answer)) {
        End(/*cancel=*/false);
      } else if (answer.step_id() != oldest) {
        End(/*cancel=*/true,
            absl::InternalError(absl::StrCat("the worker answered step ", answer.step_id(),
                                             " where step ", oldest, " was next")));
      } else if (answer.status_code() != 0) {
        result = absl::Status(static_cast<absl::StatusCode>(answer.status_code()),
                              answer.status_message());
      } else {
        result = std::move(*answer.mutable_response());
      }
      if (!ended_.ok()) result = ended_;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      sent_.pop_front();
    }
    ForgetIfDrained();
    if (oldest == step_id) return result;
  }
}

void WorkerStepStream::End(bool cancel, absl::Status why) {
  if (cancel) context_->TryCancel();
  const grpc::Status finished = stream_->Finish();
  bool expired = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    expired = expired_;
  }
  if (expired) {
    ended_ = absl::DeadlineExceededError(
        absl::StrCat("no answer within the step timeout (", step_timeout_.count(), " ms)"));
  } else if (!why.ok()) {
    ended_ = std::move(why);
  } else if (!finished.ok()) {
    ended_ = FromGrpcStatus(finished);
  } else {
    ended_ = absl::UnavailableError("the worker ended the step stream");
  }
}

void WorkerStepStream::ForgetIfDrained() {
  if (ended_.ok()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (!sent_.empty()) return;
  stream_.reset();
  context_.reset();
  ended_ = absl::OkStatus();
}

void WorkerStepStream::ExpireOverdue(std::chrono::steady_clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (context_ == nullptr || expired_ || sent_.empty() || now < sent_.front().deadline) return;
  expired_ = true;
  context_->TryCancel();
}

}  // namespace conveyor::scheduler
