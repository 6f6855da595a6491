// Reading numeric settings from the environment (once, when a Device opens).
#pragma once
#include <cstdint>
#include <cstdlib>
#include <string>

#include "errors.hpp"

namespace pwt {

// A non-negative integer from the variable `name`; `fallback` when unset or empty.
inline uint64_t env_count(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  if (*end || *v == '-') throw ArgumentError(std::string(name) + " must be a non-negative integer, got '" + v + "'");
  return n;
}

}  // namespace pwt
