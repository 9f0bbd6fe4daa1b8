// Differential test: the C++ interpreter against Python's jinja2 configured as Hugging
// Face transformers configures it. tests/jinja_ref/make_cases.py renders every case with
// jinja2 into a temporary directory; each case must render byte for byte the same here,
// fail where jinja2 fails (with the same message for raise_exception), and fail to parse
// where jinja2 fails to compile.
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "text/jinja/chat_template.h"

namespace conveyor::jinja {
namespace {

using Json = nlohmann::ordered_json;

// The Python that has jinja2: the test venv (scripts/install-deps.sh) or Debian's.
std::string FindPython() {
  std::vector<std::string> candidates;
  if (const char* venv = std::getenv("CONVEYOR_TEST_VENV")) {
    candidates.emplace_back(std::string(venv) + "/bin/python");
  }
  candidates.emplace_back("/opt/conveyor-test-venv/bin/python");
  candidates.emplace_back("/usr/bin/python3");
  for (const std::string& python : candidates) {
    if (std::system(("'" + python + "' -c 'import jinja2' >/dev/null 2>&1").c_str()) == 0) {
      return python;
    }
  }
  return "";
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

// Shows control characters, so that whitespace differences are visible in a failure.
std::string Visible(const std::string& s) { return Json(s).dump(); }

class JinjaDifferentialTest : public testing::Test {
 protected:
  // Renders the reference cases once for the whole suite.
  static void SetUpTestSuite() {
    const std::string python = FindPython();
    if (python.empty()) {
      setup_error_ =
          "no Python with jinja2 found (tried $CONVEYOR_TEST_VENV, /opt/conveyor-test-venv, "
          "/usr/bin/python3): run scripts/install-deps.sh";
      return;
    }
    const std::string out_dir = testing::TempDir() + "jinja_ref_cases";
    const std::string log = out_dir + ".log";
    const std::string command = "'" + python + "' '" CONVEYOR_JINJA_REF_DIR "/make_cases.py' '" +
                                out_dir + "' >'" + log + "' 2>&1";
    if (std::system(command.c_str()) != 0) {
      setup_error_ = "make_cases.py failed (run scripts/install-deps.sh if jinja2 is missing): " +
                     ReadAll(log);
      return;
    }
    cases_ = Json::parse(ReadAll(out_dir + "/cases.json"), nullptr, /*allow_exceptions=*/false);
    if (cases_.is_discarded() || !cases_.contains("cases")) {
      setup_error_ = "make_cases.py wrote no readable cases.json in " + out_dir;
    }
  }

  static std::string setup_error_;
  static Json cases_;
};

std::string JinjaDifferentialTest::setup_error_;
Json JinjaDifferentialTest::cases_;

TEST_F(JinjaDifferentialTest, MatchesPythonJinja2) {
  ASSERT_TRUE(setup_error_.empty()) << setup_error_;
  std::map<std::string, std::unique_ptr<ChatTemplate>> parsed;
  std::map<std::string, std::string> parse_errors;
  int checked = 0, passed = 0;
  for (const Json& c : cases_["cases"]) {
    const std::string name = c["name"];
    const std::string source = c["template"];
    const Json& expect = c["expect"];
    ++checked;
    if (!parsed.count(source) && !parse_errors.count(source)) {
      absl::StatusOr<std::unique_ptr<ChatTemplate>> t = ChatTemplate::Parse(source);
      if (t.ok()) {
        parsed[source] = *std::move(t);
      } else {
        parse_errors[source] = absl::StrCat(t.status().message());
      }
    }
    std::string failure;
    if (expect.contains("parse_error")) {
      if (!parse_errors.count(source)) {
        failure = "jinja2 rejects the template (" + expect["parse_error"].get<std::string>() +
                  ") but it parsed";
      }
    } else if (parse_errors.count(source)) {
      failure = "parse failed: " + parse_errors[source];
    } else {
      const absl::StatusOr<std::string> out = parsed[source]->Render(c["context"]);
      if (expect.contains("output")) {
        const std::string want = expect["output"];
        if (!out.ok()) {
          failure = "render failed: " + absl::StrCat(out.status().message()) +
                    "\n  jinja2 renders " + Visible(want);
        } else if (*out != want) {
          failure = "output differs\n  jinja2: " + Visible(want) + "\n  C++   : " + Visible(*out);
        }
      } else if (expect.contains("raise")) {
        const std::string want = expect["raise"];
        if (out.ok()) {
          failure = "rendered " + Visible(*out) + " but jinja2 raises " + Visible(want);
        } else if (out.status().code() != absl::StatusCode::kInvalidArgument ||
                   out.status().message() != want) {
          failure = "raise_exception message differs\n  jinja2: " + Visible(want) +
                    "\n  C++   : " + Visible(absl::StrCat(out.status().message()));
        }
      } else if (out.ok()) {
        failure = "rendered " + Visible(*out) +
                  " but jinja2 fails: " + expect["error"].get<std::string>();
      } else if (out.status().code() != absl::StatusCode::kInvalidArgument) {
        failure = "failed with the wrong code: " + out.status().ToString();
      }
    }
    if (failure.empty()) {
      ++passed;
    } else {
      ADD_FAILURE() << name << ": " << failure << "\n  template: " << Visible(source)
                    << "\n  context: " << c["context"].dump();
    }
  }
  EXPECT_GE(checked, 200) << "too few reference cases";
  std::cout << passed << " of " << checked << " cases identical to jinja2 "
            << cases_.value("jinja2_version", "?") << "\n";
}

}  // namespace
}  // namespace conveyor::jinja
