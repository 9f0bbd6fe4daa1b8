#include "testing/raw_http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <utility>

namespace conveyor::testing {

RawHttpClient::RawHttpClient(int port, int receive_buffer_bytes) {
  fd_ = socket(AF_INET, SOCK_STREAM, 0);
  if (receive_buffer_bytes > 0) {
    setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receive_buffer_bytes, sizeof(int));
  }
  timeval timeout{5, 0};
  setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
}

RawHttpClient::~RawHttpClient() { Close(); }

void RawHttpClient::Close() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

bool RawHttpClient::Send(std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

bool RawHttpClient::Receive() {
  char buffer[65536];
  const ssize_t n = recv(fd_, buffer, sizeof(buffer), 0);
  if (n <= 0) return false;
  received_.append(buffer, static_cast<size_t>(n));
  return true;
}

std::string RawHttpClient::ReadAll() {
  while (Receive()) {
  }
  return std::exchange(received_, {});
}

std::string RawHttpClient::ReadUntil(std::string_view marker) {
  while (received_.find(marker) == std::string::npos && Receive()) {
  }
  const size_t end = received_.find(marker);
  const size_t cut = end == std::string::npos ? received_.size() : end + marker.size();
  std::string out = received_.substr(0, cut);
  received_.erase(0, cut);
  return out;
}

std::string RawHttpClient::ReadResponse() {
  std::string head = ReadUntil("\r\n\r\n");
  const size_t at = head.find("Content-Length: ");
  if (at == std::string::npos) return head;
  const size_t length = std::stoul(head.substr(at + 16));
  while (received_.size() < length && Receive()) {
  }
  const size_t take = std::min(length, received_.size());
  head += received_.substr(0, take);
  received_.erase(0, take);
  return head;
}

bool RawHttpClient::ServerClosed() {
  char c;
  return recv(fd_, &c, 1, 0) <= 0;
}

int StatusOf(const std::string& response) {
  if (response.size() < 12 || response.compare(0, 5, "HTTP/") != 0) return 0;
  return std::atoi(response.c_str() + 9);
}

std::string BodyOf(const std::string& response) {
  const size_t at = response.find("\r\n\r\n");
  return at == std::string::npos ? "" : response.substr(at + 4);
}

}  // namespace conveyor::testing
