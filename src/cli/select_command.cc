#include <iostream>
#include <map>

#include "attnkit/core/error.h"
#include "attnkit/selection/registry.h"
#include "attnkit/selection/selector.h"
#include "attnkit/selection/validate.h"
#include "commands.h"

namespace attnkit::cli {

namespace {

struct SelectFlags {
  std::string backend;
  std::string platform = "cpu";
  int compute_capability = 90;
  std::string dtype = "float16";
  std::string kv_dtype = "auto";
  int head_size = 128;
  int num_q_heads = 32;
  int num_kv_heads = 8;
  int block_size = 16;
  std::string layout;
  std::string attn_type = "decoder";
  std::string layer_kind = "full_attention";
  std::vector<std::string> features;
  bool optimistic = false;
};

template <class T>
T parse_or_throw(std::optional<T> v, const std::string& flag, const std::string& text, const std::string& allowed) {
  if (!v) throw Error(flag, text, allowed);
  return *v;
}

AttentionConfig to_config(const SelectFlags& f) {
  AttentionConfig c;
  if (f.platform == "cpu") {
    c.platform = Platform::cpu();
  } else if (f.platform == "cuda") {
    c.platform = Platform::cuda(f.compute_capability, "requested on the command line");
  } else {
    throw Error("--platform", f.platform, "cpu, cuda");
  }
  c.dtype = parse_or_throw(parse_dtype(f.dtype), "--dtype", f.dtype, "float32, float16, bfloat16");
  c.kv_cache_dtype = f.kv_dtype == "auto" ? c.dtype
                                          : parse_or_throw(parse_dtype(f.kv_dtype), "--kv-dtype", f.kv_dtype,
                                                           "auto, " + describe_dtypes({std::begin(kAllDTypes), std::end(kAllDTypes)}));
  c.head_size = f.head_size;
  c.num_q_heads = f.num_q_heads;
  c.num_kv_heads = f.num_kv_heads;
  c.block_size = f.block_size;
  if (!f.layout.empty()) {
    c.kv_layout = parse_or_throw(parse_kv_layout(f.layout), "--layout", f.layout,
                                 describe_layouts({std::begin(kAllKVLayouts), std::end(kAllKVLayouts)}));
  }
  c.attn_type = parse_or_throw(parse_attention_type(f.attn_type), "--attn-type", f.attn_type,
                               describe_attention_types());
  c.kv_spec_kind = parse_or_throw(parse_kv_spec_kind(f.layer_kind), "--layer-kind", f.layer_kind,
                                  describe_kv_spec_kinds());
  for (const auto& name : f.features) {
    c.features.add(parse_or_throw(parse_feature(name), "--feature", name, describe_all_features()));
  }
  if (c.kv_spec_kind == KVSpecKind::kSlidingWindow) c.features.add(Feature::kSlidingWindow);
  c.optimistic_cpu_lengths = f.optimistic;
  return c;
}

// "  VARLEN: valid, runs kernel variant cpu-online-softmax (declared: cpu-online-softmax)" or
// "  CSR_PLAN: invalid (declared kernel variants: cpu-plan-run)", then every reason.
void print_candidate(const BackendType& b, const AttentionConfig& config) {
  const auto reasons = validate(b.caps(), config);
  std::cout << "  " << b.name() << ": ";
  if (reasons.empty()) {
    std::cout << "valid, runs kernel variant " << resolve_variant(b.caps(), config).variant->variant.name
              << " (declared: " << variant_names(b.caps()) << ")\n";
  } else {
    std::cout << "invalid (declared kernel variants: " << variant_names(b.caps()) << ")\n";
  }
  for (const Reason& r : reasons) std::cout << "    - [" << to_string(r.kind) << "] " << r.message() << "\n";
}

}  // namespace

void add_select_command(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<SelectFlags>();
  auto* cmd = app.add_subcommand("select",
                                 "Explain backend selection for a configuration: each candidate with every reason it "
                                 "is invalid. Exit 1 when an explicit choice (or every candidate) is invalid.");
  cmd->add_option("--backend", flags->backend, "Explicit backend name (default: auto selection)");
  cmd->add_option("--platform", flags->platform, "cpu or cuda")->capture_default_str();
  cmd->add_option("--cc", flags->compute_capability, "CUDA compute capability as major*10+minor")->capture_default_str();
  cmd->add_option("--dtype", flags->dtype, "Activation dtype")->capture_default_str();
  cmd->add_option("--kv-dtype", flags->kv_dtype, "KV-cache dtype (auto = activation dtype)")->capture_default_str();
  cmd->add_option("--head-size", flags->head_size)->capture_default_str();
  cmd->add_option("--q-heads", flags->num_q_heads)->capture_default_str();
  cmd->add_option("--kv-heads", flags->num_kv_heads)->capture_default_str();
  cmd->add_option("--block-size", flags->block_size, "KV-cache (manager) block size in tokens")->capture_default_str();
  cmd->add_option("--layout", flags->layout, "Force a KV layout: fused_hnd, split_nhd, split_hnd");
  cmd->add_option("--attn-type", flags->attn_type, describe_attention_types())->capture_default_str();
  cmd->add_option("--layer-kind", flags->layer_kind, describe_kv_spec_kinds())->capture_default_str();
  cmd->add_option("--feature", flags->features, "Required feature (repeatable): " + describe_all_features());
  cmd->add_flag("--optimistic-cpu-lengths", flags->optimistic, "Host lengths are upper bounds (async speculation)");
  cmd->callback([flags, &exit_code] {
    const AttentionConfig config = to_config(*flags);
    std::cout << "config: " << config.describe() << "\n";
    Selector selector(default_registry());
    std::optional<std::string_view> name;
    if (!flags->backend.empty()) name = flags->backend;
    if (name) {
      std::cout << "mode: explicit " << *name << "\n";
      if (const BackendType* b = default_registry().find(*name)) print_candidate(*b, config);
    } else {
      std::cout << "mode: auto (priority on " << to_string(config.platform.kind) << ")\n";
      for (const BackendType* b : default_registry().priority_list(config.platform.kind)) print_candidate(*b, config);
    }
    try {
      const Selection& sel = selector.select(config, name);
      // The configuration is the "config:" line above; the selection line does not repeat it.
      std::cout << "selected: " << sel.choice_line() << "\n";
      if (const VariantCaps* variant = find_variant(sel.backend->caps(), sel.variant)) {
        std::cout << "kernel variant: " << variant->variant.name << " (" << variant->summary << ")\n";
      }
      exit_code = kExitOk;
    } catch (const SelectionError&) {
      // The answer on stdout stays complete; main() reports the error and its exit code.
      std::cout << "selected: none\n";
      throw;
    }
  });
}

}  // namespace attnkit::cli
