// Which sanitizer this test translation unit is built under (GCC defines __SANITIZE_*__, Clang
// answers __has_feature): EMBCACHE_TEST_ASAN (AddressSanitizer), EMBCACHE_TEST_TSAN
// (ThreadSanitizer), EMBCACHE_TEST_SANITIZED (either). Tests use them to skip what a sanitizer
// cannot run (address-space caps) or to keep a scale case to the unsanitized build.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define EMBCACHE_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMBCACHE_TEST_ASAN 1
#endif
#endif

#if defined(__SANITIZE_THREAD__)
#define EMBCACHE_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define EMBCACHE_TEST_TSAN 1
#endif
#endif

#if defined(EMBCACHE_TEST_ASAN) || defined(EMBCACHE_TEST_TSAN)
#define EMBCACHE_TEST_SANITIZED 1
#endif
