// What the engine tests share: tiny random models of every family, the test platform
// (ATTNKIT_TEST_PLATFORM), a small engine configuration, prompts, and a driver that runs requests
// to the end with arrivals by step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attnkit/engine/engine.h"
#include "attnkit/checkpoint/make_model.h"
#include "attnkit/platform/platform.h"

namespace attnkit::engine_test {

// Made once per test process, in a folder of its own.
std::string tiny_model(ModelFamily family);
// The CPU unless ATTNKIT_TEST_PLATFORM=cuda (then a GPU is required: no silent CPU run).
Platform test_platform();
EngineConfig small_engine(std::int32_t blocks = 48);
std::vector<std::int32_t> prompt_of(std::uint32_t seed, int length, std::int64_t vocab);
// A greedy request of max_tokens tokens that ignores end-of-sequence ids.
RequestSpec greedy(std::vector<std::int32_t> prompt, std::int32_t max_tokens);
// Runs every request to the end; request i is added when step `arrival[i]` begins. Returns each
// request's generated tokens.
std::vector<std::vector<std::int32_t>> run(Engine& engine, const std::vector<RequestSpec>& specs,
                                           const std::vector<int>& arrival, EngineTotals* totals = nullptr);
// Each request alone on a fresh small engine.
std::vector<std::vector<std::int32_t>> alone(const std::string& model, const std::vector<RequestSpec>& specs);

}  // namespace attnkit::engine_test
