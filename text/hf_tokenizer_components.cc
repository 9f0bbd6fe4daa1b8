#include "text/hf_tokenizer_components.h"

#include <algorithm>
#include <array>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "text/hf_tokenizer_text.h"
#include "text/utf8.h"

namespace conveyor::hf {

using json = nlohmann::json;

// --- JSON helpers ----------------------------------------------------------------------

namespace {

const json* Field(const json& object, std::string_view key) {
  if (!object.is_object()) return nullptr;
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::Status WrongType(const std::string& where, std::string_view key, std::string_view type) {
  return absl::InvalidArgumentError(
      absl::StrCat(where, ".", AsAbsl(key), " must be ", AsAbsl(type)));
}

}  // namespace

absl::Status ReadString(const json& object, std::string_view key, const std::string& where,
                        std::string* out) {
  const json* value = Field(object, key);
  if (value == nullptr) return absl::OkStatus();
  if (!value->is_string()) return WrongType(where, key, "a string");
  *out = value->get_ref<const std::string&>();
  return absl::OkStatus();
}

absl::Status ReadBool(const json& object, std::string_view key, const std::string& where,
                      bool* out) {
  const json* value = Field(object, key);
  if (value == nullptr) return absl::OkStatus();
  if (!value->is_boolean()) return WrongType(where, key, "true or false");
  *out = value->get<bool>();
  return absl::OkStatus();
}

absl::Status ReadInt(const json& object, std::string_view key, const std::string& where,
                     int64_t* out) {
  const json* value = Field(object, key);
  if (value == nullptr) return absl::OkStatus();
  if (!value->is_number_integer()) return WrongType(where, key, "an integer");
  *out = value->get<int64_t>();
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadType(const json& object, const std::string& where) {
  if (!object.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, " must be an object"));
  }
  std::string type;
  if (absl::Status s = ReadString(object, "type", where, &type); !s.ok()) return s;
  if (type.empty()) return absl::InvalidArgumentError(absl::StrCat(where, " has no \"type\""));
  return type;
}

namespace {

absl::Status Unknown(std::string_view kind, std::string_view type, const std::string& where) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": unknown or unsupported ", AsAbsl(kind),
                                                 " type \"", AsAbsl(type), "\""));
}

// A field holding exactly one character (e.g. Metaspace's replacement), as its UTF-8.
absl::Status ReadChar(const json& object, std::string_view key, const std::string& where,
                      std::string* out) {
  std::string value = *out;
  RETURN_IF_ERROR(ReadString(object, key, where, &value));
  if (value.empty() || FindInvalidUtf8(value) != std::string_view::npos ||
      CharSize(static_cast<unsigned char>(value[0])) != value.size()) {
    return WrongType(where, key, "one character");
  }
  *out = std::move(value);
  return absl::OkStatus();
}

// A Split or Replace pattern: {"String": "..."} (literal) or {"Regex": "..."}.
absl::StatusOr<std::shared_ptr<const Regex>> ReadPattern(const json& object,
                                                         const std::string& where) {
  const json* pattern = Field(object, "pattern");
  if (pattern == nullptr || !pattern->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".pattern must be an object"));
  }
  std::string text;
  const std::string pattern_where = absl::StrCat(where, ".pattern");
  if (const json* s = Field(*pattern, "String"); s != nullptr) {
    RETURN_IF_ERROR(ReadString(*pattern, "String", pattern_where, &text));
    return Regex::Literal(text);
  }
  if (Field(*pattern, "Regex") != nullptr) {
    RETURN_IF_ERROR(ReadString(*pattern, "Regex", pattern_where, &text));
    absl::StatusOr<std::shared_ptr<const Regex>> regex = Regex::Compile(text);
    if (!regex.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", regex.status().message()));
    }
    return regex;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(where, ".pattern must hold \"String\" or \"Regex\""));
}

// The sub-objects of a Sequence (`key` names the array).
absl::StatusOr<const json*> ReadArray(const json& object, std::string_view key,
                                      const std::string& where) {
  const json* array = Field(object, key);
  if (array == nullptr || !array->is_array()) return WrongType(where, key, "an array");
  return array;
}

// --- Splitting: HF's NormalizedString::split ------------------------------------------

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

absl::StatusOr<SplitBehavior> ReadBehavior(const json& object, const std::string& where,
                                           SplitBehavior fallback) {
  std::string name;
  RETURN_IF_ERROR(ReadString(object, "behavior", where, &name));
  if (name.empty()) return fallback;
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return absl::InvalidArgumentError(absl::StrCat(where, ": unknown split behavior \"", name, "\""));
}

// A run of the text: a match of the pattern or the text between two.
struct Span {
  uint32_t begin;
  uint32_t end;
  bool is_match;
};

