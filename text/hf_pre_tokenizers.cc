// The pre-tokenizers of an HF tokenizers pipeline (hf_tokenizer_components.h), with
// HF's NormalizedString::split behaviours they share.
#include "text/hf_tokenizer_components.h"

#include <algorithm>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/utf8.h"
#include "text/hf_stage_util.h"
#include "text/hf_tokenizer_text.h"

namespace conveyor::hf {
namespace {

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
        spaced.clear();
        spaced.push_back(' ');
        spaced.append(text.data(), text.size());
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

}  // namespace

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

}  // namespace conveyor::hf
