// S3/S4: auto vs explicit selection, errors that carry every reason, the S3 log line and the
// memoized cache.
#include <gtest/gtest.h>

#include <functional>
#include <mutex>
#include <thread>

#include "attnkit/selection/selector.h"
#include "fake_backends.h"

namespace attnkit {
namespace {

using testing::exact_config;
using testing::fake_registry;

AttentionConfig bf16_config() {  // EXACT rejects bfloat16 activations, WIDE accepts them
  AttentionConfig c = exact_config();
  c.dtype = DType::kBFloat16;
  return c;
}

std::vector<std::string> names_of(const std::vector<CandidateReport>& candidates) {
  std::vector<std::string> out;
  for (const CandidateReport& c : candidates) out.emplace_back(c.backend);
  return out;
}

// --- auto ----------------------------------------------------------------------------------------

TEST(SelectorAuto, PicksTheFirstValidBackendInPriorityOrder) {
  Selector selector(fake_registry());
  const Selection& s = selector.select(exact_config(), std::nullopt);
  ASSERT_NE(s.backend, nullptr);
  EXPECT_EQ(s.backend->name(), "EXACT");  // WIDE is also valid but comes later
  EXPECT_FALSE(s.explicit_choice);
  EXPECT_EQ(s.variant.name, "exact-kernel");
  EXPECT_EQ(names_of(s.candidates), (std::vector<std::string>{"EXACT"}));
}

TEST(SelectorAuto, SkipsInvalidBackendsAndRecordsWhy) {
  Selector selector(fake_registry());
  const Selection& s = selector.select(bf16_config(), std::nullopt);
  EXPECT_EQ(s.backend->name(), "WIDE");
  EXPECT_EQ(s.variant.name, "wide-fp16");
  ASSERT_EQ(names_of(s.candidates), (std::vector<std::string>{"EXACT", "WIDE"}));
  EXPECT_FALSE(s.candidates[0].valid());
  EXPECT_EQ(s.candidates[0].reasons.at(0).parameter, "dtype");
  EXPECT_TRUE(s.candidates[1].valid());

  AttentionConfig state = exact_config();
  state.kv_spec_kind = KVSpecKind::kRecurrentState;
  state.block_size = 1;
  const Selection& last = selector.select(state, std::nullopt);
  EXPECT_EQ(last.backend->name(), "STATE");
  EXPECT_EQ(names_of(last.candidates), (std::vector<std::string>{"EXACT", "WIDE", "STATE"}));
}

TEST(SelectorAuto, VariantComesFromTheChosenBackend) {
  Selector selector(fake_registry());
  AttentionConfig fp8 = bf16_config();
  fp8.kv_cache_dtype = DType::kFp8E4M3;
  EXPECT_EQ(selector.select(fp8, std::nullopt).variant.name, "wide-fp8");
}

TEST(SelectorAuto, UsesThePlatformsOwnPriorityList) {
  Selector selector(fake_registry());
  AttentionConfig c = exact_config();
  c.platform = Platform::cuda(90, "H200");
  EXPECT_EQ(selector.select(c, std::nullopt).backend->name(), "WIDE");
}

TEST(SelectorAuto, NoValidBackendThrowsWithEveryCandidatesReasons) {
  Selector selector(fake_registry());
  AttentionConfig c = exact_config();
  c.dtype = DType::kFp8E4M3;  // no backend computes in fp8
  c.head_size = 72;
  try {
    selector.select(c, std::nullopt);
    FAIL() << "expected SelectionError";
  } catch (const SelectionError& e) {
    ASSERT_EQ(names_of(e.candidates()), (std::vector<std::string>{"EXACT", "WIDE", "STATE"}));
    const std::string what = e.what();
    for (const CandidateReport& candidate : e.candidates()) {
      EXPECT_FALSE(candidate.valid());
      EXPECT_NE(what.find(std::string(candidate.backend) + ":"), std::string::npos);
      for (const Reason& r : candidate.reasons) EXPECT_NE(what.find(r.message()), std::string::npos) << r.message();
    }
    EXPECT_GE(e.candidates()[1].reasons.size(), 2u);  // WIDE: dtype and head_size
  }
  EXPECT_EQ(selector.cache_size(), 0u);  // failures are not cached
}

TEST(SelectorAuto, HardwareMismatchOnEveryCudaCandidate) {
  Selector selector(fake_registry());
  AttentionConfig c = bf16_config();
  c.platform = Platform::cuda(75, "T4");
  try {
    selector.select(c, std::nullopt);
    FAIL() << "expected SelectionError";
  } catch (const SelectionError& e) {
    ASSERT_EQ(e.candidates().size(), 1u);
    EXPECT_EQ(e.candidates()[0].reasons.at(0).kind, ReasonKind::kHardware);
    EXPECT_NE(std::string(e.what()).find("compute_capability = sm_75, supported sm_80..sm_90"), std::string::npos);
  }
}

TEST(SelectorAuto, EmptyPriorityListIsAnErrorNotACrash) {
  const BackendRegistry cpu_only({backend_type_of<testing::FakeExactBackend>()},
                                 {{PlatformKind::kCpu, {"EXACT"}}});
  Selector selector(cpu_only);
  AttentionConfig c = exact_config();
  c.platform = Platform::cuda(90, "H200");
  EXPECT_THROW(selector.select(c, std::nullopt), SelectionError);
}

// --- explicit ------------------------------------------------------------------------------------

TEST(SelectorExplicit, ValidNamedBackendWinsOverPriority) {
  Selector selector(fake_registry());
  const Selection& s = selector.select(exact_config(), "WIDE");
  EXPECT_EQ(s.backend->name(), "WIDE");
  EXPECT_TRUE(s.explicit_choice);
  EXPECT_EQ(names_of(s.candidates), (std::vector<std::string>{"WIDE"}));
}

TEST(SelectorExplicit, InvalidBackendThrowsWithAllItsReasonsAndNeverSubstitutes) {
  Selector selector(fake_registry());
  AttentionConfig c = bf16_config();  // WIDE would accept it
  c.head_size = 80;
  c.features.add(Feature::kSoftCap);
  try {
    selector.select(c, "EXACT");
    FAIL() << "an invalid explicit choice must throw, never return another backend";
  } catch (const SelectionError& e) {
    ASSERT_EQ(e.candidates().size(), 1u);
    EXPECT_EQ(e.candidates()[0].backend, "EXACT");
    ASSERT_EQ(e.candidates()[0].reasons.size(), 3u);  // dtype, head_size, soft_cap
    const std::string what = e.what();
    for (const Reason& r : e.candidates()[0].reasons) EXPECT_NE(what.find(r.message()), std::string::npos);
    EXPECT_NE(what.find("backends that accept this configuration: WIDE"), std::string::npos) << what;
  }
  EXPECT_EQ(selector.cache_size(), 0u);
}

TEST(SelectorExplicit, UnknownNameListsRegisteredBackends) {
  Selector selector(fake_registry());
  for (const char* name : {"exact", "NOPE", ""}) {
    try {
      selector.select(exact_config(), name);
      FAIL() << name;
    } catch (const SelectionError& e) {
      EXPECT_TRUE(e.candidates().empty());
      const std::string what = e.what();
      EXPECT_NE(what.find(std::string("\"") + name + "\""), std::string::npos) << what;
      EXPECT_NE(what.find("EXACT, WIDE, STATE"), std::string::npos) << what;
    }
  }
}

// --- one error hierarchy -------------------------------------------------------------------------
// A caller that catches attnkit::Error catches a failed selection too, and reads which backend was
// asked for (field "backend", value the name or "auto") and which ones would have worked (allowed).

TEST(SelectionErrorIsAnError, FailedExplicitSelectionNamesTheRequestAndTheBackendsThatWouldAccept) {
  Selector selector(fake_registry());
  try {
    selector.select(bf16_config(), "EXACT");  // EXACT rejects bfloat16, WIDE accepts it
    FAIL() << "expected an attnkit::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "backend");
    EXPECT_EQ(e.value(), "EXACT");
    EXPECT_EQ(e.allowed(), "WIDE");
    EXPECT_NE(std::string(e.what()).find("dtype = bfloat16, supported {float32, float16}"), std::string::npos)
        << "what() still lists every reason: " << e.what();
  }
}

TEST(SelectionErrorIsAnError, FailedAutoSelectionSaysAutoAndNone) {
  Selector selector(fake_registry());
  AttentionConfig c = exact_config();
  c.dtype = DType::kFp8E4M3;  // no backend computes in fp8
  try {
    selector.select(c, std::nullopt);
    FAIL() << "expected an attnkit::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "backend");
    EXPECT_EQ(e.value(), "auto");
    EXPECT_EQ(e.allowed(), "none");
    const std::string what = e.what();
    for (const char* candidate : {"EXACT:", "WIDE:", "STATE:"}) {
      EXPECT_NE(what.find(candidate), std::string::npos) << "what() lists every candidate: " << what;
    }
  }
}

TEST(SelectionErrorIsAnError, UnknownNameIsTheValueAndTheAcceptingBackendsAreAllowed) {
  Selector selector(fake_registry());
  try {
    selector.select(exact_config(), "NOPE");
    FAIL() << "expected an attnkit::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "backend");
    EXPECT_EQ(e.value(), "NOPE");
    EXPECT_EQ(e.allowed(), "EXACT, WIDE");
  }
}

TEST(SelectionErrorIsAnError, AutoFailureNamesARegisteredBackendOutsideThePriorityList) {
  const BackendRegistry exact_first({backend_type_of<testing::FakeExactBackend>(), backend_type_of<testing::FakeWideBackend>()},
                                    {{PlatformKind::kCpu, {"EXACT"}}});
  Selector selector(exact_first);
  try {
    selector.select(bf16_config(), std::nullopt);
    FAIL() << "WIDE is not on the CPU priority list; auto selection must not pick it";
  } catch (const SelectionError& e) {
    EXPECT_EQ(e.value(), "auto");
    EXPECT_EQ(e.allowed(), "WIDE");
    EXPECT_NE(std::string(e.what()).find("when chosen explicitly: WIDE"), std::string::npos) << e.what();
    EXPECT_EQ(names_of(e.candidates()), (std::vector<std::string>{"EXACT"}));
  }
}

// --- S3 log line ---------------------------------------------------------------------------------

TEST(SelectionLogLine, AutoNamesBackendVariantConfigurationAndSkippedCandidates) {
  Selector selector(fake_registry());
  const std::string line = selector.select(bf16_config(), std::nullopt).log_line();
  EXPECT_EQ(line.rfind("attention backend WIDE, kernel wide-fp16 for [" + bf16_config().describe() +
                           "] (auto: first valid of EXACT, WIDE",
                       0),
            0u)
      << line;
  EXPECT_NE(line.find("skipped EXACT: [feature] dtype = bfloat16, supported {float32, float16}"), std::string::npos)
      << line;
}

TEST(SelectionLogLine, ExplicitSaysSo) {
  Selector selector(fake_registry());
  EXPECT_EQ(selector.select(exact_config(), "WIDE").log_line(),
            "attention backend WIDE, kernel wide-fp16 for [" + exact_config().describe() + "] (explicit)");
}

TEST(SelectionLogLine, TheChoiceLineIsTheLogLineWithoutTheConfiguration) {
  Selector selector(fake_registry());
  EXPECT_EQ(selector.select(exact_config(), "WIDE").choice_line(), "attention backend WIDE, kernel wide-fp16 (explicit)");
  const Selection& automatic = selector.select(bf16_config(), std::nullopt);
  std::string without = automatic.log_line();
  without.erase(without.find(" for ["), std::string(" for [").size() + bf16_config().describe().size() + 1);
  EXPECT_EQ(automatic.choice_line(), without);
}

TEST(SelectionLogLine, SinkGetsOneLinePerNewSelectionAndNothingIsPrintedByDefault) {
  Selector selector(fake_registry());
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  selector.select(exact_config(), std::nullopt);  // no sink installed
  EXPECT_EQ(::testing::internal::GetCapturedStdout(), "");
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");

  std::vector<std::string> lines;
  selector.set_log_sink([&](std::string_view line) { lines.emplace_back(line); });
  selector.select(bf16_config(), std::nullopt);
  selector.select(bf16_config(), std::nullopt);  // cache hit: already logged
  selector.select(bf16_config(), "WIDE");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find("attention backend WIDE, kernel wide-fp16 for [" + bf16_config().describe() + "] (auto"),
            std::string::npos);
  EXPECT_EQ(lines[1], "attention backend WIDE, kernel wide-fp16 for [" + bf16_config().describe() + "] (explicit)");
}

// The log follows the cache: the first selection of a (configuration, backend name or auto) logs
// one line naming the backend, its kernel variant and the configuration; asking again, as every
// layer of a model with that configuration does, logs nothing; a failed selection logs nothing.
TEST(SelectionLogLine, EachConfigurationIsLoggedOnceWhenFirstResolved) {
  Selector selector(fake_registry());
  std::vector<std::string> lines;
  selector.set_log_sink([&](std::string_view line) { lines.emplace_back(line); });

  for (int layer = 0; layer < 32; ++layer) selector.select(exact_config(), std::nullopt);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], selector.select(exact_config(), std::nullopt).log_line());
  EXPECT_EQ(lines[0].rfind("attention backend EXACT, kernel exact-kernel for [" + exact_config().describe() + "]", 0),
            0u)
      << lines[0];

  AttentionConfig fp8 = bf16_config();  // another configuration: a line of its own, naming its variant
  fp8.kv_cache_dtype = DType::kFp8E4M3;
  for (int layer = 0; layer < 4; ++layer) selector.select(fp8, std::nullopt);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[1].find("attention backend WIDE, kernel wide-fp8 for [" + fp8.describe() + "]"), std::string::npos)
      << lines[1];

  AttentionConfig impossible = exact_config();
  impossible.head_size = 72;
  for (int attempt = 0; attempt < 2; ++attempt) EXPECT_THROW(selector.select(impossible, std::nullopt), SelectionError);
  EXPECT_EQ(lines.size(), 2u);

  for (int layer = 0; layer < 4; ++layer) selector.select(exact_config(), std::nullopt);
  EXPECT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines.size(), selector.cache_size());  // one line per cache entry, never per call
}