// Spans covering `text` from a regex's matches (HF's Pattern::find_matches).
void SpansFromMatches(std::string_view text, const std::vector<Match>& matches, bool invert,
                      std::vector<Span>* spans) {
  spans->clear();
  uint32_t previous = 0;
  for (const Match& m : matches) {
    if (previous != m.first) spans->push_back({previous, static_cast<uint32_t>(m.first), invert});
    spans->push_back({static_cast<uint32_t>(m.first), static_cast<uint32_t>(m.second), !invert});
    previous = static_cast<uint32_t>(m.second);
  }
  if (previous != text.size()) {
    spans->push_back({previous, static_cast<uint32_t>(text.size()), invert});
  }
}

// Spans covering `text`, one match per character that satisfies `is_match`.
template <typename Predicate>
void SpansFromChars(std::string_view text, Predicate is_match, std::vector<Span>* spans) {
  spans->clear();
  uint32_t last = 0;
  for (size_t i = 0; i < text.size();) {
    const auto begin = static_cast<uint32_t>(i);
    const char32_t c = NextChar(text, &i);
    if (!is_match(c)) continue;
    if (last < begin) spans->push_back({last, begin, false});
    spans->push_back({begin, static_cast<uint32_t>(i), true});
    last = static_cast<uint32_t>(i);
  }
  if (last < text.size()) spans->push_back({last, static_cast<uint32_t>(text.size()), false});
}

// Adds the pieces `behavior` makes of `text` and its spans to `out`.
void EmitSplits(std::string_view text, bool at_start, const std::vector<Span>& spans,
                SplitBehavior behavior, PieceList* out) {
  // (begin, end) of each piece; HF folds the spans the same way.
  thread_local std::vector<std::pair<uint32_t, uint32_t>> pieces;
  pieces.clear();
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Span& s : spans) pieces.emplace_back(s.begin, s.end);
      break;
    case SplitBehavior::kRemoved:
      for (const Span& s : spans) {
        if (!s.is_match) pieces.emplace_back(s.begin, s.end);
      }
      break;
    case SplitBehavior::kContiguous:
      for (const Span& s : spans) {
        if (s.is_match == previous_match && !pieces.empty()) {
          pieces.back().second = s.end;
        } else {
          pieces.emplace_back(s.begin, s.end);
        }
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Span& s : spans) {
        if (s.is_match && !previous_match && !pieces.empty()) {
          pieces.back().second = s.end;
        } else {
          pieces.emplace_back(s.begin, s.end);
        }
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !pieces.empty()) {
          pieces.back().first = it->begin;
        } else {
          pieces.emplace_back(it->begin, it->end);
        }
        previous_match = it->is_match;
      }
      std::reverse(pieces.begin(), pieces.end());
      break;
  }
  for (const auto& [begin, end] : pieces) {
    out->Add(text.substr(begin, end - begin), at_start && begin == 0);
  }
}

// --- Byte-level alphabet (GPT-2's bytes_to_unicode) ------------------------------------

struct ByteAlphabet {
  ByteAlphabet() {
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const char32_t c = printable ? b : next++;
      AppendUtf8(c, &chars[b]);
      byte_of[c] = static_cast<int16_t>(b);
    }
  }
  std::array<std::string, 256> chars;  // UTF-8 of the character that stands for each byte.
  std::array<int16_t, 324> byte_of{};  // The byte a character < 324 stands for.

  // The byte `c` stands for, or -1.
  int ByteOf(char32_t c) const {
    if (c >= byte_of.size()) return -1;
    const int b = byte_of[c];
    return b != 0 || c == 256 ? b : -1;  // Only U+0100 stands for byte 0.
  }
};

const ByteAlphabet& Bytes() {
  static const ByteAlphabet* alphabet = new ByteAlphabet();
  return *alphabet;
}

void AppendByteChars(std::string_view text, std::string* out) {
  const ByteAlphabet& bytes = Bytes();
  for (const char c : text) out->append(bytes.chars[static_cast<unsigned char>(c)]);
}

// --- Normalizers -----------------------------------------------------------------------

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  absl::Status Normalize(std::string* text) const override {
    for (const auto& step : steps_) RETURN_IF_ERROR(step->Normalize(text));
    return absl::OkStatus();
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(NormalForm form) : form_(form) {}
  absl::Status Normalize(std::string* text) const override { return hf::Normalize(form_, text); }

 private:
  NormalForm form_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  absl::Status Normalize(std::string* text) const override {
    std::string lower;
    lower.reserve(text->size());
    AppendLowercase(*text, &lower);
    *text = std::move(lower);
    return absl::OkStatus();
  }
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  absl::Status Normalize(std::string* text) const override {
    size_t begin = 0, end = text->size();
    if (left_) {
      while (begin < end) {
        size_t next = begin;
        if (!IsWhitespace(NextChar(*text, &next))) break;
        begin = next;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while ((static_cast<unsigned char>((*text)[start]) & 0xC0) == 0x80) --start;
        size_t next = start;
        if (!IsWhitespace(NextChar(*text, &next))) break;
        end = start;
      }
    }
    *text = text->substr(begin, end - begin);
    return absl::OkStatus();
  }

 private:
  bool left_, right_;
};

