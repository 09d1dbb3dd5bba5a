// Shared by the fuzz targets: a check that stops the run (libFuzzer saves the input) when an
// invariant of a decoder breaks. assert() would vanish in a release-type build.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string_view>

#define FUZZ_CHECK(cond)                                                                       \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            std::fprintf(stderr, "%s:%d: fuzz check failed: %s\n", __FILE__, __LINE__, #cond); \
            std::abort();                                                                      \
        }                                                                                      \
    } while (0)

inline std::string_view as_view(const uint8_t* data, size_t size) {
    return {reinterpret_cast<const char*>(data), size};
}
