// Issue 39 (K4, GPU): every CUDA kernel variant on the runner's own poisoned cache, as an engine
// leaves it: only the slots a step wrote hold keys and values, the rest of each page what the cache
// was filled with. The earlier GPU tests filled the whole cache with random finite values first, so
// they could not see a kernel that reads a page's unwritten tail (cuDNN's paged SDPA, FlashInfer's
// XQA); through the model executor those gave NaN logits.
//   - DefaultPoison: the runner's poison for the group (0 where a kernel reads whole pages, NaN
//     elsewhere) gives outputs within tolerance of the float64 expectation at model shapes
//     (Llama-3.1-8B and -3.2-1B, Qwen3-0.6B heads; a sliding window), over prefills, decodes and
//     extends that leave the last page part-written.
//   - DeclarationMatchesTheKernel: with NaN written over the whole cache by hand, a kernel that
//     declares reads_whole_pages must give a NaN (else the declaration costs the NaN poison for
//     nothing) and one that does not must give the right outputs (else the declaration is false).
// Skips without a GPU; a variant that selection refuses for a shape is skipped with the reason.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "attnkit/core/error.h"
#include "attnkit/platform/platform.h"
#include "attnkit/runner/model_runner.h"
#include "attnkit/selection/registry.h"
#include "support/runner_driver.h"

#if ATTNKIT_HAVE_CUDA
#include "support/guarded_device_buffer.h"
#endif

namespace attnkit::testing {
namespace {

#if ATTNKIT_HAVE_CUDA

struct Shape {
  const char* name;
  int q_heads, kv_heads, head_size, page, window;
  DType kv_dtype = DType::kBFloat16;
};
// The attention shapes of the models the executor runs (heads, head size), at the pages the
// kernels are instantiated for.
const Shape kShapes[] = {
    {"llama8b_p16", 32, 8, 128, 16, 0}, {"llama8b_p64", 32, 8, 128, 64, 0}, {"llama1b_p16", 32, 8, 64, 16, 0},
    {"qwen3_0p6b_p16", 16, 8, 128, 16, 0}, {"window_p16", 8, 4, 128, 16, 24},
    {"llama8b_e4m3_p16", 32, 8, 128, 16, 0, DType::kFp8E4M3},
};

// Every declared kernel variant of every CUDA backend in this build, pinned as BACKEND:variant.
std::vector<std::string> cuda_variants() {
  std::vector<std::string> out;
  for (const BackendType& type : default_registry().backends()) {
    const BackendCaps& caps = type.caps();
    const bool cuda = std::find(caps.platforms.begin(), caps.platforms.end(), PlatformKind::kCuda) != caps.platforms.end();
    if (!cuda) continue;
    for (const VariantCaps& v : caps.variants) out.push_back(std::string(caps.name) + ":" + std::string(v.variant.name));
  }
  return out;
}

RunnerConfig gpu_config(const std::string& backend, const Shape& s) {
  const GpuProbe p = probe_gpu();
  RunnerConfig c;
  c.platform = Platform::cuda(p.compute_capability, p.device_name);
  c.backend = backend;
  c.max_num_reqs = 8;
  c.max_num_tokens = 256;
  c.max_model_len = 512;
  c.num_manager_blocks = 96;
  if (is_fp8(s.kv_dtype)) c.k_scale = c.v_scale = 1.0f;  // the driver's values are within e4m3's range
  return c;
}

std::vector<LayerSpec> layers_of(const Shape& s) {
  std::vector<LayerSpec> layers;
  for (int l = 0; l < 2; ++l) {
    layers.push_back(attention_layer("layers." + std::to_string(l) + ".attn", s.q_heads, s.kv_heads, s.head_size,
                                     s.page, s.window, DType::kBFloat16, s.kv_dtype));
  }
  return layers;
}

// Prefills that end inside a page, decodes into the same pages, an extend and a new prompt beside
// decodes, then decodes past a page boundary: (request id, query length) per step.
const std::vector<std::vector<StepRequest>> kSteps = {
    {{0, 5}, {1, 21}, {2, 16}},
    {{0, 1}, {1, 1}, {2, 1}},
    {{0, 7}, {1, 1}, {2, 1}, {3, 3}},
    {{0, 1}, {1, 1}, {2, 1}, {3, 1}},
    {{0, 1}, {1, 1}, {2, 1}, {3, 1}},
};

// The runner of a variant at a shape, or the selection's reason it does not run there.
std::unique_ptr<ModelRunner> runner_for(const std::string& variant, const Shape& s, std::string& refused) {
  try {
    return std::make_unique<ModelRunner>(layers_of(s), gpu_config(variant, s));
  } catch (const Error& e) {
    refused = e.what();
    return nullptr;
  }
}

bool any_nan(const ModelRunner& runner, const RunnerDriver& driver) {
  for (std::int32_t l = 0; l < runner.num_layers(); ++l) {
    const HostTensor& out = driver.output(runner.layer_id_at(l));
    for (std::int64_t e = 0; e < out.view().numel(); ++e) {
      if (std::isnan(out.view().flat(e))) return true;
    }
  }
  return false;
}

class PoisonedCache : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!have_gpu() || !probe_gpu().available()) GTEST_SKIP() << "no GPU here";
  }
};

