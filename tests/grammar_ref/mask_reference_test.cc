// Token masks against the `xgrammar` package's (issue T): identical grammars (the text
// JsonSchemaToGrammar and RegexToGrammar make, read by xgrammar's EBNF parser with root
// `root`) over identical vocabularies (random byte strings with UTF-8 cut mid-character,
// the tokenizers tests/tokenizer_ref/make_tokenizers.py trains, and a 128k-entry
// byte-level vocabulary), compared bit by bit at every state of token walks along drawn
// sentences. tests/grammar_ref/xgrammar_masks.py replays the walks in xgrammar's
// GrammarMatcher. Without the xgrammar venv (tests/grammar_ref/requirements.txt) the test
// fails, saying how to install it: a missing reference never passes.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/test_temp_dir.h"
#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/regex.h"
#include "grammar/test_util.h"
#include "grammar/token_mask.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "text/hf_tokenizer.h"
#include "text/hf_tokenizer_test_util.h"
#include "text/token_bytes.h"

namespace conveyor::grammar {
namespace {

using json = nlohmann::ordered_json;

struct TestVocab {
  std::string name;
  std::vector<std::string> bytes;
  std::vector<bool> special;
  std::vector<int32_t> eos;
};

std::string Hex(const std::string& bytes) {
  std::string out;
  for (unsigned char c : bytes) absl::StrAppendFormat(&out, "%02x", c);
  return out;
}

std::string Printable(const std::string& bytes) {
  std::string out;
  for (unsigned char c : bytes) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      absl::StrAppendFormat(&out, "\\x%02x", c);
    }
  }
  return out;
}

// Pieces that cut UTF-8 characters: the first, middle or last bytes of one.
std::string CutCharacter(std::mt19937& rng) {
  static const char32_t kChars[] = {U'é', U'名', U'前', U'😀', U'ß', U'→', U'\u00a0', U'中'};
  std::string c;
  AppendUtf8(kChars[rng() % std::size(kChars)], &c);
  const size_t from = rng() % c.size();
  const size_t to = from + 1 + rng() % (c.size() - from);
  return c.substr(from, to - from);
}

// Random byte strings: every single byte, JSON-ish text, and cut characters. The last id is
// EOS; two more ids add nothing (as special tokens do).
TestVocab RandomVocab(const std::string& name, size_t size, const std::string& corpus,
                      uint32_t seed) {
  std::mt19937 rng(seed);
  TestVocab v{name, {}, {}, {}};
  for (int b = 0; b < 256; ++b) v.bytes.emplace_back(1, static_cast<char>(b));
  static const std::string kAlphabet = "{}[]\":, 0123456789-.eEtruefalsnabcxyz_\\/";
  static const char* const kWords[] = {"true", "false", "null", "\": ",  "\", \"",
                                       "{\"",  "\"}",   "name", "\\u00", "\\n",
                                       "],",   "[{",    "0.",   "e+",    "-1"};
  while (v.bytes.size() + 3 < size) {
    std::string t;
    const int parts = 1 + static_cast<int>(rng() % 3);
    for (int p = 0; p < parts; ++p) {
      switch (rng() % 6) {
        case 0:
          t += kWords[rng() % std::size(kWords)];
          break;
        case 1:
          t += CutCharacter(rng);
          break;
        case 2:
          for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) {
            t.push_back(kAlphabet[rng() % kAlphabet.size()]);
          }
          break;
        default: {
          if (corpus.size() < 64) break;
          const size_t at = rng() % (corpus.size() - 16);
          t += corpus.substr(at, 1 + rng() % 7);
          break;
        }
      }
    }
    if (t.empty()) continue;
    v.bytes.push_back(std::move(t));
  }
  v.bytes.emplace_back();  // Special: adds nothing.
  v.bytes.emplace_back();
  v.bytes.emplace_back();  // EOS.
  v.special.assign(v.bytes.size(), false);
  v.special[v.bytes.size() - 3] = true;
  v.special[v.bytes.size() - 2] = true;
  v.special.back() = true;
  v.eos.push_back(static_cast<int32_t>(v.bytes.size() - 1));
  return v;
}