TEST(SelectionLogLine, ConcurrentFirstSelectionsOfOneConfigurationLogOneLine) {
  Selector selector(fake_registry());
  std::mutex mutex;
  std::vector<std::string> lines;
  selector.set_log_sink([&](std::string_view line) {
    std::lock_guard<std::mutex> lock(mutex);
    lines.emplace_back(line);
  });
  std::vector<const Selection*> seen(16, nullptr);
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < seen.size(); ++t) {
    threads.emplace_back([&, t] { seen[t] = &selector.select(bf16_config(), std::nullopt); });
  }
  for (std::thread& thread : threads) thread.join();
  for (const Selection* s : seen) EXPECT_EQ(s, seen.front());
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], seen.front()->log_line());
  EXPECT_EQ(selector.cache_misses(), 1u);
  EXPECT_EQ(selector.cache_hits(), seen.size() - 1);
}

// --- S4 cache ------------------------------------------------------------------------------------

TEST(SelectorCache, SameConfigurationHitsAndReturnsTheSameObject) {
  Selector selector(fake_registry());
  const Selection& first = selector.select(exact_config(), std::nullopt);
  const Selection& second = selector.select(exact_config(), std::nullopt);
  EXPECT_EQ(&first, &second);
  EXPECT_EQ(selector.cache_misses(), 1u);
  EXPECT_EQ(selector.cache_hits(), 1u);
}

