#include "bench/load/server_metrics.h"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace conveyor::bench {

MetricsUrl ParseMetricsUrl(const std::string& url, const std::string& server, int port) {
  MetricsUrl m;
  if (!url.empty()) {
    std::string rest = url;
    if (rest.rfind("http://", 0) == 0) rest = rest.substr(7);
    const size_t slash = rest.find('/');
    std::string hostport = rest.substr(0, slash);
    if (slash != std::string::npos) m.path = rest.substr(slash);
    const size_t colon = hostport.rfind(':');
    m.host = hostport.substr(0, colon);
    m.port = colon == std::string::npos ? "80" : hostport.substr(colon + 1);
  } else if (port > 0) {
    const size_t colon = server.rfind(':');
    m.host = server.substr(0, colon);
    m.port = std::to_string(port);
  }
  if (m.host == "localhost") m.host = "127.0.0.1";
  return m;
}

std::optional<std::string> HttpGet(const MetricsUrl& url, double timeout_s) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(url.host.c_str(), url.port.c_str(), &hints, &res) != 0) return std::nullopt;
  int fd = -1;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    timeval tv{};
    tv.tv_sec = static_cast<long>(timeout_s);
    tv.tv_usec = static_cast<long>((timeout_s - tv.tv_sec) * 1e6);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd < 0) return std::nullopt;
  const std::string req =
      "GET " + url.path + " HTTP/1.0\r\nHost: " + url.host + "\r\nConnection: close\r\n\r\n";
  if (send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return std::nullopt;
  }
  std::string response;
  char buf[16384];
  for (;;) {
    const ssize_t got = recv(fd, buf, sizeof(buf), 0);
    if (got < 0) {
      close(fd);
      return std::nullopt;
    }
    if (got == 0) break;
    response.append(buf, got);
  }
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (response.rfind("HTTP/1.", 0) != 0 || body == std::string::npos ||
      response.find(" 200") > response.find("\r\n")) {
    return std::nullopt;
  }
  return response.substr(body + 4);
}

MetricMap ParseMetrics(const std::string& text) {
  MetricMap m;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (line.empty() || line[0] == '#') continue;
    const size_t brace = line.find('{');
    const size_t space = line.rfind(' ');
    if (space == absl::string_view::npos) continue;
    const size_t name_end = std::min(brace, line.find(' '));
    std::string name(line.substr(0, name_end));
    if (brace != absl::string_view::npos) {
      // Skip histogram buckets: their sum over `le` means nothing.
      if (line.substr(brace).find("le=\"") != absl::string_view::npos) continue;
    }
    absl::string_view value = line.substr(space + 1);
    double v = 0;
    if (!absl::SimpleAtod(value, &v)) {
      // A timestamp may follow the value.
      std::vector<absl::string_view> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (parts.size() < 2 || !absl::SimpleAtod(parts[parts.size() - 2], &v)) continue;
    }
    m[name] += v;
  }
  return m;
}

double Get(const MetricMap& m, const std::string& name) {
  auto it = m.find(name);
  return it == m.end() ? 0.0 : it->second;
}

GaugeSample SampleGauges(const MetricMap& m, double t) {
  GaugeSample g;
  g.t = t;
  g.running = Get(m, "conveyor_requests_running");
  g.waiting = Get(m, "conveyor_requests_waiting");
  g.kv_blocks_used = Get(m, "conveyor_kv_blocks_used");
  // Named conveyor_kv_blocks_total before it was renamed (promtool: no _total on gauges).
  g.kv_blocks_total = m.count("conveyor_kv_blocks_capacity") ? Get(m, "conveyor_kv_blocks_capacity")
                                                             : Get(m, "conveyor_kv_blocks_total");
  g.kv_slots_used = Get(m, "conveyor_kv_slots_used");
  g.kv_slots_allocated = Get(m, "conveyor_kv_slots_allocated");
  return g;
}

