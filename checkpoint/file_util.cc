#include "checkpoint/file_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"

namespace conveyor {
namespace {

// The error `errno` describes, naming `path`; call right after the failing call.
absl::Status ErrnoError(const std::string& path, const char* action) {
  const int error = errno;
  return absl::ErrnoToStatus(error, absl::StrCat(path, ": cannot ", action));
}

}  // namespace

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  if (path.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError("a file path must not contain a NUL byte");
  }
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0 || !S_ISREG(info.st_mode)) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open (no such file)"));
  }
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  std::string text;
  char buffer[1 << 16];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof(buffer), file)) > 0) text.append(buffer, n);
  const bool failed = std::ferror(file) != 0;
  std::fclose(file);
  if (failed) return absl::DataLossError(absl::StrCat(path, ": read error"));
  return text;
}

absl::StatusOr<MappedFile> MappedFile::Map(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(path, "open");
  absl::Cleanup close_fd = [fd] { close(fd); };
  struct stat st;
  if (fstat(fd, &st) != 0) return ErrnoError(path, "stat");
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const auto size = static_cast<size_t>(st.st_size);
  if (size == 0) return MappedFile();  // mmap refuses an empty length.
  void* data = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (data == MAP_FAILED) return ErrnoError(path, "mmap");
  return MappedFile(data, size);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) munmap(data_, size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) munmap(data_, size_);
}

float HalfToFloat(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t exponent = (half >> 10) & 0x1fu;
  const uint32_t mantissa = half & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {  // Inf or NaN; the NaN payload is kept.
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {  // Normal: rebias the exponent from 15 to 127.
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else {  // Zero or subnormal: mantissa * 2^-24, exact in float.
    bits = sign | std::bit_cast<uint32_t>(static_cast<float>(mantissa) * 0x1p-24f);
  }
  return std::bit_cast<float>(bits);
}

uint16_t FloatToHalf(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  bits &= 0x7fffffffu;
  if (bits >= 0x47800000u) {  // 2^16 or more, Inf or NaN: Inf, or a quiet NaN.
    return sign | (bits > 0x7f800000u ? 0x7e00u : 0x7c00u);
  }
  if (bits < 0x38800000u) {  // Below 2^-14: a subnormal half (or zero).
    // Adding 0.5 puts the half's 10 mantissa bits at the bottom of the float's, the
    // float addition rounding to nearest, ties to even, as the conversion must.
    const float aligned = std::bit_cast<float>(bits) + 0.5f;
    return sign | static_cast<uint16_t>(std::bit_cast<uint32_t>(aligned) - 0x3f000000u);
  }
  // Normal: rebias the exponent and round away the 13 low mantissa bits, ties to even
  // (a carry out of the mantissa bumps the exponent, up to Inf past 65504).
  const uint32_t odd = (bits >> 13) & 1u;
  bits += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + odd;
  return sign | static_cast<uint16_t>(bits >> 13);
}

}  // namespace conveyor