class StripAccentsNormalizer final : public Normalizer {
 public:
  absl::Status Normalize(std::string* text) const override {
    std::string out;
    out.reserve(text->size());
    for (size_t i = 0; i < text->size();) {
      const size_t begin = i;
      if (!IsMark(NextChar(*text, &i))) out.append(*text, begin, i - begin);
    }
    *text = std::move(out);
    return absl::OkStatus();
  }
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(std::shared_ptr<const Regex> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  absl::Status Normalize(std::string* text) const override {
    thread_local std::vector<Match> matches;
    RETURN_IF_ERROR(pattern_->FindAll(*text, &matches));
    if (matches.empty()) return absl::OkStatus();
    std::string out;
    out.reserve(text->size() + matches.size() * content_.size());
    size_t previous = 0;
    for (const Match& m : matches) {
      out.append(*text, previous, m.first - previous);
      out.append(content_);
      previous = m.second;
    }
    out.append(*text, previous);
    *text = std::move(out);
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<const Regex> pattern_;
  std::string content_;
};

// Prepend and Append: only non-empty text gets the affix.
class AffixNormalizer final : public Normalizer {
 public:
  AffixNormalizer(std::string affix, bool prepend) : affix_(std::move(affix)), prepend_(prepend) {}
  absl::Status Normalize(std::string* text) const override {
    if (text->empty()) return absl::OkStatus();
    if (prepend_) {
      text->insert(0, affix_);
    } else {
      text->append(affix_);
    }
    return absl::OkStatus();
  }

 private:
  std::string affix_;
  bool prepend_;
};

class ByteLevelNormalizer final : public Normalizer {
 public:
  absl::Status Normalize(std::string* text) const override {
    std::string out;
    out.reserve(text->size() * 2);
    AppendByteChars(*text, &out);
    *text = std::move(out);
    return absl::OkStatus();
  }
};

// --- Pre-tokenizers --------------------------------------------------------------------

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  absl::Status PreTokenize(const PieceList& in, PieceList* out) const override {
    if (steps_.empty()) {
      *out = in;
      return absl::OkStatus();
    }
    // Ping-pong between `out` and a scratch list, ending in `out`.
    // A deque: growing it for a nested Sequence keeps the outer one's scratch in place.
    thread_local std::deque<PieceList> scratch_stack;
    thread_local size_t depth = 0;
    if (scratch_stack.size() <= depth) scratch_stack.resize(depth + 1);
    PieceList& scratch = scratch_stack[depth];
    ++depth;
    const PieceList* source = &in;
    absl::Status status;
    for (size_t i = 0; i < steps_.size() && status.ok(); ++i) {
      PieceList* target = (steps_.size() - i) % 2 == 1 ? out : &scratch;
      target->Clear();
      status = steps_[i]->PreTokenize(*source, target);
      source = target;
    }
    --depth;
    return status;
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(std::shared_ptr<const Regex> pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  absl::Status PreTokenize(const PieceList& in, PieceList* out) const override {
    thread_local std::vector<Match> matches;
    thread_local std::vector<Span> spans;
    for (const PieceList::Piece& piece : in.pieces()) {
      const std::string_view text = in.text(piece);
      RETURN_IF_ERROR(pattern_->FindAll(text, &matches));
      SpansFromMatches(text, matches, invert_, &spans);
      EmitSplits(text, piece.at_start, spans, behavior_, out);
    }
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<const Regex> pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

// GPT-2's split, as HF's ByteLevel pre-tokenizer runs it.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::shared_ptr<const Regex> split)
      : add_prefix_space_(add_prefix_space), split_(std::move(split)) {}
  absl::Status PreTokenize(const PieceList& in, PieceList* out) const override {
    thread_local std::string spaced;
    thread_local std::vector<Match> matches;
    for (const PieceList::Piece& piece : in.pieces()) {
      std::string_view text = in.text(piece);
      // Every piece gets the space, not only the text's first: HF does it per split.
      if (add_prefix_space_ && text.front() != ' ') {
        spaced.assign(" ");
        spaced.append(text);
        text = spaced;
      }
      if (split_ == nullptr) {
        AddMapped(text, piece.at_start, out);
        continue;
      }
      RETURN_IF_ERROR(split_->FindAll(text, &matches));
      // Isolated: matches and the text between them, each its own piece.
      size_t previous = 0;
      for (const Match& m : matches) {
        if (previous < m.first) {
          AddMapped(text.substr(previous, m.first - previous), piece.at_start && previous == 0,
                    out);
        }
        AddMapped(text.substr(m.first, m.second - m.first), piece.at_start && m.first == 0, out);
        previous = m.second;
      }
      if (previous < text.size()) {
        AddMapped(text.substr(previous), piece.at_start && previous == 0, out);
      }
    }
    return absl::OkStatus();
  }

 private:
  static void AddMapped(std::string_view text, bool at_start, PieceList* out) {
    const uint32_t begin = out->Begin();
    AppendByteChars(text, out->buffer());
    out->End(begin, at_start);
  }

  bool add_prefix_space_;
  std::shared_ptr<const Regex> split_;  // Null without use_regex.
};

enum class PrependScheme { kAlways, kFirst, kNever };

// Metaspace's settings, shared by the pre-tokenizer and the decoder.
struct MetaspaceConfig {
  std::string replacement = "\xE2\x96\x81";  // "▁"
  PrependScheme scheme = PrependScheme::kAlways;
  bool split = true;
};

absl::StatusOr<MetaspaceConfig> ReadMetaspace(const json& object, const std::string& where) {
  MetaspaceConfig config;
  RETURN_IF_ERROR(ReadChar(object, "replacement", where, &config.replacement));
  RETURN_IF_ERROR(ReadBool(object, "split", where, &config.split));
  std::string scheme;
  RETURN_IF_ERROR(ReadString(object, "prepend_scheme", where, &scheme));
  if (scheme == "always" || scheme.empty()) {
    config.scheme = PrependScheme::kAlways;
  } else if (scheme == "first") {
    config.scheme = PrependScheme::kFirst;
  } else if (scheme == "never") {
    config.scheme = PrependScheme::kNever;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": unknown prepend_scheme \"", scheme, "\""));
  }
  // Files from before prepend_scheme say add_prefix_space; false means "never".
  bool add_prefix_space = true;
  RETURN_IF_ERROR(ReadBool(object, "add_prefix_space", where, &add_prefix_space));
  if (!add_prefix_space) {
    if (!scheme.empty() && config.scheme != PrependScheme::kNever) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": add_prefix_space does not match prepend_scheme"));
    }
    config.scheme = PrependScheme::kNever;
  }
  return config;
}

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  explicit MetaspacePreTokenizer(MetaspaceConfig config) : config_(std::move(config)) {
    size_t i = 0;
    replacement_char_ = NextChar(config_.replacement, &i);
  }
  absl::Status PreTokenize(const PieceList& in, PieceList* out) const override {
    thread_local std::string replaced;
    thread_local std::vector<Span> spans;
    for (const PieceList::Piece& piece : in.pieces()) {
      const std::string_view text = in.text(piece);
      replaced.clear();
      const bool prepend = config_.scheme == PrependScheme::kAlways ||
                           (config_.scheme == PrependScheme::kFirst && piece.at_start);
      // The prepend check looks at the text after spaces became the replacement.
      const bool starts_with_replacement =
          text.front() == ' ' || text.starts_with(config_.replacement);
      if (prepend && !starts_with_replacement) replaced.append(config_.replacement);
      for (const char c : text) {
        if (c == ' ') {
          replaced.append(config_.replacement);
        } else {
          replaced.push_back(c);
        }
      }
      if (!config_.split) {
        out->Add(replaced, piece.at_start);
        continue;
      }
      const char32_t r = replacement_char_;
      SpansFromChars(
          replaced, [r](char32_t c) { return c == r; }, &spans);
      EmitSplits(replaced, piece.at_start, spans, SplitBehavior::kMergedWithNext, out);
    }
    return absl::OkStatus();
  }

 private:
  MetaspaceConfig config_;
  char32_t replacement_char_;
};

