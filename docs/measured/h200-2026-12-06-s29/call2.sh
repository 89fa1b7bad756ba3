#!/usr/bin/env bash
# s29 call 2: call1.sh again on the same warm H200 at 2048 / 4096 / 8192 tokens on the three layers whose experts hold
# a few row tiles (its band and test phases cut to a second by their timeouts).
FP8_TOKENS=2048,4096,8192 FP8_SHAPES="qwen3-30b-a3b deepseek-v2-lite gpt-oss-20b" FP8_S=100 BAND_S=1 TESTS_S=1 \
  bash "$(dirname "$0")/call1.sh"
