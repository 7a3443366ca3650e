#include "attnkit/selection/support_matrix.h"

#include <algorithm>

#include "attnkit/selection/validate.h"

namespace attnkit {

namespace {

// Markdown cells: a '|' would split the cell and a newline would end the row.
std::string cell(std::string_view text) {
  std::string out;
  for (char ch : text) {
    if (ch == '|') {
      out += "\\|";
    } else if (ch == '\n' || ch == '\r') {
      out += ' ';
    } else {
      out += ch;
    }
  }
  return out;
}

std::string yes_no(bool value) { return value ? "yes" : "no"; }

std::string combination_rules(const BackendCaps& caps) {
  if (caps.combination_rules.empty()) return "none";
  std::string out;
  for (const CombinationRule& rule : caps.combination_rules) {
    if (!out.empty()) out += "; ";
    out += std::string(rule.parameters) + ": " + std::string(rule.explanation);
  }
  return out;
}

// "small-heads (head sizes {64, 128}); large-heads (head sizes {256})" or "cpu-kernel (platforms
// cpu); cuda-kernel (platforms cuda (sm_90))": each variant in order of preference with the sets it
// narrows (a variant that narrows nothing covers the whole row). A variant's CUDA platform carries
// its compute-capability range, as the platforms column does.
std::string kernel_variants(const BackendCaps& caps) {
  if (caps.variants.empty()) return "none";
  std::string out;
  for (const VariantCaps& v : caps.variants) {
    std::vector<std::string> narrowed;
    const bool cuda_listed = std::find(v.platforms.begin(), v.platforms.end(), PlatformKind::kCuda) != v.platforms.end();
    if (!v.platforms.empty()) {
      narrowed.push_back("platforms " + supported::platforms(v.platforms, v.cuda_compute_capability.value_or(
                                                                              caps.cuda_compute_capability)));
    }
    if (v.cuda_compute_capability && !cuda_listed) {
      narrowed.push_back("compute capability " + v.cuda_compute_capability->describe());
    }
    if (!v.dtypes.empty()) narrowed.push_back("dtypes " + supported::dtypes(v.dtypes));
    if (!v.kv_cache_dtypes.empty()) narrowed.push_back("KV dtypes " + supported::dtypes(v.kv_cache_dtypes));
    if (!v.head_sizes.empty()) narrowed.push_back("head sizes " + supported::head_sizes(v.head_sizes));
    if (!v.group_sizes.empty()) narrowed.push_back("group sizes " + supported::sizes(v.group_sizes));
    if (!v.block_sizes.empty()) narrowed.push_back("block sizes " + supported::sizes(v.block_sizes));
    if (v.features) narrowed.push_back("features " + supported::features(*v.features));
    if (v.reads_whole_pages && *v.reads_whole_pages != caps.reads_whole_pages) {
      narrowed.push_back(*v.reads_whole_pages ? "reads whole pages" : "reads no slot past the length");
    }
    if (!out.empty()) out += "; ";
    out += v.variant.name;
    for (std::size_t i = 0; i < narrowed.size(); ++i) out += (i ? ", " : " (") + narrowed[i];
    if (!narrowed.empty()) out += ")";
  }
  return out;
}

std::vector<std::string> header() {
  std::vector<std::string> columns{"backend",     "platforms",       "dtypes",      "KV dtypes",
                                   "head sizes",  "block sizes",     "KV layouts",  "attention types",
                                   "layer kinds"};
  for (Feature f : kAllFeatures) columns.emplace_back(to_string(f));
  for (const char* c : {"needs exact CPU lengths", "reads whole pages", "fused KV update", "CUDA graph support", "reorder threshold",
                        "max decode query",
                        "block-table reuse", "combination rules", "kernel variants", "kernel library"}) {
    columns.emplace_back(c);
  }
  return columns;
}

std::vector<std::string> row(const BackendCaps& caps) {
  std::vector<std::string> cells{std::string(caps.name),
                                 supported::platforms(caps),
                                 supported::dtypes(caps.dtypes),
                                 supported::dtypes(caps.kv_cache_dtypes),
                                 supported::head_sizes(caps),
                                 caps.block_sizes.describe(),
                                 supported::kv_layouts(caps),
                                 supported::attention_types(caps),
                                 supported::kv_spec_kinds(caps)};
  for (Feature f : kAllFeatures) cells.push_back(yes_no(caps.features.has(f)));
  cells.push_back(yes_no(caps.needs_exact_cpu_lengths));
  cells.push_back(yes_no(caps.reads_whole_pages));
  cells.push_back(yes_no(caps.forward_includes_kv_update));
  cells.emplace_back(to_string(caps.cudagraph_support));
  cells.push_back(caps.reorder_batch_threshold ? std::to_string(*caps.reorder_batch_threshold) : "none");
  cells.push_back(caps.reorder_batch_threshold ? std::to_string(caps.max_decode_query_len) : "n/a");
  cells.push_back(yes_no(caps.supports_update_block_table));
  cells.push_back(combination_rules(caps));
  cells.push_back(kernel_variants(caps));
  cells.emplace_back(caps.library.empty() ? std::string("attnkit") : std::string(caps.library));
  return cells;
}

void append_row(std::string& out, const std::vector<std::string>& cells) {
  out += "|";
  for (const std::string& c : cells) out += " " + cell(c) + " |";
  out += "\n";
}

}  // namespace

std::string support_matrix_markdown(const BackendRegistry& registry) {
  std::string out =
      "<!-- Generated by `attnkit matrix` from the backends' capability declarations; do not edit by hand. "
      "Regenerate: build/attnkit matrix > docs/support-matrix.md -->\n"
      "# Attention backend support matrix\n\n";
  const std::vector<std::string> columns = header();
  append_row(out, columns);
  append_row(out, std::vector<std::string>(columns.size(), "---"));
  for (const BackendType& type : registry.backends()) append_row(out, row(type.caps()));
  return out;
}

}  // namespace attnkit