// Whether `token`, after `text`, writes a UTF-16 surrogate in UTF-8 (ED A0..BF): ill-formed
// UTF-8 (RFC 3629), which ours refuses and xgrammar 0.2.9 accepts where a class allows
// U+D800..U+DFFF (as negated classes like JSON's [^"\\\x00-\x1f] do).
bool AddsEncodedSurrogate(const std::string& text, const std::string& token) {
  const std::string s = (text.empty() ? "" : text.substr(text.size() - 1)) + token;
  const size_t first = text.empty() ? 0 : 1;  // The first byte of `token` in `s`.
  for (size_t i = 0; i + 1 < s.size(); ++i) {
    const auto lead = static_cast<unsigned char>(s[i]);
    const auto next = static_cast<unsigned char>(s[i + 1]);
    if (i + 1 >= first && lead == 0xed && next >= 0xa0 && next <= 0xbf) return true;
  }
  return false;
}

// --- Schemas ------------------------------------------------------------------------------

class SchemaGenerator {
 public:
  explicit SchemaGenerator(uint32_t seed) : rng_(seed) {}

  json Make(int depth) {
    json schema = Value(depth, /*with_ref=*/false);
    if (Chance(3)) {
      // A recursive definition, referred to from somewhere inside.
      json node = {
          {"type", "object"},
          {"properties",
           {{"id", {{"type", "integer"}}},
            {"next", {{"type", "array"}, {"items", {{"$ref", "#/$defs/node"}}}, {"maxItems", 2}}}}},
          {"required", {"id"}},
          {"additionalProperties", false}};
      json wrapper = {{"$defs", {{"node", node}}},
                      {"type", "object"},
                      {"properties", {{"head", {{"$ref", "#/$defs/node"}}}, {"rest", schema}}},
                      {"required", {"head"}}};
      return wrapper;
    }
    return schema;
  }

 private:
  bool Chance(int n) { return rng_() % n == 0; }

  json Value(int depth, bool with_ref) {
    const int kinds = depth > 0 ? 10 : 6;
    switch (rng_() % kinds) {
      case 0:
        return String();
      case 1: {
        json s = {{"type", "integer"}};
        if (Chance(2)) s["minimum"] = static_cast<int>(rng_() % 200) - 100;
        if (Chance(2)) s["maximum"] = 100 + static_cast<int>(rng_() % 5000);
        return s;
      }
      case 2:
        return Chance(2) ? json{{"type", "number"}} : json{{"type", "boolean"}};
      case 3:
        return json{{"enum", {"red", "grün", 7, nullptr, true}}};
      case 4:
        return Chance(2) ? json{{"type", "null"}} : json{{"const", "fixed"}};
      case 5:
        return String();
      case 6:
      case 7:
        return Object(depth);
      case 8: {
        json s = {{"type", "array"}, {"items", Value(depth - 1, with_ref)}};
        if (Chance(2)) s["minItems"] = static_cast<int>(rng_() % 2);
        if (Chance(2)) s["maxItems"] = 1 + static_cast<int>(rng_() % 3);
        return s;
      }
      default: {
        json options = json::array();
        for (int k = 2 + static_cast<int>(rng_() % 2); k > 0; --k) {
          options.push_back(Value(depth - 1, with_ref));
        }
        return json{{"anyOf", options}};
      }
    }
  }

  json String() {
    json s = {{"type", "string"}};
    switch (rng_() % 6) {
      case 0:
        s["maxLength"] = 1 + static_cast<int>(rng_() % 6);
        break;
      case 1:
        s["minLength"] = 1;
        s["maxLength"] = 3;
        break;
      case 2: {
        static const char* const kFormats[] = {"date", "uuid", "ipv4", "time", "email"};
        s["format"] = kFormats[rng_() % std::size(kFormats)];
        break;
      }
      case 3:
        s["pattern"] = Chance(2) ? "^[a-z]+[0-9]{1,3}$" : "é|x[\"\\\\]";
        break;
      default:
        break;
    }
    return s;
  }

  json Object(int depth) {
    static const char* const kNames[] = {"id", "name", "naïve", "名前", "value", "tags", "a b"};
    json properties = json::object();
    json required = json::array();
    const int n = 1 + static_cast<int>(rng_() % 4);
    for (int k = 0; k < n; ++k) {
      const std::string name = absl::StrCat(kNames[rng_() % std::size(kNames)], k);
      properties[name] = Value(depth - 1, false);
      if (Chance(2)) required.push_back(name);
    }
    json s = {{"type", "object"}, {"properties", properties}, {"required", required}};
    if (!Chance(4)) s["additionalProperties"] = false;
    return s;
  }

