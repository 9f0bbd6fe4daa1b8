// A minimal blocking HTTP/1.1 client for one streamed POST (Server-Sent Events), for
// conveyor-bench's --api=http: it sends a JSON body and hands each event's data to a
// callback the moment its bytes arrive, so the benchmark times tokens the way an OpenAI
// client sees them, without a client library (and its threads) in the measurement.
// One connection per stream; chunked and plain bodies; no TLS, no redirects.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <string_view>

namespace conveyor::bench {

class SseStream {
 public:
  // Gets each event's data (the text after "data: "; lines joined with '\n').
  using OnEvent = std::function<void(std::string_view data)>;

  SseStream() = default;
  SseStream(const SseStream&) = delete;
  SseStream& operator=(const SseStream&) = delete;

  // POSTs `body` (JSON) to http://host:port`path` and reads the answer until the server
  // ends it. Returns "" for a 200 answer read to its end, else what went wrong (for another
  // status, the status line and body).
  std::string Run(const std::string& host, const std::string& port, const std::string& path,
                  const std::string& body, const OnEvent& on_event);

  // Ends a Run in progress from another thread (it returns "cancelled"), as a client that
  // goes away does.
  void Cancel();

 private:
  std::atomic<int> fd_{-1};
  std::atomic<bool> cancelled_{false};
};

}  // namespace conveyor::bench
