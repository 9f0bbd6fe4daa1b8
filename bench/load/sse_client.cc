#include "bench/load/sse_client.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>

namespace conveyor::bench {
namespace {

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

int Connect(const std::string& host, const std::string& port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0) return -1;
  int fd = -1;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd >= 0) {
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  return fd;
}

// Splits decoded body bytes into SSE events as they arrive.
class EventSplitter {
 public:
  explicit EventSplitter(const SseStream::OnEvent& on_event) : on_event_(on_event) {}

  void Feed(std::string_view bytes) {
    pending_.append(bytes);
    size_t end;
    while ((end = pending_.find("\n\n")) != std::string::npos) {
      Emit(std::string_view{pending_}.substr(0, end));
      pending_.erase(0, end + 2);
    }
  }

 private:
  void Emit(std::string_view event) {
    std::string data;
    while (!event.empty()) {
      const size_t eol = event.find('\n');
      std::string_view line = event.substr(0, eol);
      event = eol == std::string_view::npos ? std::string_view() : event.substr(eol + 1);
      if (line.substr(0, 5) != "data:") continue;  // Comments and other fields.
      line.remove_prefix(5);
      if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
      if (!data.empty()) data += '\n';
      data.append(line);
    }
    on_event_(data);
  }

  const SseStream::OnEvent& on_event_;
  std::string pending_;
};

}  // namespace

void SseStream::Cancel() {
  cancelled_ = true;
  const int fd = fd_.load();
  if (fd >= 0) shutdown(fd, SHUT_RDWR);  // Wakes the blocked recv; Run closes the fd.
}

std::string SseStream::Run(const std::string& host, const std::string& port,
                           const std::string& path, const std::string& body,
                           const OnEvent& on_event) {
  const int fd = Connect(host, port);
  if (fd < 0) return "cannot connect to " + host + ":" + port;
  fd_ = fd;
  if (cancelled_) shutdown(fd, SHUT_RDWR);
  struct Closer {
    SseStream* self;
    int fd;
    ~Closer() {
      self->fd_ = -1;
      close(fd);
    }
  } closer{this, fd};

  const std::string request = "POST " + path + " HTTP/1.1\r\nHost: " + host +
                              "\r\nContent-Type: application/json\r\nAccept: "
                              "text/event-stream\r\nConnection: close\r\nContent-Length: " +
                              std::to_string(body.size()) + "\r\n\r\n" + body;
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return cancelled_ ? "cancelled" : "send failed";
    sent += static_cast<size_t>(n);
  }

  std::string buffer;  // Received bytes not consumed yet.
  char chunk[16384];
  auto receive = [&]() -> bool {
    const ssize_t n = recv(fd, chunk, sizeof(chunk), 0);
    if (n <= 0) return false;
    buffer.append(chunk, static_cast<size_t>(n));
    return true;
  };

  size_t head_end;
  while ((head_end = buffer.find("\r\n\r\n")) == std::string::npos) {
    if (!receive()) return cancelled_ ? "cancelled" : "connection closed before the headers";
  }
  const std::string head = Lower(buffer.substr(0, head_end));
  buffer.erase(0, head_end + 4);
  const bool ok = head.rfind("http/1.1 200", 0) == 0 || head.rfind("http/1.0 200", 0) == 0;
  const bool chunked = head.find("transfer-encoding: chunked") != std::string::npos;

  std::string error_body;
  EventSplitter events(on_event);
  auto deliver = [&](std::string_view bytes) {
    if (ok) {
      events.Feed(bytes);
    } else {
      error_body.append(bytes);
    }
  };
  if (!chunked) {
    // Content-Length or close-delimited: the body ends when the server closes.
    deliver(buffer);
    buffer.clear();
    while (receive()) {
      deliver(buffer);
      buffer.clear();
    }
  } else {
    for (;;) {
      size_t eol;
      while ((eol = buffer.find("\r\n")) == std::string::npos) {
        if (!receive()) return cancelled_ ? "cancelled" : "connection closed mid-stream";
      }
      const size_t size = std::strtoul(buffer.substr(0, eol).c_str(), nullptr, 16);
      buffer.erase(0, eol + 2);
      if (size == 0) break;  // The last chunk (trailers are not used).
      while (buffer.size() < size + 2) {
        if (!receive()) return cancelled_ ? "cancelled" : "connection closed mid-chunk";
      }
      deliver(std::string_view{buffer}.substr(0, size));
      buffer.erase(0, size + 2);
    }
  }
  if (cancelled_) return "cancelled";
  if (!ok) return head.substr(0, head.find('\r')) + ": " + error_body;
  return "";
}

}  // namespace conveyor::bench
