#include "common/utf8.h"

#include "gtest/gtest.h"

namespace conveyor {
namespace {

TEST(ValidUtf8Test, KeepsWellFormedText) {
  for (std::string_view s :
       {"", "plain", "h\xC3\xA9llo", "\xE4\xBD\xA0\xE5\xA5\xBD", "\xF0\x9F\x9A\x80 rocket"}) {
    EXPECT_EQ(ValidUtf8(s), s);
  }
}

TEST(ValidUtf8Test, ReplacesIllFormedBytes) {
  EXPECT_EQ(ValidUtf8("a\xE4\xBD"), "a\xEF\xBF\xBD\xEF\xBF\xBD");  // Truncated.
  EXPECT_EQ(ValidUtf8("\x80x"), "\xEF\xBF\xBDx");                  // Stray continuation.
  EXPECT_EQ(ValidUtf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");    // Overlong.
  EXPECT_EQ(ValidUtf8("\xED\xA0\x80"),                             // Surrogate.
            "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(ValidUtf8("\xF5\x80\x80\x80").size(), 12u);  // Above U+10FFFF.
}

}  // namespace
}  // namespace conveyor
