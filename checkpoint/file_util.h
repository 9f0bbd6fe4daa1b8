// Reading the small text files of a model directory (config.json, the shard index) from
// paths that may come over the wire (a worker's Init carries the model path).
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace conveyor {

// The whole of the regular file at `path`. NOT_FOUND when there is none (a directory is
// not a file); INVALID_ARGUMENT for a path with a NUL byte, which the C library would cut
// short and so open another file than the one named; DATA_LOSS when reading fails.
// Never throws (std::ifstream's buffer throws on a read error such as EISDIR).
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

}  // namespace conveyor
