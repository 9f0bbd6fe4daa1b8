// What the grammar tests share: UTF-8 of code points, sentences drawn at random from a
// grammar, and running a reference (Python in the test venv) to read its output.
#pragma once

#include <algorithm>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/utf8.h"
#include "grammar/grammar.h"

namespace conveyor::grammar {

inline std::string Utf8(const std::u32string& s) {
  std::string out;
  for (char32_t c : s) AppendUtf8(c, &out);
  return out;
}

// A random sentence of the grammar (nullopt if the draw grew past `budget` characters).
inline std::optional<std::u32string> Draw(const Grammar& g, std::mt19937& rng, size_t budget) {
  std::u32string out;
  std::vector<std::pair<const Sequence*, size_t>> work;
  auto push_rule = [&](int rule) {
    const auto& alts = g.rules()[rule].alternatives;
    // Deep in a draw, prefer the alternatives with fewer rule references.
    size_t pick = std::uniform_int_distribution<size_t>(0, alts.size() - 1)(rng);
    if (work.size() > 12 || out.size() > budget / 2) {
      size_t best = pick;
      auto refs = [&](const Sequence& s) {
        return std::count_if(s.begin(), s.end(),
                             [](const Element& e) { return e.kind == Element::Kind::kRule; });
      };
      for (size_t a = 0; a < alts.size(); ++a) {
        if (refs(alts[a]) < refs(alts[best])) best = a;
      }
      pick = best;
    }
    work.emplace_back(&alts[pick], 0);
  };
  push_rule(g.root());
  while (!work.empty()) {
    if (out.size() > budget || work.size() > 200) return std::nullopt;
    auto& [seq, k] = work.back();
    if (k == seq->size()) {
      work.pop_back();
      continue;
    }
    const Element& e = (*seq)[k++];
    if (e.kind == Element::Kind::kRule) {
      push_rule(e.rule);
      continue;
    }
    // A random code point of the set (ranges weighted alike), surrogates excluded.
    const CharRange& r = e.chars[std::uniform_int_distribution<size_t>(0, e.chars.size() - 1)(rng)];
    const uint32_t span = std::min<uint32_t>(r.hi - r.lo, 300);
    out.push_back(r.lo + std::uniform_int_distribution<uint32_t>(0, span)(rng));
  }
  return out;
}

// Runs `command` through the shell, stderr included in `*output`; its exit status.
inline int RunCommand(const std::string& command, std::string* output) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  char buffer[512];
  while (std::fgets(buffer, sizeof(buffer), pipe) != nullptr) *output += buffer;
  return pclose(pipe);
}

}  // namespace conveyor::grammar
