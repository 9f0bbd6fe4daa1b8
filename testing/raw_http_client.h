// A blocking HTTP/1.1 client on a bare socket, for tests that must send what no client
// library would: headers a byte at a time, bodies that never end, chunked bodies past a
// limit, connections that just sit there. Reads have a 5 s timeout.
#pragma once

#include <string>
#include <string_view>

namespace conveyor::testing {

class RawHttpClient {
 public:
  // Connects to 127.0.0.1:`port`; `receive_buffer_bytes` > 0 shrinks the socket's
  // receive buffer (a client that reads slowly fills it sooner).
  explicit RawHttpClient(int port, int receive_buffer_bytes = 0);
  ~RawHttpClient();
  RawHttpClient(const RawHttpClient&) = delete;
  RawHttpClient& operator=(const RawHttpClient&) = delete;

  bool connected() const { return connected_; }
  void Close();
  // Sends all of `data`; false once the connection is broken.
  bool Send(std::string_view data);
  // Everything until the server closes (or a read times out).
  std::string ReadAll();
  // Reads until `marker` has arrived (or the connection ends); returns what was read up
  // to and including it, keeping the rest for the next read.
  std::string ReadUntil(std::string_view marker);
  // One answer: its head, and its body when it has a Content-Length.
  std::string ReadResponse();
  // True when the server has closed the connection (a read returns 0 or fails).
  bool ServerClosed();

 private:
  bool Receive();  // Appends one read to received_; false at the end.

  int fd_ = -1;
  bool connected_ = false;
  std::string received_;
};

// The status code of an answer's status line ("HTTP/1.1 408 ..."), or 0.
int StatusOf(const std::string& response);

// The body of an answer (what follows its head).
std::string BodyOf(const std::string& response);

}  // namespace conveyor::testing
