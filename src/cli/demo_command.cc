// `attnkit demo`: the worked example of docs/design.md, end to end on every backend that runs here.
#include <cmath>
#include <iostream>
#include <optional>
#include <random>

#include "attnkit/replay/metadata_json.h"
#include "attnkit/replay/replay.h"
#include "attnkit/runner/model_runner.h"
#include "attnkit/selection/registry.h"
#include "attnkit/selection/validate.h"
#include "commands.h"
#include "metadata_printer.h"

namespace attnkit::cli {

namespace {

// Page size 16; A decode (q 1, seq 128), B prefill (q 4, seq 4), C extend (q 3, seq 35).
BatchRecord worked_example(DType dtype, DType kv_dtype, unsigned seed) {
  BatchRecord r;
  r.page_size = 16;
  r.num_q_heads = 8;
  r.num_kv_heads = 2;
  r.head_size = 128;
  r.dtype = dtype;
  r.kv_dtype = kv_dtype;
  r.causal = true;
  r.requests = {{1, 128, {7, 2, 9, 4, 11, 6, 3, 10}}, {4, 4, {5}}, {3, 35, {1, 8, 12}}};
  const std::int64_t blocks = 13;
  const std::int64_t tokens = 8;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto random = [&](std::vector<std::int64_t> dims) {
    HostTensor t(DType::kFloat32, std::move(dims));
    for (std::int64_t i = 0; i < t.view().numel(); ++i) t.view().set_flat(i, normal(rng));
    return t;
  };
  r.q = random({tokens, r.num_q_heads, r.head_size});
  r.k = random({tokens, r.num_kv_heads, r.head_size});
  r.v = random({tokens, r.num_kv_heads, r.head_size});
  r.k_cache = random({blocks, r.page_size, r.num_kv_heads, r.head_size});
  r.v_cache = random({blocks, r.page_size, r.num_kv_heads, r.head_size});
  return r;
}

// What docs/design.md says the worked example must produce.
bool check_common(const CommonAttentionMetadata& c) {
  const auto eq = [](auto span, std::vector<std::int64_t> want) {
    if (span.size() != want.size()) return false;
    for (std::size_t i = 0; i < want.size(); ++i) {
      if (static_cast<std::int64_t>(span[i]) != want[i]) return false;
    }
    return true;
  };
  // Device arrays are copied to the host (a tool: a synchronous copy on CUDA).
  return eq(to_host_vector(c.query_start_loc), {0, 1, 5, 8}) && eq(to_host_vector(c.seq_lens), {128, 4, 35}) &&
         c.max_query_len == 4 && c.max_seq_len == 128 && c.num_actual_tokens == 8 &&
         eq(to_host_vector(c.slot_mapping), {175, 80, 81, 82, 83, 192, 193, 194});
}

// The backend-specific numbers docs/design.md gives; backends it says nothing about pass trivially.
bool check_backend(std::string_view backend, const AttentionMetadata& metadata) {
  const nlohmann::json j = metadata_to_json(metadata);
  const auto is = [&](const nlohmann::json& v, std::vector<std::int64_t> want) {
    return v.is_array() && v.get<std::vector<std::int64_t>>() == want;
  };
  if (backend == "VARLEN") return is(j["cu_seqlens_q"], {0, 1, 5, 8}) && is(j["seqused_k"], {128, 4, 35});
  // Both backends of the FlashInfer execution model build the same CSR table (csr_page_table.h).
  if (backend == "CSR_PLAN" || backend == "FLASHINFER") {
    return j["num_decodes"] == 1 && j["num_decode_tokens"] == 1 && j["num_prefills"] == 2 &&
           j["num_prefill_tokens"] == 7 && is(j["paged_kv_indptr"], {0, 8, 9, 12}) &&
           is(j["paged_kv_indices"], {7, 2, 9, 4, 11, 6, 3, 10, 5, 1, 8, 12}) &&
           is(j["paged_kv_last_page_len"], {16, 4, 3}) && is(j["prefill_plan"]["qo_indptr"], {0, 4, 7});
  }
  return true;
}


}  // namespace

void add_demo_command(CLI::App& app, int& exit_code) {
  struct Flags {
    std::string dtype = "float16";
    unsigned seed = 1;
  };
  auto flags = std::make_shared<Flags>();
  auto* cmd = app.add_subcommand("demo",
                                 "Run the worked example of docs/design.md: print the common metadata and each backend's "
                                 "metadata, run attention on every backend available here and cross-check outputs");
  cmd->add_option("--dtype", flags->dtype, "Activation and KV dtype: float16, bfloat16 or float32")->capture_default_str();
  cmd->add_option("--seed", flags->seed, "Seed of the random Q/K/V")->capture_default_str();
  cmd->callback([flags, &exit_code] {
    const std::optional<DType> dtype = parse_dtype(flags->dtype);
    if (!dtype || is_fp8(*dtype)) throw Error("--dtype", flags->dtype, "float16, bfloat16, float32");
    const BatchRecord record = worked_example(*dtype, *dtype, flags->seed);
    // Exactly what the replays below (with LSE) ask the selector for.
    RunnerConfig run;
    run.need_lse = true;
    const AttentionConfig config = attention_config_for(layer_spec_of(record), run);
    const GpuProbe gpu = probe_gpu();
    std::cout << "attnkit demo: the worked example of docs/design.md (page 16; A decode q1/seq128, B prefill q4/seq4, "
                 "C extend q3/seq35), 8 q heads, 2 kv heads, head 128, "
              << to_string(*dtype) << "\n"
              << "gpu: " << (gpu.available() ? gpu.device_name : gpu.error)
              << (gpu.available() ? "; CPU backends run on the cpu platform, CUDA backends on the GPU\n"
                                  : "; kernels run on the cpu platform\n");
    Selector selector(default_registry());
    std::cout << "auto selection here: " << selector.select(config, std::nullopt).log_line() << "\n\n";

    bool all_ok = true;
    bool printed_common = false;
    std::optional<ReplayResult> reference;
    std::vector<ReplayResult> results;
    for (const BackendType& b : registered_backends()) {
      // Each backend runs where it declares: the CPU ones here, the CUDA ones on the GPU if any.
      const std::optional<Platform> platform = platform_here(b.caps());
      AttentionConfig on_platform = config;
      if (platform) on_platform.platform = *platform;
      // A backend that returns no LSE runs the example without it; its outputs are still checked.
      const bool lse = b.caps().features.has(Feature::kReturnLse);
      if (!lse) {
        FeatureSet without_lse;
        for (Feature f : kAllFeatures) {
          if (f != Feature::kReturnLse && config.features.has(f)) without_lse.add(f);
        }
        on_platform.features = without_lse;
      }
      const auto reasons = validate(b.caps(), on_platform);
      if (!reasons.empty()) {
        std::cout << "skip " << b.name() << ": " << reasons.front().message()
                  << (reasons.size() > 1 ? " (+" + std::to_string(reasons.size() - 1) + " more)" : "") << "\n\n";
        continue;
      }
      ReplayOptions options;
      options.platform = *platform;
      options.backend = std::string(b.name());
      options.want_lse = lse;
      options.check_invariants = true;
      options.on_prepared = [&](const ModelRunner& runner) {
        const CommonAttentionMetadata& common = runner.kv_groups().front().common();
        if (!printed_common) {
          std::cout << "common metadata:\n";
          print_common_metadata(std::cout, common, 2);
          const bool ok = check_common(common);
          all_ok = all_ok && ok;
          std::cout << "  worked example numbers: " << (ok ? "match docs/design.md" : "MISMATCH") << "\n\n";
          printed_common = true;
        }
        std::cout << b.name() << " metadata (" << options.platform.describe() << "):\n";
        const AttentionMetadata& md = *runner.forward_context().layer(runner.layer_id_at(0)).metadata;
        print_metadata(std::cout, md, 2);
        const bool ok = check_backend(b.name(), md);
        all_ok = all_ok && ok;
        if (b.name() == "VARLEN" || b.name() == "CSR_PLAN" || b.name() == "FLASHINFER") {
          std::cout << "  worked example numbers: " << (ok ? "match docs/design.md" : "MISMATCH") << "\n";
        }
      };
      ReplayResult result = replay_batch(record, options);
      std::cout << "  ran kernel " << result.variant << "; invariants V1-V9 hold\n";
      if (b.name() == "REFERENCE") {
        reference = std::move(result);
      } else {
        results.push_back(std::move(result));
      }
      std::cout << "\n";
    }
    if (!reference) throw Error("REFERENCE", "not runnable here", "a machine with a CPU");
    // fp16/bf16 outputs round at ~2^-11 / 2^-8 relative; outputs are O(1).
    const double tol = *dtype == DType::kFloat32 ? 1e-4 : (*dtype == DType::kFloat16 ? 4e-3 : 3e-2);
    for (const ReplayResult& r : results) {
      double max_diff = 0.0, max_lse_diff = 0.0;
      const HostTensorView a = r.out.view(), ref = reference->out.view();
      for (std::int64_t i = 0; i < a.numel(); ++i) {
        max_diff = std::max(max_diff, static_cast<double>(std::fabs(a.flat(i) - ref.flat(i))));
        if (std::isnan(a.flat(i))) max_diff = INFINITY;
      }
      const bool has_lse = r.lse.view().numel() == reference->lse.view().numel();
      for (std::int64_t i = 0; has_lse && i < r.lse.view().numel(); ++i) {
        max_lse_diff = std::max(max_lse_diff, static_cast<double>(std::fabs(r.lse.view().flat(i) - reference->lse.view().flat(i))));
      }
      const bool ok = max_diff <= tol && max_lse_diff <= tol;
      all_ok = all_ok && ok;
      std::cout << "cross-check " << r.backend << " vs REFERENCE: max |out diff| " << max_diff << ", max |lse diff| "
                << (has_lse ? std::to_string(max_lse_diff) : std::string("(no LSE)")) << " (tolerance " << tol
                << "): " << (ok ? "ok" : "FAILED") << "\n";
    }
    std::cout << (all_ok ? "demo: ok\n" : "demo: FAILED\n");
    // The worked example is fixed input, so a mismatch is attnkit's fault, never the user's.
    if (!all_ok) std::cerr << "attnkit: internal error: the worked example does not reproduce docs/design.md\n";
    exit_code = all_ok ? kExitOk : kExitInternalError;
  });
}

}  // namespace attnkit::cli
