// Token mask speed on a 128k-entry byte-level vocabulary (issue T): per-token mask time
// (median, p99) over the states of token walks along drawn sentences, for a simple schema
// (a flat object of three fields) and a deep one (nested objects, arrays, anyOf and a
// recursive $ref, six levels), with the grammar's mask cache cold (first walk over the
// sentences) and warm (the same walk again); and schema compile time (JsonSchemaToGrammar
// and Grammar::Parse; the mask cache fills lazily, so its cost is in the cold masks).
//
//   mask_bench --out DIR [--sentences N]
//
// Prints one JSON object per schema. Writes DIR/cases.json, the vocabulary and the grammars
// in the form tests/grammar_ref/xgrammar_masks.py reads, so bench/grammar/
// xgrammar_mask_bench.py times xgrammar on the same grammars, vocabulary and token walks
// (run_mask_bench.sh runs both).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/utf8.h"
#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/test_util.h"
#include "grammar/token_mask.h"
#include "nlohmann/json.hpp"

namespace conveyor::grammar {
namespace {

using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

constexpr int32_t kVocabSize = 131072;

// All 256 single bytes, then multi-byte strings of JSON-ish and English text and UTF-8
// pieces (some cut mid-character); the last id is EOS and adds no bytes.
std::vector<std::string> ByteLevelVocab() {
  std::mt19937 rng(2);
  std::vector<std::string> bytes;
  bytes.reserve(kVocabSize);
  for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
  static const char* const kWords[] = {
      "the", "name", "value", "true", "false", "null", "id", "\": ", "\", \"", "{\"", "\"}", "],",
      "[{",  "ing",  "tion",  " of",  " and",  "er",   "é",  "名前", "😀",      "0",   "12",  "e+"};
  static const std::string kAlphabet = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJ{}[]\":,0123456789-.";
  absl::flat_hash_map<std::string, bool> seen;
  while (static_cast<int32_t>(bytes.size()) + 1 < kVocabSize) {
    std::string t;
    for (int p = 1 + static_cast<int>(rng() % 3); p > 0; --p) {
      if (rng() % 3 == 0) {
        t += kWords[rng() % std::size(kWords)];
      } else {
        for (int k = 1 + static_cast<int>(rng() % 4); k > 0; --k) {
          t.push_back(kAlphabet[rng() % kAlphabet.size()]);
        }
      }
    }
    if (rng() % 20 == 0) t.resize(t.size() - 1);  // Now and then a character cut short.
    if (t.size() < 2 || !seen.try_emplace(t, true).second) continue;
    bytes.push_back(std::move(t));
  }
  bytes.emplace_back();
  return bytes;
}

const char* const kSimpleSchema =
    R"({"type": "object", "properties": {"name": {"type": "string"},
        "age": {"type": "integer"}, "ok": {"type": "boolean"}},
        "required": ["name", "age", "ok"], "additionalProperties": false})";

// Six levels: object > array > object > anyOf > object > array, with a recursive $ref.
const char* const kDeepSchema = R"({
  "$defs": {"tree": {"type": "object", "properties": {"label": {"type": "string", "maxLength": 12},
      "kids": {"type": "array", "items": {"$ref": "#/$defs/tree"}, "maxItems": 3}},
      "required": ["label"], "additionalProperties": false}},
  "type": "object", "properties": {
    "id": {"type": "integer", "minimum": 0},
    "groups": {"type": "array", "maxItems": 3, "items": {"type": "object", "properties": {
      "title": {"type": "string"},
      "entry": {"anyOf": [
        {"type": "object", "properties": {"values": {"type": "array", "items": {"anyOf": [
            {"type": "number"}, {"enum": ["low", "mid", "high"]},
            {"type": "object", "properties": {"k": {"type": "string", "format": "date"}},
             "required": ["k"], "additionalProperties": false}]}, "maxItems": 4}},
         "required": ["values"], "additionalProperties": false},
        {"$ref": "#/$defs/tree"},
        {"type": "null"}]}},
      "required": ["title", "entry"], "additionalProperties": false}},
    "meta": {"type": "object", "additionalProperties": {"type": "string"}}},
  "required": ["id", "groups"], "additionalProperties": false})";

double Micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

std::string Hex(const std::string& bytes) {
  std::string out;
  for (unsigned char c : bytes) absl::StrAppendFormat(&out, "%02x", c);
  return out;
}

// Token walks along `sentences` drawn sentences: the longest allowed token the rest of the
// sentence starts with, to the sentence's end.
std::vector<std::vector<int32_t>> MakeWalks(
    const std::shared_ptr<const Grammar>& grammar, const Vocabulary& vocab,
    const absl::flat_hash_map<std::string, int32_t>& by_bytes, int sentences) {
  std::mt19937 rng(3);
  MaskCache cache(grammar, &vocab);
  TokenMasker masker(&vocab, &cache);
  std::vector<std::vector<int32_t>> walks;
  while (static_cast<int>(walks.size()) < sentences) {
    auto drawn = Draw(*grammar, rng, 400);
    if (!drawn) continue;
    const std::string sentence = Utf8(*drawn);
    Matcher matcher(grammar);
    std::vector<int32_t> walk;
    size_t at = 0;
    while (at < sentence.size()) {
      const Bitmask mask = masker.Compute(matcher);
      int32_t next = -1;
      for (size_t len = std::min<size_t>(sentence.size() - at, 16); len > 0 && next < 0; --len) {
        auto it = by_bytes.find(sentence.substr(at, len));
        if (it != by_bytes.end() && Allowed(mask, it->second)) next = it->second;
      }
      if (next < 0) break;
      matcher.Accept(vocab.bytes(next));
      matcher.Commit();
      walk.push_back(next);
      at += vocab.bytes(next).size();
    }
    walks.push_back(std::move(walk));
  }
  return walks;
}

