// main() of the GPU tests: GoogleTest's, and after every test a check that the device
// holds no fault. CUDA reports a kernel's fault (an illegal address, a trap) at the next
// call that synchronises, which may be in a later test that did nothing wrong; and the
// fault is sticky, so every test after it would fail too. This check names the test
// the fault surfaced after and ends the run there. With CUDA_LAUNCH_BLOCKING=1
// (tests/gpu/run.sh sets it) each launch completes before it returns, so that test is
// the one that launched the faulting kernel.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

namespace {

class DeviceFaultCheck : public ::testing::EmptyTestEventListener {
 public:
  explicit DeviceFaultCheck(bool has_device) : has_device_(has_device) {}

  void OnTestEnd(const ::testing::TestInfo& test) override {
    if (!has_device_) return;
    // Only what synchronising returns: a launch a test made fail on purpose leaves a
    // non-sticky error that the test itself has already checked.
    const cudaError_t fault = cudaDeviceSynchronize();
    if (fault == cudaSuccess) return;
    std::printf(
        "[ DEVICE FAULT ] %s: %s after %s.%s; the CUDA context is unusable, so the "
        "remaining tests do not run\n",
        cudaGetErrorName(fault), cudaGetErrorString(fault), test.test_suite_name(), test.name());
    std::fflush(stdout);
    std::_Exit(3);
  }

 private:
  const bool has_device_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int devices = 0;
  const bool has_device = cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
  if (!has_device) cudaGetLastError();  // No driver or no GPU: the tests skip themselves.
  ::testing::UnitTest::GetInstance()->listeners().Append(new DeviceFaultCheck(has_device));
  return RUN_ALL_TESTS();
}
