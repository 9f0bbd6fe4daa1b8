// The interpreter's str methods against Python's own, on every code point and on strings
// whose case mapping depends on context: tests/jinja_ref/str_reference.py writes what the
// local Python answers (upper, lower, title, swapcase, capitalize; isalpha, islower,
// isupper, isprintable, isspace), and every answer must match. Code points that Unicode
// assigned after the Python's version are left out (ICU may be newer); so are isdigit and
// friends, which stay ASCII by design.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/utf8.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "text/jinja/chat_template.h"
#include "text/jinja/text.h"
#include "text/unicode.h"

namespace conveyor::jinja {
namespace {

std::string Utf8(const std::u32string& cps) {
  std::string out;
  for (char32_t c : cps) AppendUtf8(c, &out);
  return out;
}

// "41.3c3" -> "AΣ"; "=" -> `self`; "-" -> "".
std::string Mapping(const std::string& field, const std::string& self) {
  if (field == "=") return self;
  std::u32string cps;
  if (field != "-") {
    std::istringstream hexes(field);
    std::string hex;
    while (std::getline(hexes, hex, '.')) {
      cps.push_back(static_cast<char32_t>(std::stoul(hex, nullptr, 16)));
    }
  }
  return Utf8(cps);
}

// "5.0.1" / "14.0.0" -> 500 / 1400, as unicode::AgeOf.
int Version(const std::string& text) {
  int major = 0, minor = 0;
  if (std::sscanf(text.c_str(), "%d.%d", &major, &minor) != 2) return 0;
  return major * 100 + minor;
}

// Characters whose Lowercase property Unicode 15.0 added (Other_Lowercase: the Georgian
// and Latin modifier letters): an older Python says islower() False. Their other answers
// are compared.
bool LowercaseSince15(char32_t c) {
  return c == 0x10FC || (c >= 0xA7F2 && c <= 0xA7F4) || c == 0xAB69;
}

std::string Hex(const std::string& utf8) {
  std::string out;
  for (char32_t c : text::Decode(utf8)) {
    char buf[16];
    std::snprintf(buf, sizeof(buf), "%sU+%04X", out.empty() ? "" : " ", static_cast<unsigned>(c));
    out += buf;
  }
  return out;
}

TEST(StrUnicodeTest, EveryCodePointAndContextStringMatchesPython) {
  const std::string command =
      std::string("/usr/bin/python3 ") + CONVEYOR_JINJA_REF_DIR + "/str_reference.py";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr) << command;
  absl::StatusOr<std::unique_ptr<ChatTemplate>> flags_template = ChatTemplate::Parse(
      "{{ 'a' if s.isalpha() }}{{ 'l' if s.islower() }}{{ 'u' if s.isupper() }}"
      "{{ 's' if s.isspace() }}");
  ASSERT_TRUE(flags_template.ok()) << flags_template.status();

  int python_version = 0;
  int checked_chars = 0, skipped_chars = 0, checked_strings = 0;
  std::vector<std::string> mismatches;
  auto expect = [&](const std::string& what, const std::string& input, const std::string& got,
                    const std::string& want) {
    if (got == want) return;
    if (mismatches.size() < 40) {
      mismatches.push_back(what + "(" + Hex(input) + "): got [" + Hex(got) + "], Python [" +
                           Hex(want) + "]");
    } else if (mismatches.size() == 40) {
      mismatches.emplace_back("...");
    }
  };
  char buffer[4096];
  while (std::fgets(buffer, sizeof(buffer), pipe) != nullptr) {
    const std::string line(buffer);
    std::istringstream fields(line);
    std::vector<std::string> f;
    for (std::string field; fields >> field;) f.push_back(field);
    if (f.empty()) continue;
    if (f[0] == "version") {
      python_version = Version(f[1]);
      continue;
    }
    ASSERT_GT(python_version, 0) << "no version line first";
    if (f[0] == "c") {
      ASSERT_EQ(f.size(), 7u) << line;
      const char32_t c = static_cast<char32_t>(std::stoul(f[1], nullptr, 16));
      if (unicode::AgeOf(c) > python_version) {
        ++skipped_chars;
        continue;
      }
      ++checked_chars;
      const std::string s = Utf8(std::u32string(1, c));
      expect("upper", s, text::Upper(s), Mapping(f[2], s));
      expect("lower", s, text::Lower(s), Mapping(f[3], s));
      expect("title", s, text::Title(s), Mapping(f[4], s));
      expect("swapcase", s, text::SwapCase(s), Mapping(f[5], s));
      std::string flags;
      if (text::IsAlpha(c)) flags += 'a';
      if (text::IsLower(c) && !(python_version < 1500 && LowercaseSince15(c))) flags += 'l';
      if (text::IsUpper(c)) flags += 'u';
      if (text::IsPrintable(c)) flags += 'p';
      if (text::IsSpace(c)) flags += 's';
      expect("flags", s, flags.empty() ? "-" : flags, f[6]);
    } else if (f[0] == "s") {
      ASSERT_EQ(f.size(), 8u) << line;
      ++checked_strings;
      const std::string s = Mapping(f[1], "");
      expect("upper", s, text::Upper(s), Mapping(f[2], s));
      expect("lower", s, text::Lower(s), Mapping(f[3], s));
      expect("title", s, text::Title(s), Mapping(f[4], s));
      expect("capitalize", s, text::Capitalize(s), Mapping(f[5], s));
      expect("swapcase", s, text::SwapCase(s), Mapping(f[6], s));
      // The string methods as templates call them (isprintable is not one of them).
      std::string want = f[7];
      want.erase(std::remove(want.begin(), want.end(), 'p'), want.end());
      absl::StatusOr<std::string> got = (*flags_template)->Render(nlohmann::json{{"s", s}});
      ASSERT_TRUE(got.ok()) << got.status();
      expect("is*", s, got->empty() ? "-" : *got, want.empty() ? "-" : want);
    }
  }
  ASSERT_EQ(pclose(pipe), 0) << command;
  // Python's version is at most ICU's, so nearly every code point is compared.
  EXPECT_GT(checked_chars, 1'000'000);
  EXPECT_GE(checked_strings, 3000);
  std::string report;
  for (const std::string& m : mismatches) report += m + "\n";
  EXPECT_TRUE(mismatches.empty()) << report;
  std::printf("compared %d code points (%d assigned after Unicode %d.%d left out) and %d strings\n",
              checked_chars, skipped_chars, python_version / 100, python_version % 100,
              checked_strings);
}

}  // namespace
}  // namespace conveyor::jinja
