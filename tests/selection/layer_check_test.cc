// S6: the selector and every backend's make_impl read one rule source (backends/coverage.h). Over a
// grid of layer parameters, each registered backend's make_impl accepts a layer on a kernel
// variant exactly when the selector's validate_variant accepts it there, so the variant the
// selector names is the one that runs, and no impl accepts what the selector refuses. A backend
// whose make_impl skipped require_layer_supported, or an impl that added a rule of its own the
// declaration does not state, fails here.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attnkit/backends/coverage.h"
#include "attnkit/core/error.h"
#include "attnkit/selection/registry.h"
#include "attnkit/selection/validate.h"

namespace attnkit {
namespace {

const std::vector<PlatformKind>& platforms_of(const BackendCaps& caps, const VariantCaps& variant) {
  return variant.platforms.empty() ? caps.platforms : variant.platforms;
}

// The run's facts, chosen so that only the layer's parameters decide: the variant's platform (a
// compute capability it declares on CUDA), a page size both the backend and the variant take, the
// backend's first layer kind and no forced layout.
AttentionConfig run_for(const BackendCaps& caps, const VariantCaps& variant, const LayerParams& params) {
  AttentionConfig c = params.attention_config();
  const PlatformKind platform = platforms_of(caps, variant).front();
  if (platform == PlatformKind::kCuda) {
    const ComputeCapabilityRange range = variant.cuda_compute_capability.value_or(caps.cuda_compute_capability);
    c.platform = Platform::cuda(range.min > 0 ? range.min : 90, "layer-check");
  }
  c.block_size = variant.block_sizes.empty() ? caps.block_sizes.enumerate(64).back() : variant.block_sizes.front();
  c.kv_spec_kind = caps.kv_spec_kinds.front();
  return c;
}

std::string describe(const LayerParams& p) {
  return std::string(to_string(p.dtype)) + "/" + std::string(to_string(p.kv_cache_dtype)) + " heads " +
         std::to_string(p.num_q_heads) + "/" + std::to_string(p.num_kv_heads) + " x " + std::to_string(p.head_size) +
         " " + std::string(to_string(p.attn_type)) + " features {" + p.required_features().describe() + "}";
}

// Every combination of a few values of each layer parameter: inside and outside every backend's sets.
std::vector<LayerParams> layer_grid() {
  std::vector<LayerParams> grid;
  const std::vector<std::pair<int, int>> heads = {{4, 2}, {4, 4}, {8, 1}, {6, 4}, {4, 0}};
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (DType kv : {DType::kFloat32, DType::kBFloat16, DType::kFp8E4M3}) {
      for (int head_size : {64, 72, 128}) {
        for (auto [q, kv_heads] : heads) {
          for (AttentionType type : {AttentionType::kDecoder, AttentionType::kEncoder, AttentionType::kCross}) {
            for (int features = 0; features < 5; ++features) {
              LayerParams p;
              p.dtype = dtype;
              p.kv_cache_dtype = kv;
              p.head_size = head_size;
              p.num_q_heads = q;
              p.num_kv_heads = kv_heads;
              p.attn_type = type;
              if (features == 1) p.sliding_window = 8;
              if (features == 2) p.soft_cap = 30.0f;
              if (features == 3) p.sinks.assign(static_cast<std::size_t>(q), 0.5f);
              if (features == 4) p.alibi_slopes.assign(static_cast<std::size_t>(q), 0.25f);
              if (features == 4) p.sliding_window = 8;  // and a pair some combination rules refuse
              grid.push_back(p);
            }
          }
        }
      }
    }
  }
  return grid;
}

TEST(LayerCheck, MakeImplAcceptsExactlyWhatTheSelectorAcceptsOnEachVariant) {
  const std::vector<LayerParams> grid = layer_grid();
  int compared = 0;
  for (const BackendType& type : registered_backends()) {
    const BackendCaps& caps = type.caps();
    for (const VariantCaps& variant : caps.variants) {
      // A CUDA variant's impl needs its compiled kernels and a GPU to be made, so there only the
      // refusals are compared: what the selector refuses, make_impl refuses.
      const bool cpu = platforms_of(caps, variant).front() == PlatformKind::kCpu;
      for (const LayerParams& p : grid) {
        const std::vector<Reason> reasons = validate_variant(caps, variant, run_for(caps, variant, p));
        bool made = true;
        std::string refusal;
        try {
          type.make_impl(p, variant.variant);
        } catch (const Error& e) {
          made = false;
          refusal = e.what();
        }
        const std::string where = std::string(caps.name) + ":" + std::string(variant.variant.name) + " " + describe(p);
        if (!reasons.empty()) {
          EXPECT_FALSE(made) << where << ": the selector refuses (" << reasons.front().message()
                             << ") but make_impl accepts";
        } else if (cpu) {
          EXPECT_TRUE(made) << where << ": the selector accepts but make_impl refuses: " << refusal;
        }
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 1000);
}

// The refusal names the parameter, its value and the supported set the selector reports.
TEST(LayerCheck, TheRefusalNamesTheFieldValueAndSupportedSet) {
  for (const BackendType& type : registered_backends()) {
    LayerParams p;
    p.num_q_heads = 6;
    p.num_kv_heads = 4;
    try {
      type.make_impl(p, type.caps().variants.front().variant);
      ADD_FAILURE() << type.name() << " made an impl whose query heads do not group over its KV heads";
    } catch (const Error& e) {
      EXPECT_EQ(e.field(), "num_q_heads") << type.name();
      EXPECT_EQ(e.value(), "6") << type.name();
      EXPECT_EQ(e.allowed(), "a positive multiple of num_kv_heads = 4") << type.name();
    }
  }
  LayerParams p;
  p.head_size = 72;
  const BackendCaps& caps = registered_backends().front().caps();
  try {
    require_layer_supported(caps, caps.variants[0].variant, p);
    FAIL() << "head size 72 is declared by no backend";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "head_size");
    EXPECT_EQ(e.value(), "72");
    EXPECT_EQ(e.allowed(), supported::head_sizes(caps));
  }
}

TEST(LayerCheck, EveryBuilderRefusesAnotherBackendsContextAndAShapeNoLayerHas) {
  const std::vector<BackendType>& backends = registered_backends();
  ASSERT_GE(backends.size(), 2u);
  for (std::size_t i = 0; i < backends.size(); ++i) {
    const BackendType& type = backends[i];
    BuilderContext ctx;
    ctx.caps = &backends[(i + 1) % backends.size()].caps();
    try {
      type.make_builder(ctx);
      ADD_FAILURE() << type.name() << " built for another backend's context";
    } catch (const Error& e) {
      EXPECT_EQ(e.field(), "builder backend") << type.name();
    }
    ctx.caps = &type.caps();
    ctx.num_kv_heads = 3;  // 32 query heads
    try {
      type.make_builder(ctx);
      ADD_FAILURE() << type.name() << " built for 32 query heads over 3 KV heads";
    } catch (const Error& e) {
      EXPECT_EQ(e.field(), "num_q_heads") << type.name();
    }
  }
}

TEST(LayerCheck, WellFormedNamesTheFieldWithTheCallersPrefix) {
  LayerParams p;
  p.num_q_heads = 4;
  p.num_kv_heads = 2;
  p.sinks = {1.0f};
  try {
    require_well_formed(p, "layers[attn0].");
    FAIL() << "one sink for four query heads";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "layers[attn0].sinks size");
    EXPECT_EQ(e.value(), "1");
    EXPECT_EQ(e.allowed(), "0 or num_q_heads = 4");
  }
  p.sinks.clear();
  p.num_kv_heads = 3;
  try {
    require_well_formed(p, "layers[attn0].");
    FAIL() << "four query heads over three KV heads";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "layers[attn0].num_q_heads");
  }
  p.num_kv_heads = 2;
  EXPECT_NO_THROW(require_well_formed(p, "layers[attn0]."));
}

}  // namespace
}  // namespace attnkit
