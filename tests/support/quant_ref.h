// What the tests that check quantized checkpoints against tests/quant_ref/'s numpy writers
// share (gptq_awq_model_test, fp8_model_test): running a writer on the llama3_gqa test
// model, and reading back what it wrote.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/test_temp_dir.h"
#include "gtest/gtest.h"
#include "tests/support/test_support.h"

namespace conveyor::testing {

// The checkpoint every writer starts from.
inline constexpr char kQuantRefVariant[] = "llama3_gqa";

inline std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// Runs tests/quant_ref/`script` --model <llama3_gqa> --out DIR/q --reference DIR/ref `args`
// with the test venv's Python; false after a failure saying why (the script's output).
inline bool RunQuantRefScript(const TestTempDir& dir, const std::string& script,
                              const std::string& args) {
  const char* venv = std::getenv("CONVEYOR_TEST_VENV");
  const std::string python = absl::StrCat(
      venv != nullptr && *venv != '\0' ? venv : "/opt/conveyor-test-venv", "/bin/python");
  if (!std::filesystem::exists(python)) {
    ADD_FAILURE() << "no Python with numpy and the gguf package at " << python
                  << "; run scripts/install-deps.sh (or set CONVEYOR_TEST_VENV)";
    return false;
  }
  const std::string source_root =
      std::filesystem::path(__FILE__).parent_path().parent_path().parent_path().string();
  const std::string log = dir.path() + "/make.log";
  const std::string command =
      absl::StrCat("'", python, "' '", source_root, "/tests/quant_ref/", script, "' --model '",
                   TestModelDir(kQuantRefVariant), "' --out '", dir.path(), "/q' --reference '",
                   dir.path(), "/ref' ", args, " > '", log, "' 2>&1");
  if (std::system(command.c_str()) != 0) {
    ADD_FAILURE() << command << " failed:\n" << ReadBytes(log);
    return false;
  }
  return true;
}

}  // namespace conveyor::testing