TEST(SelectorCache, KvCacheDtypeIsPartOfTheKey) {
  Selector selector(fake_registry());
  AttentionConfig target = exact_config();
  AttentionConfig draft = exact_config();
  draft.kv_cache_dtype = DType::kBFloat16;
  const Selection& a = selector.select(target, std::nullopt);
  const Selection& b = selector.select(draft, std::nullopt);
  EXPECT_NE(&a, &b);
  EXPECT_EQ(a.backend->name(), "EXACT");
  EXPECT_EQ(b.backend->name(), "WIDE");
  EXPECT_EQ(selector.cache_hits(), 0u);
}

TEST(SelectorCache, BlockSizeIsPartOfTheKey) {
  Selector selector(fake_registry());
  AttentionConfig other = exact_config();
  // 24 tokens per KV block: no kernel page of EXACT ({16, 32}) or WIDE (multiple of 16) divides
  // it. A cache keyed without block_size would wrongly hand back EXACT.
  other.block_size = 24;
  const Selection& a = selector.select(exact_config(), std::nullopt);
  EXPECT_EQ(a.backend->name(), "EXACT");
  EXPECT_THROW(selector.select(other, std::nullopt), SelectionError);
  other.block_size = 64;  // divisible by 16 and 32: valid, but its own entry
  const Selection& b = selector.select(other, std::nullopt);
  EXPECT_NE(&a, &b);
  EXPECT_EQ(selector.cache_hits(), 0u);
}