// Splits each piece on the characters `Predicate` picks, with `behavior`.
template <typename Predicate>
class CharSplitPreTokenizer final : public PreTokenizer {
 public:
  CharSplitPreTokenizer(Predicate predicate, SplitBehavior behavior)
      : predicate_(std::move(predicate)), behavior_(behavior) {}
  absl::Status PreTokenize(const PieceList& in, PieceList* out) const override {
    thread_local std::vector<Span> spans;
    for (const PieceList::Piece& piece : in.pieces()) {
      const std::string_view text = in.text(piece);
      SpansFromChars(text, predicate_, &spans);
      EmitSplits(text, piece.at_start, spans, behavior_, out);
    }
    return absl::OkStatus();
  }

 private:
  Predicate predicate_;
  SplitBehavior behavior_;
};

template <typename Predicate>
std::unique_ptr<PreTokenizer> MakeCharSplit(Predicate predicate, SplitBehavior behavior) {
  return std::make_unique<CharSplitPreTokenizer<Predicate>>(std::move(predicate), behavior);
}

// --- Post-processors -------------------------------------------------------------------

// A single-sequence template: special token ids around (or in) the sequence, marked -1.
class TemplatePostProcessor final : public PostProcessor {
 public:
  explicit TemplatePostProcessor(std::vector<std::vector<int>> parts) : parts_(std::move(parts)) {}
  void Process(std::vector<int>* ids) const override {
    std::vector<int> out;
    out.reserve(ids->size() + 8);
    for (const std::vector<int>& part : parts_) {
      if (part.empty()) {
        out.insert(out.end(), ids->begin(), ids->end());
      } else {
        out.insert(out.end(), part.begin(), part.end());
      }
    }
    *ids = std::move(out);
  }

