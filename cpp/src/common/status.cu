// mb_last_error(): the thread-local one-line message of the last failed entry point. Each
// host thread (e.g. TensorRT's enqueue threads) sees only its own failures.
#include <cstdio>
#include <string>

#include "common/common.cuh"

namespace {
thread_local std::string g_last_error;
}  // namespace

namespace mb {

mb_status fail(mb_status status, const char* fmt, ...) {
  char buf[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, args);
  va_end(args);
  g_last_error = buf;
  return status;
}

}  // namespace mb

extern "C" const char* mb_last_error(void) { return g_last_error.c_str(); }
