#include "text/sentencepiece_tokenizer.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace conveyor {

// The shim's entry points (see sentencepiece_shim.cc).
struct SentencePieceTokenizer::Shim {
  void* (*load)(const char* path, char* error, size_t error_capacity);
  void (*free)(void* handle);
  long (*encode)(void* handle, const char* text, size_t length, int* ids, size_t capacity);
  long (*decode)(void* handle, const int* ids, size_t count, char* text, size_t capacity);
  long (*id_to_piece)(void* handle, int id, char* text, size_t capacity);
  int (*piece_size)(void* handle);
  int (*bos_id)(void* handle);
  int (*eos_id)(void* handle);
  int (*pad_id)(void* handle);
  int (*unk_id)(void* handle);
  int (*is_special)(void* handle, int id);
};

namespace {

std::vector<std::string> ShimCandidates() {
  std::vector<std::string> paths;
  if (const char* env = std::getenv("CONVEYOR_SPM_SHIM")) paths.emplace_back(env);
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) paths.push_back((exe.parent_path() / "libconveyor_spm_shim.so").string());
  paths.emplace_back(CONVEYOR_SPM_SHIM_BUILD_PATH);
  paths.emplace_back("libconveyor_spm_shim.so");
  return paths;
}

template <typename F>
bool Resolve(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  return *out != nullptr;
}

