#include <gtest/gtest.h>

#include "genie/units.h"

namespace genie {
namespace {

TEST(ParseByteSize, PlainAndSuffixed) {
  EXPECT_EQ(*parseByteSize("0"), 0u);
  EXPECT_EQ(*parseByteSize("1024"), 1024u);
  EXPECT_EQ(*parseByteSize("64K"), 64u << 10);
  EXPECT_EQ(*parseByteSize("1m"), 1u << 20);
  EXPECT_EQ(*parseByteSize("16G"), uint64_t{16} << 30);
  EXPECT_EQ(*parseByteSize("2T"), uint64_t{2} << 40);
}

TEST(ParseByteSize, IecAndSiUnits) {
  EXPECT_EQ(*parseByteSize("64MiB"), uint64_t{64} << 20);
  EXPECT_EQ(*parseByteSize("64M"), *parseByteSize("64MiB"));
  EXPECT_EQ(*parseByteSize("64MB"), 64'000'000u);
  EXPECT_EQ(*parseByteSize("64mb"), 64'000'000u);
  EXPECT_EQ(*parseByteSize("1KiB"), 1024u);
  EXPECT_EQ(*parseByteSize("1kB"), 1000u);
  EXPECT_EQ(*parseByteSize("3GiB"), uint64_t{3} << 30);
  EXPECT_EQ(*parseByteSize("3GB"), 3'000'000'000u);
  EXPECT_EQ(*parseByteSize("2TiB"), uint64_t{2} << 40);
  EXPECT_EQ(*parseByteSize("2TB"), 2'000'000'000'000u);
  EXPECT_EQ(*parseByteSize("512B"), 512u);
  EXPECT_EQ(*parseByteSize("0GiB"), 0u);
}

TEST(ParseByteSize, RefusesWhatIsNotASize) {
  for (const char* bad : {"", "K", "12Q", "-1", "1.5G", "1 G", "99999999999999999999", "20000000000T", "64MiBs",
                          "64iB", "MiB64", "20000000000000TB", "0x10"}) {
    auto parsed = parseByteSize(bad);
    ASSERT_FALSE(parsed.isOk()) << bad;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find(std::string("'") + bad + "'"), std::string::npos) << parsed.status().message();
  }
}

}  // namespace
}  // namespace genie