nlohmann::json ServerMetricsReport(const MetricMap& before, const MetricMap& after,
                                   const std::vector<GaugeSample>& samples, double duration_s,
                                   double trim) {
  using json = nlohmann::json;
  auto delta = [&](const std::string& name) { return Get(after, name) - Get(before, name); };
  const double slot_steps = delta("conveyor_batch_slot_steps_total");
  const double wasted = delta("conveyor_batch_slot_steps_wasted_total");
  const double steps = delta("conveyor_step_tokens_count");
  const double step_tokens = delta("conveyor_step_tokens_sum");
  const double step_seconds = delta("conveyor_step_duration_seconds_sum");
  const double prefix_q = delta("conveyor_prefix_cache_queries_total");
  json sm = {{"steps", steps},
             {"batch_slot_steps", slot_steps},
             {"batch_slot_steps_wasted", wasted},
             {"bubble", slot_steps > 0 ? wasted / slot_steps : 0.0},
             {"mean_batch_slots_per_step", steps > 0 ? slot_steps / steps : 0.0},
             {"mean_tokens_per_step", steps > 0 ? step_tokens / steps : 0.0},
             {"mean_step_ms", steps > 0 ? 1000 * step_seconds / steps : 0.0},
             {"busy_fraction", duration_s > 0 ? step_seconds / duration_s : 0.0},
             {"preemptions", delta("conveyor_preemptions_total")},
             {"generated_tokens", delta("conveyor_generated_tokens_total")},
             {"prompt_tokens", delta("conveyor_prompt_tokens_total")},
             {"prefill_tokens", delta("conveyor_prefill_tokens_total")},
             {"prefix_cache_hit_rate",
              prefix_q > 0 ? delta("conveyor_prefix_cache_hits_total") / prefix_q : 0.0},
             {"requests_finished", delta("conveyor_requests_finished_total")},
             {"requests_rejected", delta("conveyor_requests_rejected_total")}};
  // Gauges: steady state = samples away from the run's ends, with live requests.
  double ratio_sum = 0, used_sum = 0, alloc_sum = 0, blocks_sum = 0, running_sum = 0,
         waiting_sum = 0;
  int n_ratio = 0, n_all = 0;
  json series = json::array();
  {
    for (const GaugeSample& g : samples) {
      series.push_back({g.t, g.running, g.waiting, g.kv_blocks_used, g.kv_blocks_total,
                        g.kv_slots_used, g.kv_slots_allocated});
      if (g.t < trim * duration_s || g.t > (1 - trim) * duration_s) continue;
      ++n_all;
      running_sum += g.running;
      waiting_sum += g.waiting;
      blocks_sum += g.kv_blocks_total > 0 ? g.kv_blocks_used / g.kv_blocks_total : 0;
      if (g.kv_slots_allocated > 0) {
        ++n_ratio;
        ratio_sum += g.kv_slots_used / g.kv_slots_allocated;
        used_sum += g.kv_slots_used;
        alloc_sum += g.kv_slots_allocated;
      }
    }
  }
  sm["steady_state"] = {
      {"samples", n_all},
      {"kv_slot_samples", n_ratio},
      {"kv_slots_used_over_allocated", n_ratio > 0 ? ratio_sum / n_ratio : 0.0},
      {"kv_slots_used_over_allocated_pooled", alloc_sum > 0 ? used_sum / alloc_sum : 0.0},
      {"kv_blocks_used_fraction", n_all > 0 ? blocks_sum / n_all : 0.0},
      {"requests_running", n_all > 0 ? running_sum / n_all : 0.0},
      {"requests_waiting", n_all > 0 ? waiting_sum / n_all : 0.0}};
  sm["gauge_samples_columns"] = {
      "t_s",           "running",           "waiting", "kv_blocks_used", "kv_blocks_total",
      "kv_slots_used", "kv_slots_allocated"};
  sm["gauge_samples"] = series;
  return sm;
}

}  // namespace conveyor::bench