  std::mt19937 rng_;
};

struct NamedGrammar {
  std::string name;
  std::string text;
  std::shared_ptr<const Grammar> grammar;
};

std::vector<NamedGrammar> MakeGrammars(int schemas) {
  std::vector<NamedGrammar> out;
  auto add = [&](const std::string& name, absl::StatusOr<std::string> text) {
    ASSERT_TRUE(text.ok()) << name << ": " << text.status();
    auto grammar = Grammar::Parse(*text);
    ASSERT_TRUE(grammar.ok()) << name << ": " << grammar.status();
    out.push_back({name, *text, std::make_shared<const Grammar>(*std::move(grammar))});
  };
  add("any json object", AnyJsonObjectGrammar());
  static const char* const kPatterns[] = {
      "[a-z]{2,5}@[a-z]+\\.(com|org)", "\\d{3}-\\d{4}",  "(ab|cd)*x?", ".{0,8}é", "[^\\n]{1,12}\\n",
      "[\\u4e00-\\u9fff]+!",           "(\\w+\\s?){1,4}"};
  for (const char* pattern : kPatterns)
    add(absl::StrCat("regex ", pattern), RegexToGrammar(pattern));
  SchemaGenerator generator(11);
  int made = 0;
  for (int attempt = 0; made < schemas && attempt < schemas * 4; ++attempt) {
    const json schema = generator.Make(1 + attempt % 4);
    auto text = JsonSchemaToGrammar(schema);
    if (!text.ok()) continue;  // An unsupported combination the generator made.
    add(schema.dump(), text);
    ++made;
  }
  EXPECT_EQ(made, schemas);
  return out;
}

// --- Walks --------------------------------------------------------------------------------

struct Case {
  size_t vocab;
  size_t grammar;
  std::vector<int32_t> tokens;
  std::vector<Bitmask> masks;  // Ours, before each token and after the last.
};

// A token walk along a drawn sentence: at each state our mask, then an allowed token that
// the sentence's remaining bytes start with (mostly the longest); now and then an allowed
// token off the sentence, after which the walk goes on at random.
Case Walk(const NamedGrammar& g, const Vocabulary& vocab, size_t vocab_index, size_t grammar_index,
          const absl::flat_hash_map<std::string, std::vector<int32_t>>& by_bytes, MaskCache* cache,
          bool also_uncached, std::mt19937& rng, int max_steps) {
  Case c{vocab_index, grammar_index, {}, {}};
  std::string sentence;
  for (int tries = 0; tries < 20 && sentence.empty(); ++tries) {
    if (auto drawn = Draw(*g.grammar, rng, 160)) sentence = Utf8(*drawn);
  }
  Matcher matcher(g.grammar);
  TokenMasker masker(&vocab, cache);
  TokenMasker walker(&vocab);
  size_t at = 0;
  bool on_sentence = true;
  for (int step = 0;; ++step) {
    Bitmask mask = masker.Compute(matcher);
    if (also_uncached) {
      EXPECT_EQ(mask, walker.Compute(matcher)) << "cached and walked masks differ: " << g.name;
    }
    std::vector<int32_t> allowed;
    for (int32_t id = 0; id < vocab.size(); ++id) {
      if (Allowed(mask, id) && !vocab.bytes(id).empty()) allowed.push_back(id);
    }
    c.masks.push_back(std::move(mask));
    if (step == max_steps || allowed.empty()) break;
    int32_t next = -1;
    if (on_sentence && rng() % 12 != 0) {
      std::vector<int32_t> fits;
      for (size_t len = std::min<size_t>(sentence.size() - at, 24); len > 0 && fits.empty();
           --len) {
        auto it = by_bytes.find(sentence.substr(at, len));
        if (it == by_bytes.end()) continue;
        for (int32_t id : it->second) {
          if (Allowed(c.masks.back(), id)) fits.push_back(id);
        }
      }
      if (fits.empty() && at == sentence.size()) break;  // The sentence is done.
      if (!fits.empty()) next = fits[rng() % fits.size()];
    }
    if (next < 0) {
      on_sentence = false;
      next = allowed[rng() % allowed.size()];
    }
    if (on_sentence) at += vocab.bytes(next).size();
    EXPECT_TRUE(matcher.Accept(vocab.bytes(next))) << "a masked-in token is refused";
    matcher.Commit();
    c.tokens.push_back(next);
  }
  return c;
}