TEST(SelectorCache, ExplicitAndAutoAreDistinctKeys) {
  Selector selector(fake_registry());
  const Selection& automatic = selector.select(exact_config(), std::nullopt);
  const Selection& named = selector.select(exact_config(), "EXACT");
  EXPECT_NE(&automatic, &named);
  EXPECT_FALSE(automatic.explicit_choice);
  EXPECT_TRUE(named.explicit_choice);
  EXPECT_EQ(selector.cache_misses(), 2u);
  EXPECT_EQ(selector.cache_size(), 2u);
  EXPECT_NE(&selector.select(exact_config(), "WIDE"), &named);
}

TEST(SelectorCache, EveryFieldMakesADistinctEntry) {
  Selector selector(fake_registry());
  const AttentionConfig base = bf16_config();  // WIDE accepts every mutation below
  std::vector<std::function<void(AttentionConfig&)>> mutations = {
      [](AttentionConfig& c) { c.platform = Platform::cuda(90, "H200"); },
      [](AttentionConfig& c) { c.dtype = DType::kFloat32; },
      [](AttentionConfig& c) { c.kv_cache_dtype = DType::kFp8E4M3; },
      [](AttentionConfig& c) { c.head_size = 64; },
      [](AttentionConfig& c) { c.num_q_heads = 16; },
      [](AttentionConfig& c) { c.num_kv_heads = 4; },
      [](AttentionConfig& c) { c.block_size = 32; },
      [](AttentionConfig& c) { c.kv_layout = KVLayout::kSplitNHD; },
      [](AttentionConfig& c) { c.attn_type = AttentionType::kEncoder; },
      [](AttentionConfig& c) { c.kv_spec_kind = KVSpecKind::kSlidingWindow; },
      [](AttentionConfig& c) { c.features.add(Feature::kAlibi); },
      [](AttentionConfig& c) { c.optimistic_cpu_lengths = true; },
  };
  const Selection* base_selection = &selector.select(base, std::nullopt);
  for (std::size_t i = 0; i < mutations.size(); ++i) {
    AttentionConfig changed = base;
    mutations[i](changed);
    EXPECT_NE(&selector.select(changed, std::nullopt), base_selection) << "mutation " << i;
  }
  EXPECT_EQ(selector.cache_misses(), mutations.size() + 1);
  EXPECT_EQ(selector.cache_hits(), 0u);
}

TEST(SelectorCache, CachedReferencesStayValidAsTheCacheGrows) {
  Selector selector(fake_registry());
  const Selection& first = selector.select(bf16_config(), std::nullopt);
  for (int heads = 1; heads <= 200; ++heads) {  // forces rehashing
    AttentionConfig c = bf16_config();
    c.num_q_heads = heads * 8;
    selector.select(c, std::nullopt);
  }
  EXPECT_EQ(&selector.select(bf16_config(), std::nullopt), &first);
  EXPECT_EQ(first.backend->name(), "WIDE");
  EXPECT_EQ(first.candidates.size(), 2u);
}

}  // namespace
}  // namespace attnkit