 private:
  // Each part: the ids of a special token, or empty for the sequence.
  std::vector<std::vector<int>> parts_;
};

class NoopPostProcessor final : public PostProcessor {
 public:
  void Process(std::vector<int>*) const override {}
};

class SequencePostProcessor final : public PostProcessor {
 public:
  explicit SequencePostProcessor(std::vector<std::unique_ptr<PostProcessor>> steps)
      : steps_(std::move(steps)) {}
  void Process(std::vector<int>* ids) const override {
    for (const auto& step : steps_) step->Process(ids);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

absl::StatusOr<std::unique_ptr<PostProcessor>> ParseTemplate(const json& object,
                                                             const std::string& where) {
  // special_tokens: {"<name>": {"id": "<name>", "ids": [...], "tokens": [...]}}.
  const json* specials = Field(object, "special_tokens");
  const auto special_ids = [&](const std::string& name) -> absl::StatusOr<std::vector<int>> {
    const json* special = specials == nullptr ? nullptr : Field(*specials, name);
    const json* ids = special == nullptr ? nullptr : Field(*special, "ids");
    if (ids == nullptr || !ids->is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the template uses \"", name, "\", missing from special_tokens"));
    }
    std::vector<int> out;
    for (const json& id : *ids) {
      if (!id.is_number_integer()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ".special_tokens.", name, ".ids must hold integers"));
      }
      out.push_back(id.get<int>());
    }
    if (out.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".special_tokens.", name, " has no ids"));
    }
    return out;
  };
  const json* single = Field(object, "single");
  if (single == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(where, " has no \"single\""));
  }
  std::vector<std::vector<int>> parts;
  if (single->is_string()) {
    // The short form: "[CLS]:0 $A:0 [SEP]:0"; "$", "$A", "$0" and "$A:1" are the sequence.
    const std::string& text = single->get_ref<const std::string&>();
    for (size_t i = 0; i < text.size();) {
      const size_t end = std::min(text.find(' ', i), text.size());
      std::string item = text.substr(i, end - i);
      i = end + 1;
      if (item.empty()) continue;
      if (item[0] == '$') {
        parts.emplace_back();
        continue;
      }
      const size_t colon = item.rfind(':');
      if (colon != std::string::npos) item.resize(colon);
      absl::StatusOr<std::vector<int>> ids = special_ids(item);
      if (!ids.ok()) return ids.status();
      parts.push_back(*std::move(ids));
    }
  } else if (single->is_array()) {
    for (const json& piece : *single) {
      if (Field(piece, "Sequence") != nullptr) {
        parts.emplace_back();
        continue;
      }
      const json* special = Field(piece, "SpecialToken");
      std::string name;
      if (special != nullptr) RETURN_IF_ERROR(ReadString(*special, "id", where, &name));
      if (name.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ".single holds a piece that is neither Sequence nor SpecialToken"));
      }
      absl::StatusOr<std::vector<int>> ids = special_ids(name);
      if (!ids.ok()) return ids.status();
      parts.push_back(*std::move(ids));
    }
  } else {
    return WrongType(where, "single", "an array or a string");
  }
  return std::make_unique<TemplatePostProcessor>(std::move(parts));
}

// Bert and Roberta processing: [cls] sequence [sep], where each is ["<token>", id].
absl::StatusOr<std::unique_ptr<PostProcessor>> ParseClsSep(const json& object,
                                                           const std::string& where) {
  std::vector<std::vector<int>> parts;
  for (const char* key : {"cls", "sep"}) {
    const json* pair = Field(object, key);
    if (pair == nullptr || !pair->is_array() || pair->size() != 2 ||
        !(*pair)[1].is_number_integer()) {
      return WrongType(where, key, "[token, id]");
    }
    parts.push_back({(*pair)[1].get<int>()});
    if (parts.size() == 1) parts.emplace_back();  // The sequence, between the two.
  }
  return std::make_unique<TemplatePostProcessor>(std::move(parts));
}

