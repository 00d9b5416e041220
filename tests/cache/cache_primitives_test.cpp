// The device's publish of a slot's state byte: a 32-bit compare-exchange on the word holding the
// byte (detail::store_byte_in_word). The helper is host-and-device code over cuda::atomic_ref, so
// the host runs the very function the device runs and shows what it writes.

#include "embcache/detail/cache_primitives.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <thread>
#include <vector>

namespace embcache {
namespace {

std::uint8_t* bytes_of(std::array<std::uint32_t, 2>& words) {
  return reinterpret_cast<std::uint8_t*>(words.data());
}

TEST(cache_primitives, store_byte_in_word_changes_exactly_its_byte) {
  for (std::size_t i = 0; i < 8; ++i) {
    std::array<std::uint32_t, 2> words{0xa1b2c3d4u, 0x11223344u};
    detail::store_byte_in_word(bytes_of(words), i, 0x5e, cuda::std::memory_order_release);
    std::array<std::uint32_t, 2> expected{0xa1b2c3d4u, 0x11223344u};
    const std::size_t w = i / 4;
    const unsigned shift = 8 * static_cast<unsigned>(i % 4);  // little-endian, as the loads read
    expected[w] = (expected[w] & ~(0xffu << shift)) | (0x5eu << shift);
    EXPECT_EQ(words[0], expected[0]) << "byte " << i;
    EXPECT_EQ(words[1], expected[1]) << "byte " << i;
    EXPECT_EQ(bytes_of(words)[i], 0x5e) << "byte " << i;
  }
}

TEST(cache_primitives, store_byte_in_word_writes_zero_and_ff) {
  std::array<std::uint32_t, 2> words{0xffffffffu, 0u};
  detail::store_byte_in_word(bytes_of(words), 2, 0x00, cuda::std::memory_order_release);
  detail::store_byte_in_word(bytes_of(words), 5, 0xff, cuda::std::memory_order_release);
  EXPECT_EQ(words[0], 0xff00ffffu);
  EXPECT_EQ(words[1], 0x0000ff00u);
}

TEST(cache_primitives, store_state_release_reads_back_through_load_state_acquire) {
  std::array<std::uint32_t, 2> words{0u, 0u};
  for (std::size_t s = 0; s < 8; ++s)
    detail::store_state_release(bytes_of(words), s, static_cast<std::uint8_t>(0x80 + s));
  for (std::size_t s = 0; s < 8; ++s)
    EXPECT_EQ(detail::load_state_acquire(bytes_of(words), s), 0x80 + s) << "slot " << s;
  EXPECT_EQ(detail::load_state_group_acquire(bytes_of(words)), 0x8786858483828180ULL);
}

// Four threads store into the four bytes of one word at once: every store keeps the others' bytes
// (a plain read-modify-write of the word would lose some), so each byte ends at its last value.
TEST(cache_primitives, concurrent_byte_stores_into_one_word_lose_nothing) {
  std::array<std::uint32_t, 2> words{0u, 0u};
  constexpr int rounds = 20000;
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < 4; ++i) {
    threads.emplace_back([&words, i] {
      for (int r = 1; r <= rounds; ++r) {
        detail::store_byte_in_word(bytes_of(words), i, static_cast<std::uint8_t>(r + 16 * i),
                                   cuda::std::memory_order_release);
        const std::uint32_t word =
            detail::atomic_load(words.data(), cuda::std::memory_order_acquire);
        const auto seen = static_cast<std::uint8_t>(word >> (8 * i));
        ASSERT_EQ(seen, static_cast<std::uint8_t>(r + 16 * i)) << "byte " << i << " round " << r;
      }
    });
  }
  for (auto& t : threads) t.join();
  std::uint32_t expected = 0;
  for (unsigned i = 0; i < 4; ++i)
    expected |= std::uint32_t{static_cast<std::uint8_t>(rounds + 16 * i)} << (8 * i);
  EXPECT_EQ(words[0], expected);
  EXPECT_EQ(words[1], 0u);
}

}  // namespace
}  // namespace embcache