std::string PythonOfXgrammarVenv() {
  const char* venv = std::getenv("CONVEYOR_XGRAMMAR_VENV");
  return absl::StrCat(venv != nullptr && *venv != '\0' ? venv : CONVEYOR_XGRAMMAR_VENV,
                      "/bin/python");
}

TEST(MaskReferenceTest, MasksEqualXgrammars) {
  const std::string python = PythonOfXgrammarVenv();
  ASSERT_TRUE(std::filesystem::exists(python))
      << "no xgrammar venv at " << python << "; install it with:\n"
      << "  python3 -m venv --system-site-packages " CONVEYOR_XGRAMMAR_VENV "\n"
      << "  " CONVEYOR_XGRAMMAR_VENV "/bin/pip install --no-deps xgrammar==0.2.9\n"
      << "  " CONVEYOR_XGRAMMAR_VENV "/bin/pip install -r tests/grammar_ref/requirements.txt\n"
      << "(or set CONVEYOR_XGRAMMAR_VENV)";
  TestTempDir dir;
  std::string corpus;
  {
    std::ifstream in(SourceRoot() + "/tests/model_gen/corpus.txt", std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    corpus = text.str();
  }
  ASSERT_GT(corpus.size(), 1000u);

  // The vocabularies: random, trained tokenizers, then the 128k one.
  std::vector<TestVocab> vocabs;
  vocabs.push_back(RandomVocab("random-2k", 2048, corpus, 1));
  ASSERT_TRUE(MakeTokenizerReference(
      dir, "--sweeps no --strings 1 --decodes 1 --tokenizers gpt2,llama3,qwen2,llama2,mistral"));
  for (const char* name : {"gpt2", "llama3", "qwen2", "llama2", "mistral"}) {
    const std::string tokenizer_dir = absl::StrCat(dir.path(), "/", name);
    auto tokenizer = HfTokenizer::Load(tokenizer_dir + "/tokenizer.json",
                                       tokenizer_dir + "/tokenizer_config.json");
    ASSERT_TRUE(tokenizer.ok()) << name << ": " << tokenizer.status();
    const Tokenizer& t = **tokenizer;
    TokenByteTable table = MakeTokenByteTable(t, t.vocab_size());
    TestVocab v{name, std::move(table.bytes), std::move(table.special), {}};
    int32_t eos = t.eos_id();
    if (eos < 0) {  // No EOS named: one more id, adding nothing.
      eos = static_cast<int32_t>(v.bytes.size());
      v.bytes.emplace_back();
      v.special.push_back(true);
    }
    v.eos.push_back(eos);
    vocabs.push_back(std::move(v));
  }
  vocabs.push_back(RandomVocab("byte-level-128k", 131072, corpus, 2));

  std::vector<NamedGrammar> grammars = MakeGrammars(40);
  ASSERT_FALSE(HasFatalFailure());

  json spec = {{"vocabs", json::object()}, {"cases", json::array()}};
  std::vector<Case> cases;
  std::mt19937 rng(5);
  for (size_t v = 0; v < vocabs.size(); ++v) {
    const TestVocab& tv = vocabs[v];
    {
      std::string lines;
      for (const std::string& b : tv.bytes) lines += Hex(b) + "\n";
      dir.WriteFile(absl::StrCat("vocab", v, ".hex"), lines);
    }
    spec["vocabs"][tv.name] = {{"file", absl::StrCat("vocab", v, ".hex")}, {"eos", tv.eos}};
    const Vocabulary vocab(tv.bytes, tv.special, tv.eos);
    absl::flat_hash_map<std::string, std::vector<int32_t>> by_bytes;
    for (int32_t id = 0; id < vocab.size(); ++id) {
      if (!tv.bytes[id].empty() && !tv.special[id]) by_bytes[tv.bytes[id]].push_back(id);
    }
    const bool big = vocab.size() > 100000;
    // The 128k vocabulary takes every fourth grammar; the small ones all, walked twice.
    for (size_t g = 0; g < grammars.size(); g += big ? 4 : 1) {
      MaskCache cache(grammars[g].grammar, &vocab);
      for (int walk = 0; walk < (big ? 1 : 2); ++walk) {
        cases.push_back(Walk(grammars[g], vocab, v, g, by_bytes, &cache, !big, rng, big ? 40 : 60));
        spec["cases"].push_back({{"grammar", absl::StrCat("grammar", g, ".txt")},
                                 {"vocab", tv.name},
                                 {"tokens", cases.back().tokens}});
      }
    }
  }
  for (size_t g = 0; g < grammars.size(); ++g) {
    dir.WriteFile(absl::StrCat("grammar", g, ".txt"), grammars[g].text);
  }
  dir.WriteFile("cases.json", spec.dump());

  std::string output;
  const std::string command = absl::StrCat(
      "'", python, "' '", SourceRoot(), "/tests/grammar_ref/xgrammar_masks.py' '", dir.path(), "'");
  ASSERT_EQ(RunCommand(command, &output), 0) << command << ":\n" << output;
  std::cout << output;

  std::ifstream masks_in(dir.path() + "/masks.bin", std::ios::binary);
  std::ifstream results_in(dir.path() + "/results.json");
  const json results = json::parse(results_in);
  ASSERT_EQ(results.size(), cases.size());
  int compared = 0;
  int differing_masks = 0;
  int surrogate_masks = 0;  // Differing only where xgrammar takes encoded surrogates.
  int reported = 0;
  for (size_t k = 0; k < cases.size(); ++k) {
    const Case& c = cases[k];
    const TestVocab& tv = vocabs[c.vocab];
    const NamedGrammar& g = grammars[c.grammar];
    const size_t words = (tv.bytes.size() + 31) / 32;
    const int states = results[k]["states"].get<int>();
    const std::string error = results[k]["error"].get<std::string>();
    EXPECT_TRUE(error.empty()) << tv.name << ", " << g.name << ": " << error << "\ngrammar:\n"
                               << g.text;
    EXPECT_EQ(states, static_cast<int>(c.masks.size())) << tv.name << ", " << g.name;
    std::string text;
    for (int s = 0; s < states; ++s) {
      Bitmask theirs(words);
      masks_in.read(reinterpret_cast<char*>(theirs.data()),
                    static_cast<std::streamsize>(words * sizeof(uint32_t)));
      ASSERT_TRUE(masks_in) << "masks.bin is short";
      if (s >= static_cast<int>(c.masks.size())) continue;
      const Bitmask& ours = c.masks[s];
      ++compared;
      std::vector<std::string> differences;
      bool surrogates = false;
      for (int32_t id = 0; id < static_cast<int32_t>(tv.bytes.size()); ++id) {
        if (Allowed(ours, id) == Allowed(theirs, id)) continue;
        if (!Allowed(ours, id) && AddsEncodedSurrogate(text, tv.bytes[id])) {
          surrogates = true;
          continue;
        }
        if (differences.size() < 5) {
          differences.push_back(absl::StrCat(id, " \"", Printable(tv.bytes[id]), "\" (",
                                             Allowed(ours, id) ? "ours allows" : "xgrammar allows",
                                             ")"));
        } else {
          differences.back() += " ...";
        }
      }
      if (differences.empty() && surrogates) ++surrogate_masks;
      if (!differences.empty()) {
        ++differing_masks;
        if (reported++ < 20) {
          ADD_FAILURE() << tv.name << ", grammar " << g.name << ", state " << s << " after \""
                        << Printable(text) << "\": " << absl::StrJoin(differences, "; ")
                        << "\ngrammar:\n"
                        << g.text;
        }
      }
      if (s < static_cast<int>(c.tokens.size())) text += tv.bytes[c.tokens[s]];
    }
  }
  std::cout << compared << " masks compared over " << cases.size() << " walks, " << grammars.size()
            << " grammars and " << vocabs.size() << " vocabularies; " << differing_masks
            << " differ; " << surrogate_masks
            << " more differ only in xgrammar allowing encoded surrogates (ill-formed UTF-8)\n";
  EXPECT_EQ(differing_masks, 0);
  EXPECT_GT(compared, 2000);
}

}  // namespace
}  // namespace conveyor::grammar
