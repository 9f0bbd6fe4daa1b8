#include "testing/subprocess.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <thread>

#include "absl/strings/numbers.h"

namespace conveyor::testing {

std::optional<Subprocess> Subprocess::Start(const std::vector<std::string>& argv) {
  // Built before fork: the child of a threaded process must not allocate (another
  // thread may have held the allocator's lock at the fork).
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return std::nullopt;
  const pid_t pid = fork();
  if (pid < 0) return std::nullopt;
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    execv(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  return Subprocess(pid, fds[0]);
}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(other.pid_),
      stdout_fd_(other.stdout_fd_),
      buffer_(std::move(other.buffer_)),
      exited_(other.exited_),
      drain_(std::move(other.drain_)) {
  other.pid_ = -1;
  other.stdout_fd_ = -1;
}

Subprocess::~Subprocess() {
  if (pid_ > 0 && !exited_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (drain_.joinable()) drain_.join();  // The pipe hit EOF when the child died.
  if (stdout_fd_ >= 0) close(stdout_fd_);
}

void Subprocess::DrainStdout() {
  const int fd = stdout_fd_;
  drain_ = std::thread([fd] {
    char chunk[4096];
    while (read(fd, chunk, sizeof(chunk)) > 0) {
    }
  });
}

std::optional<std::string> Subprocess::WaitForLine(const std::string& needle,
                                                   std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    size_t newline;
    while ((newline = buffer_.find('\n')) != std::string::npos) {
      std::string line = buffer_.substr(0, newline);
      buffer_.erase(0, newline + 1);
      if (line.find(needle) != std::string::npos) return line;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    pollfd pfd{stdout_fd_, POLLIN, 0};
    if (poll(&pfd, 1, static_cast<int>(left.count())) <= 0) continue;
    char chunk[4096];
    const ssize_t n = read(stdout_fd_, chunk, sizeof(chunk));
    if (n <= 0) return std::nullopt;
    buffer_.append(chunk, n);
  }
}

std::optional<int> Subprocess::Wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      exited_ = true;
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      return std::nullopt;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return std::nullopt;
}

void Subprocess::Signal(int sig) {
  if (pid_ > 0 && !exited_) kill(pid_, sig);
}

int PortFromListeningLine(const std::string& line) {
  const size_t colon = line.rfind(':');
  if (colon == std::string::npos) return -1;
  int port = -1;
  return absl::SimpleAtoi(line.substr(colon + 1), &port) ? port : -1;
}

namespace {

// Binds 127.0.0.1:`port` (0: any) and returns the port bound, or -1.
int BindablePort(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int bound = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    bound = ntohs(addr.sin_port);
  }
  close(fd);
  return bound;
}

}  // namespace

int FreePort() {
  // The ephemeral range starts at 32768 by default; ports from 10000 to its start are
  // never handed out as the local end of an outgoing connection.
  int ephemeral_low = 32768;
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  range >> ephemeral_low;
  if (ephemeral_low > 10000 + 1000) {
    thread_local std::mt19937 rng(std::random_device{}());
    std::uniform_int_distribution<int> pick(10000, ephemeral_low - 1);
    for (int attempt = 0; attempt < 100; ++attempt) {
      const int port = BindablePort(pick(rng));
      if (port > 0) return port;
    }
  }
  return BindablePort(0);
}

std::optional<std::string> HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return std::nullopt;
  }
  const std::string request =
      "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return std::nullopt;
  }
  std::string response;
  char chunk[8192];
  ssize_t n;
  while ((n = read(fd, chunk, sizeof(chunk))) > 0) response.append(chunk, n);
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (response.rfind("HTTP/1.", 0) != 0 || body == std::string::npos) return std::nullopt;
  return response.substr(body + 4);
}

}  // namespace conveyor::testing
