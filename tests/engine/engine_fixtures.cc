#include "engine/engine_fixtures.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <set>

#include <unistd.h>

#include "attnkit/core/error.h"

namespace attnkit::engine_test {

namespace fs = std::filesystem;

// Made once per test process, in a folder of its own (ctest runs tests as parallel processes; and
// never a folder left by an older build, whose shapes may differ).
std::string tiny_model(ModelFamily family) {
  static std::set<ModelFamily> made;
  const fs::path dir = fs::path(::testing::TempDir()) /
                       ("attnkit_engine_" + std::string(to_string(family)) + "_" + std::to_string(::getpid()));
  if (made.insert(family).second) {
    fs::remove_all(dir);
    MakeModelOptions o;
    o.family = family;
    o.size = ModelSize::kTiny;
    o.seed = 11;
    o.dtype = DType::kFloat32;
    o.threads = 1;
    make_model(o, dir.string());
  }
  return dir.string();
}

Platform test_platform() {
  const char* name = std::getenv("ATTNKIT_TEST_PLATFORM");
  if (name == nullptr || std::string(name) == "cpu") return Platform::cpu();
  if (std::string(name) != "cuda") throw Error("ATTNKIT_TEST_PLATFORM", name, "cpu, cuda");
  const GpuProbe gpu = probe_gpu();
  if (!gpu.available()) throw Error("ATTNKIT_TEST_PLATFORM", "cuda", "cpu (no usable GPU here)", gpu.error);
  return Platform::cuda(gpu.compute_capability, gpu.device_name);
}

EngineConfig small_engine(std::int32_t blocks) {
  EngineConfig c;
  c.executor.platform = test_platform();
  c.executor.max_num_reqs = 6;
  c.executor.max_num_tokens = 48;
  c.executor.max_model_len = 96;
  c.executor.num_blocks = blocks;
  c.executor.block_size = 16;
  return c;
}

std::vector<std::int32_t> prompt_of(std::uint32_t seed, int length, std::int64_t vocab) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::int32_t> token(3, static_cast<std::int32_t>(vocab - 1));
  std::vector<std::int32_t> p(static_cast<std::size_t>(length));
  for (auto& t : p) t = token(rng);
  return p;
}

RequestSpec greedy(std::vector<std::int32_t> prompt, std::int32_t max_tokens) {
  RequestSpec s;
  s.prompt = std::move(prompt);
  s.max_tokens = max_tokens;
  s.ignore_eos = true;  // random weights: a fixed number of tokens
  return s;
}

std::vector<std::vector<std::int32_t>> run(Engine& engine, const std::vector<RequestSpec>& specs,
                                           const std::vector<int>& arrival, EngineTotals* totals) {
  std::vector<std::int64_t> ids(specs.size(), -1);
  for (int step = 0;; ++step) {
    for (std::size_t i = 0; i < specs.size(); ++i) {
      if (arrival[i] == step) ids[i] = engine.add_request(specs[i]);
    }
    const bool pending = std::any_of(arrival.begin(), arrival.end(), [&](int a) { return a > step; });
    if (!engine.has_unfinished_requests() && !pending) break;
    engine.step();
    if (totals) totals->add(engine.last_step_stats());
    if (step > 2000) ADD_FAILURE() << "the engine made no progress";
    if (step > 2000) break;
  }
  std::vector<std::vector<std::int32_t>> out;
  for (std::int64_t id : ids) out.push_back(engine.generated(id));
  return out;
}

std::vector<std::vector<std::int32_t>> alone(const std::string& model, const std::vector<RequestSpec>& specs) {
  std::vector<std::vector<std::int32_t>> out;
  for (const RequestSpec& s : specs) {
    Engine engine(load_model(model), small_engine());
    out.push_back(run(engine, {s}, {0}).front());
  }
  return out;
}

}  // namespace attnkit::engine_test
