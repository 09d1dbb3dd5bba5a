// What a test may scale down when it runs under a sanitizer.
//
// ThreadSanitizer instruments every load and store, and AddressSanitizer every access it cannot
// prove safe: a test that copies and checks hundreds of MiB runs about ten times (TSan) or three
// times (ASan) slower than in the release build, and CI runs the whole suite under both on two
// cores. Neither needs the bytes: the same code paths, threads and interleavings run with fewer
// rounds and smaller buffers, and under TSan with fewer copies of a parameter matrix whose copies
// differ in no thread. Only a test's quantity is scaled, never what it checks; the release build
// keeps the full sizes.
#pragma once

namespace tcpx::testing {

#if defined(__SANITIZE_THREAD__)
inline constexpr bool kUnderThreadSanitizer = true;
#else
inline constexpr bool kUnderThreadSanitizer = false;
#endif

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kUnderAddressSanitizer = true;
#else
inline constexpr bool kUnderAddressSanitizer = false;
#endif

// `normal`, or `reduced` in a build under ThreadSanitizer or AddressSanitizer.
template <typename T>
constexpr T unless_sanitized(T normal, T reduced) {
    return kUnderThreadSanitizer || kUnderAddressSanitizer ? reduced : normal;
}

// `normal`, or `reduced` under ThreadSanitizer only.
template <typename T>
constexpr T unless_tsan(T normal, T reduced) {
    return kUnderThreadSanitizer ? reduced : normal;
}

}  // namespace tcpx::testing