// Loads the shim once per process.
absl::StatusOr<const SentencePieceTokenizer::Shim*> LoadShim() {
  static absl::StatusOr<const SentencePieceTokenizer::Shim*> shim =
      []() -> absl::StatusOr<const SentencePieceTokenizer::Shim*> {
    std::string errors;
    for (const std::string& path : ShimCandidates()) {
      // RTLD_DEEPBIND: sentencepiece must bind to its own protobuf copy, not the process's.
      void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
      if (lib == nullptr) {
        absl::StrAppend(&errors, "\n  ", dlerror());
        continue;
      }
      auto* s = new SentencePieceTokenizer::Shim();
      if (Resolve(lib, "conveyor_spm_load", &s->load) &&
          Resolve(lib, "conveyor_spm_free", &s->free) &&
          Resolve(lib, "conveyor_spm_encode", &s->encode) &&
          Resolve(lib, "conveyor_spm_decode", &s->decode) &&
          Resolve(lib, "conveyor_spm_id_to_piece", &s->id_to_piece) &&
          Resolve(lib, "conveyor_spm_piece_size", &s->piece_size) &&
          Resolve(lib, "conveyor_spm_bos_id", &s->bos_id) &&
          Resolve(lib, "conveyor_spm_eos_id", &s->eos_id) &&
          Resolve(lib, "conveyor_spm_pad_id", &s->pad_id) &&
          Resolve(lib, "conveyor_spm_unk_id", &s->unk_id) &&
          Resolve(lib, "conveyor_spm_is_special", &s->is_special)) {
        return s;
      }
      delete s;
      absl::StrAppend(&errors, "\n  ", path, ": missing entry points");
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot load libconveyor_spm_shim.so (set CONVEYOR_SPM_SHIM to its path):", errors));
  }();
  return shim;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::Load(
    const std::string& path, const Options& options) {
  absl::StatusOr<const Shim*> shim = LoadShim();
  if (!shim.ok()) return shim.status();
  char error[512] = {0};
  void* handle = (*shim)->load(path.c_str(), error, sizeof(error));
  if (handle == nullptr) {
    // The shim reports "CODE:message" with sentencepiece's (absl-compatible) code; it
    // reports any failure to open as NOT_FOUND, anything else means an invalid model.
    const std::string text = error;
    const size_t colon = text.find(':');
    int code = 0;
    const bool parsed =
        colon != std::string::npos && absl::SimpleAtoi(text.substr(0, colon), &code);
    const std::string message = absl::StrCat(
        path, ": cannot load sentencepiece model: ", parsed ? text.substr(colon + 1) : text);
    return code == static_cast<int>(absl::StatusCode::kNotFound) ? absl::NotFoundError(message)
                                                                 : absl::DataLossError(message);
  }
  std::unique_ptr<SentencePieceTokenizer> tokenizer(new SentencePieceTokenizer(*shim, handle));
  SentencePieceTokenizer& t = *tokenizer;
  t.legacy_ = options.legacy;
  absl::flat_hash_set<std::string> seen;
  const int pieces = t.vocab_size();
  for (int id = 0; id < pieces; ++id) {
    if (!t.IsSpecial(id)) continue;
    std::string piece = t.Piece(id);
    if (!piece.empty() && seen.insert(piece).second) t.specials_.emplace_back(piece, id);
  }
  for (const auto& [content, id] : options.added_tokens) {
    if (!content.empty() && id >= 0 && id < pieces && seen.insert(content).second) {
      t.specials_.emplace_back(content, id);
    }
  }
  // Longest first: at one position the longest token wins, as in HF's trie.
  std::stable_sort(t.specials_.begin(), t.specials_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  for (const auto& special : t.specials_) {
    t.starts_special_[static_cast<unsigned char>(special.first[0])] = true;
  }
  if (const int unk = t.shim_->unk_id(t.handle_); unk >= 0 && unk < pieces) {
    t.unk_piece_ = t.Piece(unk);
    absl::StatusOr<std::vector<int>> unk_ids = t.EncodePieces(t.unk_piece_);
    if (unk_ids.ok()) t.unk_piece_ids_ = unk_ids->size();
  }
  return tokenizer;
}

SentencePieceTokenizer::~SentencePieceTokenizer() { shim_->free(handle_); }

absl::StatusOr<std::vector<int>> SentencePieceTokenizer::Encode(std::string_view text) const {
  std::vector<int> ids;
  size_t stretch = 0;  // Where the text since the last special token begins.
  size_t pos = 0;
  while (pos < text.size()) {
    if (!starts_special_[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    const auto special = std::find_if(specials_.begin(), specials_.end(), [&](const auto& s) {
      return text.substr(pos).starts_with(s.first);
    });
    if (special == specials_.end()) {
      ++pos;
      continue;
    }
    if (absl::Status s = EncodeStretch(text.substr(stretch, pos - stretch), stretch == 0, &ids);
        !s.ok()) {
      return s;
    }
    ids.push_back(special->second);
    pos += special->first.size();
    stretch = pos;
  }
  if (absl::Status s = EncodeStretch(text.substr(stretch), stretch == 0, &ids); !s.ok()) return s;
  return ids;
}

absl::Status SentencePieceTokenizer::EncodeStretch(std::string_view text, bool at_start,
                                                   std::vector<int>* ids) const {
  if (text.empty()) return absl::OkStatus();
  // HF's Metaspace pre-tokenizer: a stretch that starts with a space (or "▁") gets no
  // dummy prefix, nor does one after a special token unless legacy; sentencepiece would
  // add one, so those are encoded behind the unknown piece, whose ids are dropped.
  const bool starts_with_space = text.front() == ' ' || text.starts_with("\u2581");
  const bool behind_unk = (starts_with_space || (!legacy_ && !at_start)) && unk_piece_ids_ > 0;
  absl::StatusOr<std::vector<int>> encoded =
      behind_unk ? EncodePieces(unk_piece_ + std::string(text)) : EncodePieces(text);
  if (!encoded.ok()) return encoded.status();
  const size_t skip = behind_unk ? std::min(unk_piece_ids_, encoded->size()) : 0;
  ids->insert(ids->end(), encoded->begin() + static_cast<std::ptrdiff_t>(skip), encoded->end());
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int>> SentencePieceTokenizer::EncodePieces(std::string_view text) const {
  std::vector<int> ids(text.size() + 8);
  for (;;) {
    const long n = shim_->encode(handle_, text.data(), text.size(), ids.data(), ids.size());
    if (n < 0) return absl::InternalError("sentencepiece failed to encode the text");
    if (static_cast<size_t>(n) <= ids.size()) {
      ids.resize(n);
      return ids;
    }
    ids.resize(n);
  }
}

std::string SentencePieceTokenizer::Decode(const std::vector<int>& ids) const {
  const int piece_count = shim_->piece_size(handle_);
  std::vector<int> known_ids;
  known_ids.reserve(ids.size());
  for (int id : ids) {
    if (id >= 0 && id < piece_count) known_ids.push_back(id);
  }
  std::string text(16 * known_ids.size() + 16, '\0');
  for (;;) {
    // With every id in range, sentencepiece's Decode cannot fail.
    const long n =
        shim_->decode(handle_, known_ids.data(), known_ids.size(), text.data(), text.size());
    if (n < 0) return "";
    const bool fits = static_cast<size_t>(n) <= text.size();
    text.resize(n);
    if (fits) return text;
  }
}

std::string SentencePieceTokenizer::Piece(int id) const {
  if (id < 0 || id >= shim_->piece_size(handle_)) return "";
  std::string piece(64, '\0');
  for (;;) {
    const long n = shim_->id_to_piece(handle_, id, piece.data(), piece.size());
    const bool fits = static_cast<size_t>(n) <= piece.size();
    piece.resize(n);
    if (fits) return piece;
  }
}

int SentencePieceTokenizer::vocab_size() const { return shim_->piece_size(handle_); }

int SentencePieceTokenizer::bos_id() const { return shim_->bos_id(handle_); }

int SentencePieceTokenizer::eos_id() const { return shim_->eos_id(handle_); }

int SentencePieceTokenizer::pad_id() const { return shim_->pad_id(handle_); }

bool SentencePieceTokenizer::IsSpecial(int id) const {
  return id >= 0 && id < shim_->piece_size(handle_) && shim_->is_special(handle_, id) != 0;
}

absl::StatusOr<std::vector<int>> SentencePieceTokenizer::EncodeWithSpecialTokens(
    std::string_view text) const {
  absl::StatusOr<std::vector<int>> ids = Encode(text);
  if (ids.ok() && bos_id() >= 0) ids->insert(ids->begin(), bos_id());
  return ids;
}

}  // namespace conveyor
