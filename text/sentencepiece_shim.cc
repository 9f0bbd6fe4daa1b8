// A C interface to sentencepiece, built as its own shared library and loaded by
// sentencepiece_tokenizer.cc with RTLD_DEEPBIND.
//
// Why: Debian's libsentencepiece carries a private copy of protobuf-lite 3.14 and exports
// its symbols, which collide with libprotobuf 3.21 that gRPC needs; a process linking
// both crashes at start-up, or aborts on the version check. Loaded this way, sentencepiece
// binds to its own protobuf copy first and its symbols never enter the global scope.
// Only plain C types cross this boundary.
#include <cstring>
#include <string>
#include <vector>

#include "text/sentencepiece_compat.h"

namespace {

using Processor = sentencepiece::SentencePieceProcessor;

// Copies `text` into `out` if it fits; returns its size either way. The caller sizes its
// buffer by the returned length: no terminating NUL is written.
size_t CopyOut(const std::string& text, char* out, size_t capacity) {
  // NOLINTNEXTLINE(bugprone-not-null-terminated-result): length-delimited, see above.
  if (text.size() <= capacity) std::memcpy(out, text.data(), text.size());
  return text.size();
}

}  // namespace

extern "C" {

// Loads a model; on failure returns null and writes "CODE:message" to `error`.
void* conveyor_spm_load(const char* path, char* error, size_t error_capacity) {
  auto* sp = new Processor();
  const sentencepiece::util::Status status = sp->Load(path);
  if (status.ok()) return sp;
  const std::string message =
      std::to_string(static_cast<int>(status.code())) + ":" + status.message();
  std::snprintf(error, error_capacity, "%s", message.c_str());
  delete sp;
  return nullptr;
}

void conveyor_spm_free(void* handle) { delete static_cast<Processor*>(handle); }

// Encodes text into ids; returns the number of ids (written only if <= capacity), or
// -1 on failure.
long conveyor_spm_encode(void* handle, const char* text, size_t length, int* ids, size_t capacity) {
  std::vector<int> out;
  if (!static_cast<Processor*>(handle)->Encode(std::string(text, length), &out).ok()) return -1;
  if (out.size() <= capacity) std::memcpy(ids, out.data(), out.size() * sizeof(int));
  return static_cast<long>(out.size());
}

// Decodes ids (all in range) into text; returns its size (written only if it fits), or
// -1 on failure.
long conveyor_spm_decode(void* handle, const int* ids, size_t count, char* text, size_t capacity) {
  std::string out;
  if (!static_cast<Processor*>(handle)->Decode(std::vector<int>(ids, ids + count), &out).ok()) {
    return -1;
  }
  return static_cast<long>(CopyOut(out, text, capacity));
}

// Writes the piece string of `id` (e.g. "▁world", "<0xE4>"); returns its size (written
// only if it fits).
long conveyor_spm_id_to_piece(void* handle, int id, char* text, size_t capacity) {
  return static_cast<long>(CopyOut(static_cast<Processor*>(handle)->IdToPiece(id), text, capacity));
}

int conveyor_spm_piece_size(void* handle) {
  return static_cast<Processor*>(handle)->GetPieceSize();
}
int conveyor_spm_bos_id(void* handle) { return static_cast<Processor*>(handle)->bos_id(); }
int conveyor_spm_eos_id(void* handle) { return static_cast<Processor*>(handle)->eos_id(); }
int conveyor_spm_pad_id(void* handle) { return static_cast<Processor*>(handle)->pad_id(); }
int conveyor_spm_unk_id(void* handle) { return static_cast<Processor*>(handle)->unk_id(); }

// Whether `id` (in range) is a control or the unknown piece: what callers treat as special.
int conveyor_spm_is_special(void* handle, int id) {
  const auto* sp = static_cast<Processor*>(handle);
  return sp->IsControl(id) || sp->IsUnknown(id) ? 1 : 0;
}

}  // extern "C"
