// A fresh directory under the test temp dir, removed with everything in it when the
// object goes away. For tests only.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "gtest/gtest.h"

namespace conveyor {

class TestTempDir {
 public:
  TestTempDir() {
    std::string pattern = testing::TempDir() + "conveyor_test_XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) ADD_FAILURE() << "mkdtemp failed for " << pattern;
    path_ = pattern;
  }
  ~TestTempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TestTempDir(const TestTempDir&) = delete;
  TestTempDir& operator=(const TestTempDir&) = delete;

  const std::string& path() const { return path_; }

  // Writes `contents` to `<path()>/<name>` and returns the file's path.
  std::string WriteFile(const std::string& name, std::string_view contents) const {
    std::string file = path_ + "/" + name;
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
    if (!out) ADD_FAILURE() << "cannot write " << file;
    return file;
  }

 private:
  std::string path_;
};

}  // namespace conveyor
