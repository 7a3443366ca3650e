// E6 (issue 39): one failing request never takes the engine down. A tiny Llama (untied LM head)
// whose embedding row of one token is NaN gives every request that reads that token non-finite
// logits: such a request is finished with FinishReason::kError and a reason, reported once, its
// blocks freed and never cached, and every other request gets the tokens it gets alone, beside it
// and after it, synchronous and asynchronous scheduling alike.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnkit/core/error.h"
#include "attnkit/engine/engine.h"
#include "engine/engine_fixtures.h"

namespace attnkit {
namespace {

using namespace engine_test;
namespace fs = std::filesystem;

// A copy of `model` whose float32 embedding row `token` is NaN (single-file checkpoint).
std::string with_nan_token(const std::string& model, std::int32_t token) {
  const fs::path dir = fs::path(model).string() + "_nan" + std::to_string(token);
  fs::remove_all(dir);
  fs::copy(model, dir, fs::copy_options::recursive);
  const fs::path file = dir / "model.safetensors";
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  EXPECT_TRUE(f.good()) << file;
  std::uint64_t header_len = 0;
  f.read(reinterpret_cast<char*>(&header_len), sizeof header_len);
  std::string header(header_len, '\0');
  f.read(header.data(), static_cast<std::streamsize>(header_len));
  const nlohmann::json h = nlohmann::json::parse(header);
  const auto& t = h.at("model.embed_tokens.weight");
  EXPECT_EQ(t.at("dtype"), "F32");
  const std::int64_t hidden = t.at("shape")[1];
  const std::int64_t begin = t.at("data_offsets")[0];
  const std::vector<float> nan_row(static_cast<std::size_t>(hidden), std::numeric_limits<float>::quiet_NaN());
  f.seekp(static_cast<std::streamoff>(8 + header_len + static_cast<std::uint64_t>(begin + token * hidden * 4)));
  f.write(reinterpret_cast<const char*>(nan_row.data()), static_cast<std::streamsize>(hidden * 4));
  EXPECT_TRUE(f.good());
  return dir.string();
}

struct Fixture {
  std::string clean, poisoned;
  std::int32_t bad_token = -1;
  std::vector<RequestSpec> good;  // requests that never read the bad token
  std::vector<std::vector<std::int32_t>> good_alone;
  RequestSpec bad;
};

// Good requests and their tokens on the clean model; a bad token none of them reads or generates.
const Fixture& fixture() {
  static const Fixture f = [] {
    Fixture x;
    x.clean = tiny_model(ModelFamily::kLlama);
    const std::int64_t vocab = load_model(x.clean).arch.vocab_size;
    for (int i = 0; i < 4; ++i) x.good.push_back(greedy(prompt_of(500 + i, 6 + 9 * i, vocab), 10));
    x.good_alone = alone(x.clean, x.good);
    std::set<std::int32_t> used;
    for (std::size_t i = 0; i < x.good.size(); ++i) {
      used.insert(x.good[i].prompt.begin(), x.good[i].prompt.end());
      used.insert(x.good_alone[i].begin(), x.good_alone[i].end());
    }
    for (std::int32_t t = 3; t < vocab && x.bad_token < 0; ++t) {
      if (!used.contains(t)) x.bad_token = t;
    }
    x.poisoned = with_nan_token(x.clean, x.bad_token);
    std::vector<std::int32_t> prompt = prompt_of(900, 20, vocab);
    prompt[11] = x.bad_token;
    x.bad = greedy(prompt, 10);
    return x;
  }();
  return f;
}

EngineConfig config(bool async) {
  EngineConfig c = small_engine();
  c.async_scheduling = async;
  return c;
}

class FaultIsolation : public ::testing::TestWithParam<bool> {};

TEST_P(FaultIsolation, ARequestWithNonFiniteLogitsFailsAloneAndTheEngineGoesOn) {
  const Fixture& f = fixture();
  ASSERT_GE(f.bad_token, 0);
  Engine engine(load_model(f.poisoned), config(GetParam()));
  const std::int32_t all_blocks = engine.num_available_blocks(0);
  std::vector<std::int64_t> ids;
  for (std::size_t i = 0; i < 2; ++i) ids.push_back(engine.add_request(f.good[i]));
  const std::int64_t bad = engine.add_request(f.bad);
  std::vector<RequestOutput> reported_for_bad;
  for (int step = 0; engine.has_unfinished_requests(); ++step) {
    if (step == 2) {
      for (std::size_t i = 2; i < f.good.size(); ++i) ids.push_back(engine.add_request(f.good[i]));
    }
    std::vector<RequestOutput> outputs;
    ASSERT_NO_THROW(outputs = engine.step()) << "step " << step;
    for (const RequestOutput& o : outputs) {
      if (o.request_id == bad) reported_for_bad.push_back(o);
    }
    ASSERT_LT(step, 500);
  }
  EXPECT_EQ(engine.state(bad), RequestState::kFinished);
  EXPECT_EQ(engine.finish_reason(bad), FinishReason::kError);
  EXPECT_NE(engine.error(bad).find("non-finite"), std::string::npos) << engine.error(bad);
  ASSERT_EQ(reported_for_bad.size(), 1u) << "the failure is reported once, and nothing else for it";
  EXPECT_TRUE(reported_for_bad[0].finished);
  EXPECT_EQ(reported_for_bad[0].finish_reason, FinishReason::kError);
  EXPECT_EQ(reported_for_bad[0].new_token, -1);
  EXPECT_EQ(reported_for_bad[0].error, engine.error(bad));
  EXPECT_TRUE(engine.generated(bad).empty()) << "its prefill failed: no token";
  for (std::size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(engine.generated(ids[i]), f.good_alone[i]) << "request " << i;
    EXPECT_NE(engine.finish_reason(ids[i]), FinishReason::kError);
  }
  // Every block is back (free, or cached and unreferenced), and the engine serves a new batch.
  EXPECT_EQ(engine.num_available_blocks(0), all_blocks);
  std::vector<std::int64_t> again;
  for (const RequestSpec& s : f.good) again.push_back(engine.add_request(s));
  const std::int64_t bad_again = engine.add_request(f.bad);
  while (engine.has_unfinished_requests()) engine.step();
  for (std::size_t i = 0; i < again.size(); ++i) EXPECT_EQ(engine.generated(again[i]), f.good_alone[i]);
  EXPECT_EQ(engine.finish_reason(bad_again), FinishReason::kError)
      << "the failed prompt's blocks were not cached: it runs (and fails) again";
  EXPECT_EQ(engine.num_available_blocks(0), all_blocks);
  EXPECT_NO_THROW(engine.abort_request(bad));  // a finished request: nothing to do
}

// A request that fails after a shared prefix was cached by another: the sharer is unaffected, and
// the prefix stays cached (the failed request only read it).
TEST_P(FaultIsolation, AFailedRequestLeavesTheCachedPrefixItReadToOthers) {
  const Fixture& f = fixture();
  const std::int64_t vocab = load_model(f.clean).arch.vocab_size;
  std::vector<std::int32_t> system = prompt_of(77, 32, vocab);  // two full blocks
  for (std::int32_t& t : system) {
    if (t == f.bad_token) t = f.bad_token + 1;
  }
  RequestSpec first = greedy(system, 6), failing = greedy(system, 6), later = greedy(system, 6);
  first.prompt.push_back(5);
  failing.prompt.push_back(f.bad_token);
  later.prompt.push_back(6);
  Engine clean_engine(load_model(f.clean), config(GetParam()));
  const auto want = run(clean_engine, {first, later}, {0, 8});
  Engine engine(load_model(f.poisoned), config(GetParam()));
  EngineTotals totals;
  const auto got = run(engine, {first, failing, later}, {0, 4, 8}, &totals);
  if (std::find(want[0].begin(), want[0].end(), f.bad_token) != want[0].end() ||
      std::find(want[1].begin(), want[1].end(), f.bad_token) != want[1].end()) {
    GTEST_SKIP() << "the clean model generates the bad token here";
  }
  EXPECT_EQ(got[0], want[0]);
  EXPECT_EQ(got[2], want[1]);
  EXPECT_TRUE(got[1].empty());
  EXPECT_GE(totals.prefix_hit_tokens, 64) << "the failing and the later request both found the system prompt";
}

INSTANTIATE_TEST_SUITE_P(Scheduling, FaultIsolation, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) { return info.param ? "async" : "sync"; });

}  // namespace
}  // namespace attnkit
