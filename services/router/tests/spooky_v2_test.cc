#include "spooky_v2.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

using musku::router::SpookyV2Hash128;
using musku::router::SpookyV2Hash32;
using musku::router::SpookyV2Hash64;

namespace {

// Published SpookyV2 results (Jenkins' TestResults): Hash32 of buf[0..i) with buf[j] = j+128,
// seed 0. Indices chosen to cover every short-path remainder class and the long path
// (>= 192 bytes: one, two and five 96-byte blocks plus partial tails).
struct Known {
  std::size_t len;
  std::uint32_t hash;
};
constexpr Known kKnown32[] = {
    {0, 0x6bf50919},   {1, 0x70de1d26},   {2, 0xa2b37298},   {3, 0x35bc5fbf},
    {4, 0x8223b279},   {5, 0x5bcb315e},   {6, 0x53fe88a1},   {7, 0xf9f1a233},
    {8, 0xee193982},   {9, 0x54f86f29},   {10, 0xc8772d36},  {11, 0x9ed60886},
    {12, 0x5f23d1da},  {13, 0x1ed9f474},  {14, 0xf2ef0c89},  {15, 0x83ec01f9},
    {16, 0xf274736c},  {17, 0x7e9ac0df},  {18, 0xc7aed250},  {19, 0xb1015811},
    {60, 0x1cd6a5a2},  {61, 0x197b402e},  {62, 0xc28d0d2b},  {63, 0x09c1afb4},
    {64, 0x069c8bb7},  {65, 0x6f9d4e1e},  {66, 0xd2621b5c},  {67, 0xea68108d},
    {128, 0x94e948ec}, {129, 0xd358d448}, {130, 0xeca7814d}, {131, 0x78cd7950},
    {188, 0xe715b13a}, {189, 0x0394c3b2}, {190, 0x11efbbae}, {191, 0xe13d9e19},
    {192, 0x77e012bd}, {193, 0x2d05114c}, {194, 0xaecf2ddd}, {195, 0xb2a2b4aa},
    {252, 0x4d42096f}, {253, 0xd6e9456a}, {254, 0x0bade318}, {255, 0x2f40ee0b},
    {256, 0x38cebf03}, {257, 0x0cbc2e72}, {258, 0xbf03e704}, {259, 0x7b3e7a9a},
    {508, 0x918fa7c9}, {509, 0xaf2e2cd9}, {510, 0x82046f8e}, {511, 0xcc1c8250},
};

TEST(SpookyV2, PublishedHash32Table) {
  std::vector<unsigned char> buf(512);
  for (std::size_t j = 0; j < buf.size(); ++j) buf[j] = static_cast<unsigned char>(j + 128);
  for (const Known& k : kKnown32) {
    EXPECT_EQ(SpookyV2Hash32(buf.data(), k.len, 0), k.hash) << "length " << k.len;
  }
}

TEST(SpookyV2, PublishedHash128Vectors) {
  const char* msg1 = "Hello World!!";
  auto h = SpookyV2Hash128(msg1, std::strlen(msg1), 123, 0);
  EXPECT_EQ(h.h1, 0xd89b808bd353c2ecULL);
  EXPECT_EQ(h.h2, 0x9bede9164600e157ULL);
  EXPECT_EQ(SpookyV2Hash64(msg1, std::strlen(msg1), 123), 0x78ed9000d7605b78ULL);
  const char* msg2 =
      "DAKARA ONE TWO THREE DE ARUKIDASE\nKYOU MO ASHITA MO KINOU MO KAWARANAI\n"
      "NARABA ONE TWO THREE DE ARUKIDASE\nMAWARU SEKAI TO GYAKU MUKI DE";
  h = SpookyV2Hash128(msg2, std::strlen(msg2), 0, 0);
  EXPECT_EQ(h.h1, 0xf4c773c08b934657ULL);
  EXPECT_EQ(h.h2, 0xe898100932d7fa1cULL);
}

TEST(SpookyV2, AlignmentIndependent) {
  // The same bytes at every offset of a buffer hash the same (short and long path).
  for (std::size_t len : {0u, 5u, 31u, 47u, 191u, 192u, 300u, 1000u}) {
    std::vector<unsigned char> ref(len);
    for (std::size_t i = 0; i < len; ++i) ref[i] = static_cast<unsigned char>(i * 7 + 1);
    const auto want = SpookyV2Hash128(ref.data(), len, 1, 2);
    std::vector<unsigned char> big(len + 16);
    for (std::size_t off = 1; off < 9; ++off) {
      if (len != 0) std::memcpy(big.data() + off, ref.data(), len);
      const auto got = SpookyV2Hash128(big.data() + off, len, 1, 2);
      EXPECT_EQ(got.h1, want.h1);
      EXPECT_EQ(got.h2, want.h2);
    }
  }
}

TEST(SpookyV2, SeedsAndSingleBitChangesMatter) {
  std::string s(250, 'x');
  const auto base = SpookyV2Hash128(s);
  EXPECT_NE(SpookyV2Hash128(s, 1, 0).h1, base.h1);
  EXPECT_NE(SpookyV2Hash128(s, 0, 1).h1, base.h1);
  for (std::size_t i = 0; i < s.size(); i += 17) {
    std::string t = s;
    t[i] ^= 1;
    EXPECT_NE(SpookyV2Hash128(t).h1, base.h1) << i;
  }
}

}  // namespace