// --- Decoders --------------------------------------------------------------------------

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps)
      : steps_(std::move(steps)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (const auto& step : steps_) step->DecodeChain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

// All tokens become one string: each token's characters as the bytes they stand for (a
// token with any other character keeps its own bytes), read as UTF-8 lossily.
class ByteLevelDecoder final : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    const ByteAlphabet& alphabet = Bytes();
    std::string bytes;
    for (const std::string& token : *tokens) {
      const size_t start = bytes.size();
      bool all_mapped = true;
      for (size_t i = 0; i < token.size() && all_mapped;) {
        const int b = alphabet.ByteOf(NextChar(token, &i));
        if (b < 0) {
          all_mapped = false;
        } else {
          bytes.push_back(static_cast<char>(b));
        }
      }
      if (!all_mapped) {
        bytes.resize(start);
        bytes.append(token);
      }
    }
    std::string text;
    text.reserve(bytes.size());
    AppendLossyUtf8(bytes, &text);
    tokens->clear();
    tokens->push_back(std::move(text));
  }
};

class MetaspaceDecoder final : public Decoder {
 public:
  explicit MetaspaceDecoder(MetaspaceConfig config) : config_(std::move(config)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (size_t t = 0; t < tokens->size(); ++t) {
      std::string& token = (*tokens)[t];
      // The first token loses every replacement character, not only a leading one: HF.
      const bool drop = t == 0 && config_.scheme != PrependScheme::kNever;
      std::string out;
      out.reserve(token.size());
      for (size_t i = 0; i < token.size();) {
        if (token.compare(i, config_.replacement.size(), config_.replacement) == 0) {
          if (!drop) out.push_back(' ');
          i += config_.replacement.size();
        } else {
          out.push_back(token[i++]);
        }
      }
      token = std::move(out);
    }
  }

 private:
  MetaspaceConfig config_;
};

// "<0xE4>"-style tokens become their bytes; a run of them that is not valid UTF-8 becomes
// one U+FFFD per byte.
class ByteFallbackDecoder final : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens->size());
    std::string run;
    const auto flush = [&] {
      if (run.empty()) return;
      if (FindInvalidUtf8(run) == std::string_view::npos) {
        out.push_back(run);
      } else {
        for (size_t i = 0; i < run.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      run.clear();
    };
    for (std::string& token : *tokens) {
      int byte = -1;
      if (token.size() == 6 && token.starts_with("<0x") && token.back() == '>') {
        const std::string_view digits = token;
        byte = ParseHexByte(digits.substr(3, 2));
      }
      if (byte >= 0) {
        run.push_back(static_cast<char>(byte));
      } else {
        flush();
        out.push_back(std::move(token));
      }
    }
    flush();
    *tokens = std::move(out);
  }

 private:
  // Rust's u8::from_str_radix(s, 16) for two characters: an optional '+' then hex digits.
  static int ParseHexByte(std::string_view s) {
    if (s[0] == '+') s.remove_prefix(1);
    int value = 0;
    for (const char c : s) {
      int digit;
      if (c >= '0' && c <= '9') {
        digit = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        digit = c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        digit = c - 'A' + 10;
      } else {
        return -1;
      }
      value = value * 16 + digit;
    }
    return value;
  }
};

class FuseDecoder final : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::string all;
    for (const std::string& token : *tokens) all.append(token);
    tokens->clear();
    tokens->push_back(std::move(all));
  }
};

// Removes up to `start` leading and `stop` trailing `content` characters of each token.
class StripDecoder final : public Decoder {
 public:
  StripDecoder(std::string content, int64_t start, int64_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    const std::string_view c = content_;
    for (std::string& token : *tokens) {
      const std::string_view text = token;
      size_t begin = 0, end = text.size();
      for (int64_t i = 0; i < start_ && text.substr(begin).starts_with(c); ++i) begin += c.size();
      // HF would panic where the two cuts overlap; here the token just becomes empty.
      for (int64_t i = 0; i < stop_ && end >= begin + c.size() && text.substr(0, end).ends_with(c);
           ++i) {
        end -= c.size();
      }
      token = std::string(text.substr(begin, end - begin));
    }
  }

 private:
  std::string content_;
  int64_t start_, stop_;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(std::shared_ptr<const Regex> pattern, std::string content)
      : normalizer_(std::move(pattern), std::move(content)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    // A PCRE2 resource failure leaves the token as it was: decoding cannot fail.
    for (std::string& token : *tokens) normalizer_.Normalize(&token).IgnoreError();
  }

 private:
  ReplaceNormalizer normalizer_;  // Replaces in one string, as the decoder does per token.
};

// Classic BPE's end-of-word suffix: a space, except after the last token.
class BpeSuffixDecoder final : public Decoder {
 public:
  explicit BpeSuffixDecoder(std::string suffix) : suffix_(std::move(suffix)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    if (suffix_.empty()) return;
    for (size_t t = 0; t < tokens->size(); ++t) {
      const std::string_view with = t + 1 == tokens->size() ? "" : " ";
      std::string& token = (*tokens)[t];
      std::string out;
      for (size_t i = 0; i < token.size();) {
        if (token.compare(i, suffix_.size(), suffix_) == 0) {
          out.append(with);
          i += suffix_.size();
        } else {
          out.push_back(token[i++]);
        }
      }
      token = std::move(out);
    }
  }