TEST_P(PoisonedCache, DefaultPoison) {
  int ran = 0;
  for (const Shape& s : kShapes) {
    std::string refused;
    std::unique_ptr<ModelRunner> runner = runner_for(GetParam(), s, refused);
    if (!runner) {
      std::printf("  %s at %s: refused by selection: %.200s\n", GetParam().c_str(), s.name, refused.c_str());
      continue;
    }
    SCOPED_TRACE(std::string(GetParam()) + " at " + s.name);
    std::printf("  %s at %s: poison %g\n", GetParam().c_str(), s.name,
                static_cast<double>(runner->kv_poison(runner->layer_id_at(0))));
    RunnerDriver driver(*runner, 39);
    driver.set_relative_tolerance(std::ldexp(1.0, -6));
    driver.set_extra_absolute_tolerance(8e-3);
    for (const auto& step : kSteps) driver.step(step);
    ++ran;
  }
  if (ran == 0) GTEST_SKIP() << GetParam() << " runs none of the shapes";
}

TEST_P(PoisonedCache, DeclarationMatchesTheKernel) {
  int ran = 0;
  for (const Shape& s : kShapes) {
    std::string refused;
    std::unique_ptr<ModelRunner> runner = runner_for(GetParam(), s, refused);
    if (!runner) continue;
    SCOPED_TRACE(std::string(GetParam()) + " at " + s.name);
    const Selection& sel = runner->selection(runner->layer_id_at(0));
    const bool whole = reads_whole_pages(sel.backend->caps(), sel.variant);
    for (std::int32_t l = 0; l < runner->num_layers(); ++l) {
      const KVCacheView& kv = runner->kv_cache(runner->layer_id_at(l));
      unsigned char nan_bits[2] = {};  // a quiet NaN of the cache dtype (bf16 0x7FC0, e4m3 0x7F)
      store_float(nan_bits, 0, kv.dtype, std::nanf(""));
      runner->kv_memory().fill(kv.data, kv.num_bytes(), nan_bits, size_of(kv.dtype));
    }
    RunnerDriver driver(*runner, 39);
    driver.set_relative_tolerance(std::ldexp(1.0, -6));
    driver.set_extra_absolute_tolerance(8e-3);
    bool nan = false;
    for (const auto& step : kSteps) {
      if (whole) {
        driver.prepare(step);
        driver.run_layers();
        nan = nan || any_nan(*runner, driver);
      } else {
        driver.step(step);  // every output right over a NaN tail
      }
    }
    if (whole) {
      EXPECT_TRUE(nan) << GetParam() << " declares reads_whole_pages, yet no NaN of the poisoned tails reached its "
                       << "outputs: the declaration would cost its groups the NaN poison for nothing";
    }
    std::printf("  %s at %s: reads_whole_pages %s, NaN tails gave %s\n", GetParam().c_str(), s.name,
                whole ? "yes" : "no", whole ? (nan ? "NaN outputs" : "no NaN") : "checked outputs");
    ++ran;
  }
  if (ran == 0) GTEST_SKIP() << GetParam() << " runs none of the shapes";
}

INSTANTIATE_TEST_SUITE_P(CudaVariants, PoisonedCache, ::testing::ValuesIn(cuda_variants()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(PoisonedCache);

#else

TEST(PoisonedCache, NeedsACudaBuild) { GTEST_SKIP() << "built without CUDA"; }

#endif

}  // namespace
}  // namespace attnkit::testing