// Mask times (us) over every state of `walks`, with `cache` as it is.
std::vector<double> TimeMasks(const std::shared_ptr<const Grammar>& grammar,
                              const Vocabulary& vocab, MaskCache* cache,
                              const std::vector<std::vector<int32_t>>& walks) {
  TokenMasker masker(&vocab, cache);
  std::vector<double> times;
  for (const auto& walk : walks) {
    Matcher matcher(grammar);
    for (size_t k = 0; k <= walk.size(); ++k) {
      const auto start = Clock::now();
      const Bitmask mask = masker.Compute(matcher);
      times.push_back(Micros(Clock::now() - start));
      if (k < walk.size()) {
        matcher.Accept(vocab.bytes(walk[k]));
        matcher.Commit();
      }
    }
  }
  return times;
}

int Main(int argc, char** argv) {
  std::string out_dir;
  int sentences = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--out") == 0) out_dir = argv[i + 1];
    if (std::strcmp(argv[i], "--sentences") == 0) sentences = std::atoi(argv[i + 1]);
  }
  if (out_dir.empty()) {
    std::fprintf(stderr, "usage: mask_bench --out DIR [--sentences N]\n");
    return 2;
  }
  const std::vector<std::string> bytes = ByteLevelVocab();
  const int32_t eos = kVocabSize - 1;
  std::vector<bool> special(bytes.size(), false);
  special[eos] = true;
  const auto vocab_start = Clock::now();
  const Vocabulary vocab(bytes, special, {eos});
  const double vocab_ms = Micros(Clock::now() - vocab_start) / 1000;
  absl::flat_hash_map<std::string, int32_t> by_bytes;
  for (int32_t id = 0; id < eos; ++id) by_bytes.try_emplace(bytes[id], id);
  {
    std::ofstream out(out_dir + "/vocab.hex");
    for (const std::string& b : bytes) out << Hex(b) << "\n";
  }

  json spec = {{"vocabs", {{"bytelevel-128k", {{"file", "vocab.hex"}, {"eos", {eos}}}}}},
               {"cases", json::array()}};
  for (const auto& [name, text] : std::vector<std::pair<std::string, const char*>>{
           {"simple", kSimpleSchema}, {"deep", kDeepSchema}}) {
    const json schema = json::parse(text);
    // Cold compile: the first of a few runs; the median of the rest (the code warm).
    std::vector<double> compile_us;
    std::shared_ptr<const Grammar> grammar;
    std::string grammar_text;
    for (int run = 0; run < 11; ++run) {
      const auto start = Clock::now();
      auto compiled = JsonSchemaToGrammar(schema);
      if (!compiled.ok()) {
        std::fprintf(stderr, "%s: %s\n", name.c_str(), compiled.status().ToString().c_str());
        return 1;
      }
      auto parsed = Grammar::Parse(*compiled);
      if (!parsed.ok()) {
        std::fprintf(stderr, "%s: %s\n", name.c_str(), parsed.status().ToString().c_str());
        return 1;
      }
      compile_us.push_back(Micros(Clock::now() - start));
      grammar = std::make_shared<const Grammar>(*std::move(parsed));
      grammar_text = *compiled;
    }
    const double compile_first_us = compile_us.front();
    compile_us.erase(compile_us.begin());
    const auto walks = MakeWalks(grammar, vocab, by_bytes, sentences);

    MaskCache cache(grammar, &vocab);
    const std::vector<double> cold = TimeMasks(grammar, vocab, &cache, walks);
    const std::vector<double> warm = TimeMasks(grammar, vocab, &cache, walks);

    const std::string grammar_file = absl::StrCat("grammar_", name, ".txt");
    std::ofstream(absl::StrCat(out_dir, "/", grammar_file)) << grammar_text;
    for (const auto& walk : walks) {
      spec["cases"].push_back({{"name", name},
                               {"grammar", grammar_file},
                               {"vocab", "bytelevel-128k"},
                               {"tokens", walk}});
    }
    const json result = {{"engine", "conveyor"},
                         {"schema", name},
                         {"masks", cold.size()},
                         {"grammar_rules", grammar->rules().size()},
                         {"mask_cold_median_us", Percentile(cold, 0.5)},
                         {"mask_cold_p99_us", Percentile(cold, 0.99)},
                         {"mask_warm_median_us", Percentile(warm, 0.5)},
                         {"mask_warm_p99_us", Percentile(warm, 0.99)},
                         {"mask_warm_max_us", Percentile(warm, 1.0)},
                         {"contexts", cache.num_contexts()},
                         {"compile_cold_us", compile_first_us},
                         {"compile_again_median_us", Percentile(compile_us, 0.5)},
                         {"vocab_setup_ms", vocab_ms}};
    std::printf("%s\n", result.dump().c_str());
  }
  std::ofstream(out_dir + "/cases.json") << spec.dump();
  return 0;
}

}  // namespace
}  // namespace conveyor::grammar

int main(int argc, char** argv) { return conveyor::grammar::Main(argc, argv); }