 private:
  std::string suffix_;
};

}  // namespace

// --- Parsers ---------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const json& object,
                                                            const std::string& where) {
  absl::StatusOr<std::string> type = ReadType(object, where);
  if (!type.ok()) return type.status();
  if (*type == "Sequence") {
    absl::StatusOr<const json*> array = ReadArray(object, "normalizers", where);
    if (!array.ok()) return array.status();
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (size_t i = 0; i < (*array)->size(); ++i) {
      auto step = ParseNormalizer((**array)[i], absl::StrCat(where, ".normalizers[", i, "]"));
      if (!step.ok()) return step.status();
      steps.push_back(*std::move(step));
    }
    return std::make_unique<SequenceNormalizer>(std::move(steps));
  }
  if (*type == "NFC") return std::make_unique<UnicodeNormalizer>(NormalForm::kNfc);
  if (*type == "NFD") return std::make_unique<UnicodeNormalizer>(NormalForm::kNfd);
  if (*type == "NFKC") return std::make_unique<UnicodeNormalizer>(NormalForm::kNfkc);
  if (*type == "NFKD") return std::make_unique<UnicodeNormalizer>(NormalForm::kNfkd);
  if (*type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (*type == "StripAccents") return std::make_unique<StripAccentsNormalizer>();
  if (*type == "ByteLevel") return std::make_unique<ByteLevelNormalizer>();
  if (*type == "Strip") {
    bool left = true, right = true;
    RETURN_IF_ERROR(ReadBool(object, "strip_left", where, &left));
    RETURN_IF_ERROR(ReadBool(object, "strip_right", where, &right));
    return std::make_unique<StripNormalizer>(left, right);
  }
  if (*type == "Replace") {
    auto pattern = ReadPattern(object, where);
    if (!pattern.ok()) return pattern.status();
    std::string content;
    RETURN_IF_ERROR(ReadString(object, "content", where, &content));
    return std::make_unique<ReplaceNormalizer>(*std::move(pattern), std::move(content));
  }
  if (*type == "Prepend" || *type == "Append") {
    const bool prepend = *type == "Prepend";
    std::string affix;
    RETURN_IF_ERROR(ReadString(object, prepend ? "prepend" : "append", where, &affix));
    return std::make_unique<AffixNormalizer>(std::move(affix), prepend);
  }
  return Unknown("normalizer", *type, where);
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const json& object,
                                                                const std::string& where) {
  absl::StatusOr<std::string> type = ReadType(object, where);
  if (!type.ok()) return type.status();
  if (*type == "Sequence") {
    absl::StatusOr<const json*> array = ReadArray(object, "pretokenizers", where);
    if (!array.ok()) return array.status();
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (size_t i = 0; i < (*array)->size(); ++i) {
      auto step = ParsePreTokenizer((**array)[i], absl::StrCat(where, ".pretokenizers[", i, "]"));
      if (!step.ok()) return step.status();
      steps.push_back(*std::move(step));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  if (*type == "Split") {
    auto pattern = ReadPattern(object, where);
    if (!pattern.ok()) return pattern.status();
    auto behavior = ReadBehavior(object, where, SplitBehavior::kRemoved);
    if (!behavior.ok()) return behavior.status();
    bool invert = false;
    RETURN_IF_ERROR(ReadBool(object, "invert", where, &invert));
    return std::make_unique<SplitPreTokenizer>(*std::move(pattern), *behavior, invert);
  }
  if (*type == "ByteLevel") {
    bool add_prefix_space = true, use_regex = true;
    RETURN_IF_ERROR(ReadBool(object, "add_prefix_space", where, &add_prefix_space));
    RETURN_IF_ERROR(ReadBool(object, "use_regex", where, &use_regex));
    std::shared_ptr<const Regex> split;
    if (use_regex) {
      absl::StatusOr<std::shared_ptr<const Regex>> regex = Regex::Compile(kGpt2Pattern);
      if (!regex.ok()) return regex.status();
      split = *std::move(regex);
    }
    return std::make_unique<ByteLevelPreTokenizer>(add_prefix_space, std::move(split));
  }
  if (*type == "Metaspace") {
    absl::StatusOr<MetaspaceConfig> config = ReadMetaspace(object, where);
    if (!config.ok()) return config.status();
    return std::make_unique<MetaspacePreTokenizer>(*std::move(config));
  }
  if (*type == "Digits") {
    bool individual = false;
    RETURN_IF_ERROR(ReadBool(object, "individual_digits", where, &individual));
    return MakeCharSplit(IsNumeric,
                         individual ? SplitBehavior::kIsolated : SplitBehavior::kContiguous);
  }
  if (*type == "Whitespace") {
    // HF runs \w+|[^\w\s]+ with the regex crate, keeping the matches; spelled out here with
    // that crate's \w and \s.
    absl::StatusOr<std::shared_ptr<const Regex>> regex =
        Regex::Compile(R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}]+|)"
                       R"([^\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}\p{White_Space}]+)");
    if (!regex.ok()) return regex.status();
    return std::make_unique<SplitPreTokenizer>(*std::move(regex), SplitBehavior::kRemoved,
                                               /*invert=*/true);
  }
  if (*type == "WhitespaceSplit") return MakeCharSplit(IsWhitespace, SplitBehavior::kRemoved);
  if (*type == "Punctuation") {
    auto behavior = ReadBehavior(object, where, SplitBehavior::kIsolated);
    if (!behavior.ok()) return behavior.status();
    return MakeCharSplit(IsPunctuation, *behavior);
  }
  if (*type == "BertPreTokenizer") {
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    steps.push_back(MakeCharSplit(IsWhitespace, SplitBehavior::kRemoved));
    steps.push_back(MakeCharSplit(IsPunctuation, SplitBehavior::kIsolated));
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  if (*type == "CharDelimiterSplit") {
    std::string delimiter;
    RETURN_IF_ERROR(ReadChar(object, "delimiter", where, &delimiter));
    size_t i = 0;
    const char32_t d = NextChar(delimiter, &i);
    return MakeCharSplit([d](char32_t c) { return c == d; }, SplitBehavior::kRemoved);
  }
  return Unknown("pre_tokenizer", *type, where);
}

absl::StatusOr<std::unique_ptr<PostProcessor>> ParsePostProcessor(const json& object,
                                                                  const std::string& where) {
  absl::StatusOr<std::string> type = ReadType(object, where);
  if (!type.ok()) return type.status();
  if (*type == "TemplateProcessing") return ParseTemplate(object, where);
  // ByteLevel only trims offsets, which are not tracked here.
  if (*type == "ByteLevel") return std::make_unique<NoopPostProcessor>();
  if (*type == "BertProcessing" || *type == "RobertaProcessing") return ParseClsSep(object, where);
  if (*type == "Sequence") {
    absl::StatusOr<const json*> array = ReadArray(object, "processors", where);
    if (!array.ok()) return array.status();
    std::vector<std::unique_ptr<PostProcessor>> steps;
    for (size_t i = 0; i < (*array)->size(); ++i) {
      auto step = ParsePostProcessor((**array)[i], absl::StrCat(where, ".processors[", i, "]"));
      if (!step.ok()) return step.status();
      steps.push_back(*std::move(step));
    }
    return std::make_unique<SequencePostProcessor>(std::move(steps));
  }
  return Unknown("post_processor", *type, where);
}

absl::StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const json& object,
                                                      const std::string& where) {
  absl::StatusOr<std::string> type = ReadType(object, where);
  if (!type.ok()) return type.status();
  if (*type == "Sequence") {
    absl::StatusOr<const json*> array = ReadArray(object, "decoders", where);
    if (!array.ok()) return array.status();
    std::vector<std::unique_ptr<Decoder>> steps;
    for (size_t i = 0; i < (*array)->size(); ++i) {
      auto step = ParseDecoder((**array)[i], absl::StrCat(where, ".decoders[", i, "]"));
      if (!step.ok()) return step.status();
      steps.push_back(*std::move(step));
    }
    return std::make_unique<SequenceDecoder>(std::move(steps));
  }
  if (*type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (*type == "Metaspace") {
    absl::StatusOr<MetaspaceConfig> config = ReadMetaspace(object, where);
    if (!config.ok()) return config.status();
    return std::make_unique<MetaspaceDecoder>(*std::move(config));
  }
  if (*type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (*type == "Fuse") return std::make_unique<FuseDecoder>();
  if (*type == "Strip") {
    std::string content = " ";
    int64_t start = 0, stop = 0;
    RETURN_IF_ERROR(ReadChar(object, "content", where, &content));
    RETURN_IF_ERROR(ReadInt(object, "start", where, &start));
    RETURN_IF_ERROR(ReadInt(object, "stop", where, &stop));
    return std::make_unique<StripDecoder>(std::move(content), start, stop);
  }
  if (*type == "Replace") {
    auto pattern = ReadPattern(object, where);
    if (!pattern.ok()) return pattern.status();
    std::string content;
    RETURN_IF_ERROR(ReadString(object, "content", where, &content));
    return std::make_unique<ReplaceDecoder>(*std::move(pattern), std::move(content));
  }
  if (*type == "BPEDecoder") {
    std::string suffix = "</w>";
    RETURN_IF_ERROR(ReadString(object, "suffix", where, &suffix));
    return std::make_unique<BpeSuffixDecoder>(std::move(suffix));
  }
  return Unknown("decoder", *type, where);
}

}  // namespace conveyor::hf
