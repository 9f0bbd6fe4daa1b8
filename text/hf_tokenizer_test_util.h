// For tests only: makes reference tokenizer.json files and expected ids with HF's
// `tokenizers` package, by running tests/tokenizer_ref/make_tokenizers.py (or
// tests/gguf_ref/make_gguf_tokenizers.py for GGUF files) with the test venv's Python
// ($CONVEYOR_TEST_VENV, else /opt/conveyor-test-venv; made by scripts/install-deps.sh). Without
// that Python the calling test fails, saying so: a missing reference must never pass silently.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/test_temp_dir.h"
#include "gtest/gtest.h"

namespace conveyor {

// The repository root, from this header's own path.
inline std::string SourceRoot() {
  return std::filesystem::path(__FILE__).parent_path().parent_path().string();
}

// Runs the reference script `script` (relative to the repository root) with the test
// venv's Python, `--corpus tests/model_gen/corpus.txt --out <dir>` and extra `flags`;
// false, after adding a failure that says why, when it cannot.
inline bool RunTokenizerReferenceScript(const TestTempDir& dir, const std::string& script,
                                        const std::string& flags) {
  const char* venv = std::getenv("CONVEYOR_TEST_VENV");
  const std::string python = absl::StrCat(
      venv != nullptr && *venv != '\0' ? venv : "/opt/conveyor-test-venv", "/bin/python");
  if (!std::filesystem::exists(python)) {
    ADD_FAILURE() << "no Python with HF tokenizers at " << python
                  << "; run scripts/install-deps.sh (or set CONVEYOR_TEST_VENV)";
    return false;
  }
  const std::string root = SourceRoot();
  const std::string log = dir.path() + "/reference_script.log";
  const std::string command = absl::StrCat("'", python, "' '", root, "/", script, "' --corpus '",
                                           root, "/tests/model_gen/corpus.txt' --out '", dir.path(),
                                           "' ", flags, " > '", log, "' 2>&1");
  if (std::system(command.c_str()) != 0) {
    std::ifstream in(log);
    std::ostringstream output;
    output << in.rdbuf();
    ADD_FAILURE() << command << " failed:\n" << output.str();
    return false;
  }
  return true;
}

// Runs make_tokenizers.py into `dir` with extra `flags` (e.g. "--tokenizers llama3
// --strings 50 --sweeps no").
inline bool MakeTokenizerReference(const TestTempDir& dir, const std::string& flags) {
  return RunTokenizerReferenceScript(dir, "tests/tokenizer_ref/make_tokenizers.py", flags);
}

}  // namespace conveyor
