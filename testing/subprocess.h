// A child process for integration tests: started with arguments, its stdout readable
// line by line, killed (SIGKILL) if still running when the handle is destroyed.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace conveyor::testing {

class Subprocess {
 public:
  // Starts `argv[0]` with `argv`; stdout is piped, stderr inherited.
  static std::optional<Subprocess> Start(const std::vector<std::string>& argv);
  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&&) = delete;
  ~Subprocess();

  // Reads stdout until a line containing `needle` arrives; returns that line, or
  // nullopt on EOF or after `timeout`.
  std::optional<std::string> WaitForLine(const std::string& needle,
                                         std::chrono::milliseconds timeout);
  // Reads and discards the rest of stdout on a background thread, so a chatty child
  // never blocks on a full pipe. WaitForLine must not be called afterwards.
  void DrainStdout();
  // Waits for exit; returns the exit code, or nullopt on timeout / death by signal.
  std::optional<int> Wait(std::chrono::milliseconds timeout);
  void Signal(int sig);
  pid_t pid() const { return pid_; }

 private:
  Subprocess(pid_t pid, int stdout_fd) : pid_(pid), stdout_fd_(stdout_fd) {}
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::string buffer_;
  bool exited_ = false;
  std::thread drain_;
};

// The port from a "... listening on HOST:PORT" line, or -1.
int PortFromListeningLine(const std::string& line);

// A TCP port on 127.0.0.1 that was free a moment ago, from below the kernel's ephemeral
// range: a test that stops a server and starts it again on the same port must not find
// the port taken meanwhile as the local end of some client's connection (tests that open
// thousands of connections run beside it).
int FreePort();

// The body of http://127.0.0.1:PORT/PATH, or nullopt if the request failed.
std::optional<std::string> HttpGet(int port, const std::string& path);

}  // namespace conveyor::testing
