// The attnkit binary as a user meets it: exit codes, what it prints, the replay round trip
// against the independent dense attention, and bad input that must fail cleanly, naming the field.
// Exit codes, every subcommand alike: 0 ok, 1 invalid configuration or input, 2 usage, 3 internal.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "attnkit/invariants/checker.h"
#include "attnkit/replay/batch_record.h"
#include "attnkit/replay/npy.h"
#include "attnkit/selection/registry.h"
#include "attnkit/selection/selector.h"
#include "attnkit/selection/validate.h"
#include "cli/cli_runner.h"
#include "cli/exit_codes.h"
#include "support/random_batch.h"

namespace attnkit::testing {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

template <class T>
bool contains(const std::vector<T>& values, const T& value) {
  return std::find(values.begin(), values.end(), value) != values.end();
}

// --- demo, help, backends, select ----------------------------------------------------------------

TEST(CliDemo, ReproducesTheWorkedExample) {
  const CliRun run = run_cli({"demo"});
  EXPECT_EQ(run.exit_code, 0) << run.both();
  EXPECT_TRUE(has(run.out, "worked example numbers: match docs/design.md")) << run.out;
  EXPECT_TRUE(has(run.out, "demo: ok")) << run.out;
  EXPECT_FALSE(has(run.out, "MISMATCH")) << run.out;
}

TEST(CliHelp, EverySubcommandExplainsItselfAndExitsZero) {
  for (const std::string sub : {"demo", "backends", "matrix", "select", "replay", "make-model"}) {
    const CliRun run = run_cli({sub, "--help"});
    EXPECT_EQ(run.exit_code, 0) << sub << ": " << run.both();
    EXPECT_TRUE(has(run.both(), sub)) << sub << " help does not name the subcommand: " << run.both();
  }
  const CliRun top = run_cli({"--help"});
  EXPECT_EQ(top.exit_code, 0) << top.both();
  EXPECT_TRUE(has(top.both(), "replay")) << top.both();
}

TEST(CliHelp, StatesTheExitCodesAtTheTopAndForEverySubcommand) {
  const std::string footer = "Exit codes: 0 ok, 1 invalid configuration or input, 2 usage, 3 internal error";
  const CliRun top = run_cli({"--help"});
  EXPECT_TRUE(has(top.out, footer)) << top.out;
  for (const std::string sub : {"demo", "backends", "matrix", "select", "replay", "make-model"}) {
    EXPECT_TRUE(has(run_cli({sub, "--help"}).out, footer)) << sub;
  }
}

TEST(CliBackends, ListsEveryRegisteredBackendOnePerLine) {
  const CliRun run = run_cli({"backends"});
  ASSERT_EQ(run.exit_code, 0) << run.both();
  const std::vector<std::string> lines = lines_of(run.out);
  EXPECT_EQ(lines.size(), registered_backends().size()) << run.out;
  for (const BackendType& b : registered_backends()) {
    const std::string name(b.name());
    const auto line = std::find_if(lines.begin(), lines.end(), [&](const std::string& l) {
      return l.rfind(name, 0) == 0 && (l.size() == name.size() || std::isspace(static_cast<unsigned char>(l[name.size()])));
    });
    ASSERT_NE(line, lines.end()) << name << " missing from:\n" << run.out;
    // Every registered backend runs on the CPU in this build.
    EXPECT_TRUE(has(*line, "available")) << *line;
  }
}

TEST(CliSelect, ExplicitBackendWithUnsupportedHeadSizeNamesParameterValueAndSupportedSet) {
  const BackendType* varlen = find_backend("VARLEN");
  ASSERT_NE(varlen, nullptr);
  ASSERT_FALSE(contains(varlen->caps().head_sizes, 72));
  const CliRun run = run_cli({"select", "--backend", "VARLEN", "--head-size", "72"});
  EXPECT_EQ(run.exit_code, 1) << run.both();
  EXPECT_FALSE(run.crashed);
  EXPECT_TRUE(has(run.both(), "head_size")) << run.both();
  EXPECT_TRUE(has(run.both(), "72")) << run.both();
  EXPECT_TRUE(has(run.both(), supported::head_sizes(varlen->caps()))) << run.both();
}

TEST(CliSelect, AutoSelectionExitsZeroAndNamesTheBackend) {
  const CliRun run = run_cli({"select"});
  EXPECT_EQ(run.exit_code, 0) << run.both();
  const auto lines = lines_of(run.out);
  const auto selected = std::find_if(lines.begin(), lines.end(), [](const std::string& l) { return l.rfind("selected:", 0) == 0; });
  ASSERT_NE(selected, lines.end()) << run.out;
  EXPECT_FALSE(has(*selected, "none")) << *selected;
  bool names_one = false;
  for (const BackendType& b : registered_backends()) names_one = names_one || has(*selected, std::string(b.name()));
  EXPECT_TRUE(names_one) << *selected;
}

TEST(CliSelect, APinnedKernelVariantRunsOrIsRefusedWithItsReasons) {
  const CliRun pinned = run_cli({"select", "--backend", "VARLEN:cpu-online-softmax", "--platform", "cpu"});
  EXPECT_EQ(pinned.exit_code, 0) << pinned.both();
  EXPECT_TRUE(has(pinned.out, "kernel cpu-online-softmax (explicit, variant pinned)")) << pinned.out;
  const CliRun refused = run_cli({"select", "--backend", "VARLEN:cuda-mma-kv16", "--platform", "cpu"});
  EXPECT_EQ(refused.exit_code, 1) << refused.both();
  EXPECT_FALSE(refused.crashed);
  EXPECT_TRUE(has(refused.both(), "by kernel variant cuda-mma-kv16")) << refused.both();
}

TEST(CliSelect, UnknownBackendFailsListingTheRegisteredNames) {
  const CliRun run = run_cli({"select", "--backend", "NOPE"});
  EXPECT_EQ(run.exit_code, 1) << run.both();
  EXPECT_FALSE(run.crashed);
  EXPECT_TRUE(has(run.both(), "NOPE")) << run.both();
  for (const BackendType& b : registered_backends()) EXPECT_TRUE(has(run.both(), std::string(b.name()))) << run.both();
}

// --- exit codes --------------------------------------------------------------------------------

TEST(CliExitCode, ZeroForEverySubcommandThatSucceeds) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"backends"}, {"matrix"}, {"select"}, {"select", "--backend", "REFERENCE"}}) {
    const CliRun run = run_cli(args);
    EXPECT_EQ(run.exit_code, 0) << args.front() << ": " << run.both();
    EXPECT_FALSE(has(run.err, "attnkit:")) << run.err;
  }
}

TEST(CliExitCode, OneForAFlagValueTheLibraryRejectsNamingTheFlag) {
  const CliRun run = run_cli({"select", "--dtype", "float7"});
  EXPECT_EQ(run.exit_code, 1) << run.both();
  EXPECT_TRUE(has(run.err, "attnkit: error: --dtype = float7 is invalid")) << run.err;
}

TEST(CliExitCode, OneWhenAutoSelectionFindsNoBackend) {
  const CliRun run = run_cli({"select", "--head-size", "7"});  // no registered backend has head size 7
  EXPECT_EQ(run.exit_code, 1) << run.both();
  EXPECT_TRUE(has(run.out, "selected: none")) << run.out;
  for (const BackendType* b : default_registry().priority_list(PlatformKind::kCpu)) {
    EXPECT_TRUE(has(run.err, std::string(b->name()) + ":")) << "every candidate's reasons: " << run.err;
  }
}

TEST(CliExitCode, OneWhenTheReplayInputCannotBeRead) {
  const CliScratch dir("empty");
  for (const std::string& input : {dir.path(), dir.sub("no_such_directory")}) {
    const CliRun run = run_cli({"replay", input});
    EXPECT_EQ(run.exit_code, 1) << input << ": " << run.both();
    EXPECT_TRUE(has(run.err, "batch.json")) << run.err;
  }
}

TEST(CliExitCode, TwoForEveryUsageError) {
  const std::vector<std::vector<std::string>> usage_errors = {
      {},                                 // no subcommand
      {"frobnicate"},                     // unknown subcommand
      {"select", "--no-such-flag"},       // unknown flag
      {"select", "--head-size"},          // flag without its value
      {"select", "--head-size", "many"},  // value of the wrong type
      {"replay"},                         // missing positional argument
  };
  for (const auto& args : usage_errors) {
    std::string line = "attnkit";
    for (const auto& a : args) line += " " + a;
    const CliRun run = run_cli(args);
    EXPECT_EQ(run.exit_code, 2) << line << ": " << run.both();
    EXPECT_FALSE(run.err.empty()) << line << " says nothing about what is wrong";
  }
}

// No input makes attnkit fail unexpectedly on purpose, so the mapping main() applies to whatever a
// subcommand throws is checked directly.
TEST(CliExitCode, ThreeAndInternalErrorForAnExceptionThatIsNotAnAttnkitError) {
  std::ostringstream err;
  EXPECT_EQ(cli::report_failure(std::make_exception_ptr(std::logic_error("unexpected state")), err), 3);
  EXPECT_EQ(err.str(), "attnkit: internal error: unexpected state\n");
  std::ostringstream err_of_non_std;
  EXPECT_EQ(cli::report_failure(std::make_exception_ptr(42), err_of_non_std), 3);
  EXPECT_EQ(err_of_non_std.str().rfind("attnkit: internal error: ", 0), 0u) << err_of_non_std.str();
}

TEST(CliExitCode, OneForEveryAttnkitErrorIncludingFailedSelectionsAndInvariants) {
  std::ostringstream err;
  EXPECT_EQ(cli::report_failure(std::make_exception_ptr(Error("page_size", "0", ">= 1")), err), 1);
  EXPECT_EQ(err.str(), "attnkit: error: page_size = 0 is invalid (allowed: >= 1)\n");
  EXPECT_EQ(cli::report_failure(std::make_exception_ptr(SelectionError("no backend", "auto", "none", {})), err), 1);
  EXPECT_EQ(cli::report_failure(std::make_exception_ptr(InvariantError(std::vector<Violation>{{5, "kernel block 99 out of range"}})), err), 1);
  EXPECT_TRUE(has(err.str(), "V5: kernel block 99 out of range")) << err.str();
}

// --- replay round trip -------------------------------------------------------------------------

std::vector<const BackendType*> cpu_attention_backends() {
  std::vector<const BackendType*> out;
  for (const BackendType& b : registered_backends()) {
    const BackendCaps& c = b.caps();
    if (contains(c.kv_spec_kinds, KVSpecKind::kFullAttention) && contains(c.platforms, PlatformKind::kCpu)) out.push_back(&b);
  }
  return out;
}

// A record inside `caps`: its first dtype and KV dtype, smallest head size, a page size it
// accepts, decoder when it has one; mixed lengths over random pages.
BatchRecord record_within(const BackendCaps& caps, std::mt19937& rng) {
  RandomBatchOptions o;
  o.dtype = caps.dtypes.front();
  o.kv_dtype = caps.kv_cache_dtypes.back();  // the last is fp8 for most backends: scales travel too
  if (is_fp8(o.kv_dtype)) {
    o.k_scale = 0.25f;
    o.v_scale = 0.5f;
  }
  o.head_size = *std::min_element(caps.head_sizes.begin(), caps.head_sizes.end());
  o.page_size = caps.block_sizes.sizes.empty() ? caps.block_sizes.multiple_of * ((16 + caps.block_sizes.multiple_of - 1) / caps.block_sizes.multiple_of)
                                               : caps.block_sizes.sizes.front();
  o.num_q_heads = 4;
  o.num_kv_heads = 2;
  o.causal = contains(caps.attention_types, AttentionType::kDecoder);
  o.min_reqs = 3;
  o.max_reqs = 4;
  o.max_seq_len = 70;
  return random_batch(rng, o);
}

TEST(CliReplay, RoundTripOfEveryCpuAttentionBackendMatchesDenseAttention) {
  std::mt19937 rng(11);
  const auto backends = cpu_attention_backends();
  ASSERT_FALSE(backends.empty());
  for (const BackendType* b : backends) {
    const std::string name(b->name());
    SCOPED_TRACE(name);
    const BatchRecord record = record_within(b->caps(), rng);
    const CliScratch dir("record");
    save_batch_record(dir.path(), record);
    const CliRun run = run_cli({"replay", dir.path(), "--backend", name, "--lse"});
    ASSERT_EQ(run.exit_code, 0) << run.both();
    EXPECT_TRUE(has(run.out, name)) << run.out;

    // Outputs against the independent dense attention; the CLI computed in record.dtype.
    const DenseResult ref = dense_attention(dense_problem_of(record));
    const NpyArray out = read_npy(dir.sub("out.npy"));
    const NpyArray lse = read_npy(dir.sub("lse.npy"));
    const std::int64_t tokens = record.num_tokens();
    ASSERT_EQ(out.shape, (std::vector<std::int64_t>{tokens, record.num_q_heads, record.head_size}));
    ASSERT_EQ(lse.shape, (std::vector<std::int64_t>{tokens, record.num_q_heads}));
    const HostTensor out_t = to_host_tensor(out, DType::kFloat32, "out.npy");
    const HostTensor lse_t = to_host_tensor(lse, DType::kFloat32, "lse.npy");
    double max_ref = 0.5;
    for (double x : ref.out) max_ref = std::max(max_ref, std::fabs(x));
    const double rel = record.dtype == DType::kFloat32 ? 1e-4 : record.dtype == DType::kFloat16 ? 4.0 / 1024 : 4.0 / 128;
    for (std::int64_t i = 0; i < out_t.view().numel(); ++i) {
      ASSERT_NEAR(out_t.view().flat(i), ref.out[static_cast<std::size_t>(i)], rel * max_ref) << "out element " << i;
    }
    for (std::int64_t i = 0; i < lse_t.view().numel(); ++i) {
      ASSERT_NEAR(lse_t.view().flat(i), ref.lse[static_cast<std::size_t>(i)], 1e-3) << "lse element " << i;
    }

    // metadata.json: the backend that ran and the common metadata of G3, in the runner's order.
    std::ifstream f(dir.sub("metadata.json"));
    const Json md = Json::parse(f);
    EXPECT_EQ(md.at("backend"), name);
    const std::vector<int> order = md.at("reorder").get<std::vector<int>>();
    ASSERT_EQ(order.size(), record.requests.size());
    EXPECT_TRUE(std::is_permutation(order.begin(), order.end(), std::vector<int>{[&] {
                                      std::vector<int> ids(order.size());
                                      for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int>(i);
                                      return ids;
                                    }()}.begin()));
    const Json& common = md.at("common");
    std::vector<int> qsl{0}, seq_lens;
    std::vector<std::int64_t> slots;
    int max_q = 0, max_seq = 0;
    Json rows = Json::object();
    for (int old : order) {
      const RecordedRequest& q = record.requests[static_cast<std::size_t>(old)];
      qsl.push_back(qsl.back() + q.query_len);
      seq_lens.push_back(q.seq_len);
      max_q = std::max(max_q, q.query_len);
      max_seq = std::max(max_seq, q.seq_len);
      const int pages = (q.seq_len + record.page_size - 1) / record.page_size;
      rows["request_" + std::to_string(rows.size())] = std::vector<int>(q.blocks.begin(), q.blocks.begin() + pages);
      for (int pos = q.seq_len - q.query_len; pos < q.seq_len; ++pos)
        slots.push_back(static_cast<std::int64_t>(q.blocks[static_cast<std::size_t>(pos / record.page_size)]) * record.page_size +
                        pos % record.page_size);
    }
    EXPECT_EQ(common.at("query_start_loc").get<std::vector<int>>(), qsl);
    EXPECT_EQ(common.at("query_start_loc_cpu").get<std::vector<int>>(), qsl);
    EXPECT_EQ(common.at("seq_lens").get<std::vector<int>>(), seq_lens);
    EXPECT_EQ(common.at("num_reqs"), static_cast<int>(record.requests.size()));
    EXPECT_EQ(common.at("num_actual_tokens"), tokens);
    EXPECT_EQ(common.at("max_query_len"), max_q);
    EXPECT_EQ(common.at("max_seq_len"), max_seq);
    EXPECT_EQ(common.at("causal"), record.causal);
    ASSERT_EQ(common.at("kernel_block_size"), record.page_size) << "pages are within the caps: no split expected";
    EXPECT_EQ(common.at("block_table"), rows);
    EXPECT_EQ(common.at("slot_mapping").get<std::vector<std::int64_t>>(), slots);
  }
}

// D1 through the tool: the record's KV dealt to context-parallel ranks (threads), each rank's
// partial merged by LSE; the output is the unsplit one, and a page the ranks cannot share evenly
// is refused naming the field.
TEST(CliReplay, ContextParallelRanksReproduceDenseAttention) {
  std::mt19937 rng(23);
  RandomBatchOptions o;
  o.dtype = DType::kFloat32;
  o.kv_dtype = DType::kFloat32;
  o.page_size = 32;
  o.num_q_heads = 4;
  o.num_kv_heads = 2;
  o.min_reqs = 3;
  o.max_reqs = 4;
  o.max_seq_len = 90;
  o.sinks = true;
  o.alibi = true;
  const BatchRecord record = random_batch(rng, o);
  const CliScratch dir("record_cp");
  save_batch_record(dir.path(), record);
  const CliRun run = run_cli({"replay", dir.path(), "--backend", "REFERENCE", "--platform", "cpu", "--lse",
                              "--context-parallel", "2", "--cp-interleave", "4"});
  ASSERT_EQ(run.exit_code, 0) << run.both();
  EXPECT_TRUE(has(run.out, "2 context-parallel ranks (interleave 4)")) << run.out;
  const DenseResult ref = dense_attention(dense_problem_of(record));
  const HostTensor out = to_host_tensor(read_npy(dir.sub("out.npy")), DType::kFloat32, "out.npy");
  const HostTensor lse = to_host_tensor(read_npy(dir.sub("lse.npy")), DType::kFloat32, "lse.npy");
  for (std::int64_t i = 0; i < out.view().numel(); ++i) {
    ASSERT_NEAR(out.view().flat(i), ref.out[static_cast<std::size_t>(i)], 1e-4) << "out element " << i;
  }
  for (std::int64_t i = 0; i < lse.view().numel(); ++i) {
    ASSERT_NEAR(lse.view().flat(i), ref.lse[static_cast<std::size_t>(i)], 1e-4) << "lse element " << i;
  }
  const CliRun uneven = run_cli({"replay", dir.path(), "--backend", "REFERENCE", "--platform", "cpu",
                                 "--context-parallel", "3"});
  EXPECT_NE(uneven.exit_code, 0);
  EXPECT_TRUE(has(uneven.both(), "context_parallel.interleave")) << uneven.both();
}

TEST(CliReplay, OutIntoADirectoryThatDoesNotExistCreatesItWithItsParents) {
  std::mt19937 rng(13);
  const CliScratch dir("record");
  save_batch_record(dir.path(), record_within(find_backend("REFERENCE")->caps(), rng));
  const CliScratch scratch("out");
  const std::string out = scratch.sub("results/run 1/reference");
  ASSERT_FALSE(fs::exists(scratch.sub("results")));
  const CliRun run = run_cli({"replay", dir.path(), "--backend", "REFERENCE", "--lse", "--out", out});
  ASSERT_EQ(run.exit_code, 0) << run.both();
  for (const char* file : {"out.npy", "lse.npy", "metadata.json"}) {
    EXPECT_TRUE(fs::is_regular_file(fs::path(out) / file)) << file;
    EXPECT_FALSE(fs::exists(dir.sub(file))) << file << " written beside the input instead of into --out";
  }
}

TEST(CliReplay, OutThatIsAFileIsInvalidInputNamingTheFlag) {
  std::mt19937 rng(14);
  const CliScratch dir("record");
  save_batch_record(dir.path(), record_within(find_backend("REFERENCE")->caps(), rng));
  const std::string file = dir.sub("batch.json");
  const CliRun run = run_cli({"replay", dir.path(), "--out", file + "/results"});
  EXPECT_EQ(run.exit_code, 1) << run.both();
  EXPECT_TRUE(has(run.err, "--out")) << run.err;
}

// --- bad input ---------------------------------------------------------------------------------

// A valid record: float32, head size 64, page 16, three or more requests.
BatchRecord base_record() {
  std::mt19937 rng(12);
  RandomBatchOptions o;
  o.min_reqs = 3;
  o.max_reqs = 3;
  o.max_seq_len = 50;
  return random_batch(rng, o);
}

Json read_json(const std::string& path) {
  std::ifstream f(path);
  return Json::parse(f);
}
void write_json(const std::string& path, const Json& j) { std::ofstream(path) << j.dump(2); }

struct BadInput {
  std::string name;
  std::function<void(const std::string& dir, const BatchRecord& record)> spoil;
  std::string field;  // the error must name it
  std::vector<std::string> extra_args;
};

TEST(CliReplay, BadInputFailsCleanlyNamingTheFieldAndWritesNoOutput) {
  const BatchRecord record = base_record();
  const auto edit = [](std::function<void(Json&, const BatchRecord&)> change) {
    return [change](const std::string& dir, const BatchRecord& r) {
      Json j = read_json(dir + "/batch.json");
      change(j, r);
      write_json(dir + "/batch.json", j);
    };
  };
  const BackendType* reference = find_backend("REFERENCE");
  ASSERT_NE(reference, nullptr);
  ASSERT_FALSE(contains(reference->caps().head_sizes, 72));
  const std::vector<BadInput> cases = {
      {"missing field", edit([](Json& j, const BatchRecord&) { j.erase("head_size"); }), "head_size", {}},
      {"wrong npy shape",
       [](const std::string& dir, const BatchRecord& r) {
         HostTensor q(DType::kFloat32, {r.num_tokens(), r.num_q_heads, r.head_size + 1});
         q.fill(0.5f);
         write_npy(dir + "/q.npy", q.view());
       },
       "q.npy", {}},
      {"block id out of range",
       edit([](Json& j, const BatchRecord& r) { j["requests"][0]["blocks"][0] = r.num_blocks() + 5; }),
       "requests[0].blocks[0]", {}},
      {"block shared between requests",
       edit([](Json& j, const BatchRecord&) { j["requests"][1]["blocks"][0] = j["requests"][0]["blocks"][0]; }),
       "requests[1].blocks[0]", {}},
      {"seq_len < query_len",
       edit([](Json& j, const BatchRecord& r) { j["requests"][2]["seq_len"] = r.requests[2].query_len - 1; }),
       "requests[2].seq_len", {}},
      {"too few blocks for seq_len",
       edit([](Json& j, const BatchRecord& r) {
         const int needed = (r.requests[0].seq_len + r.page_size - 1) / r.page_size;
         Json& blocks = j["requests"][0]["blocks"];
         while (static_cast<int>(blocks.size()) >= needed) blocks.erase(blocks.size() - 1);
       }),
       "requests[0].blocks", {}},
      {"non-numeric field", edit([](Json& j, const BatchRecord&) { j["page_size"] = "sixteen"; }), "page_size", {}},
      {"explicit backend that cannot run the config",
       [](const std::string& dir, const BatchRecord& r) {
         // A head size no REFERENCE kernel has, with tensors of that head size, so loading passes.
         BatchRecord odd = r;
         odd.head_size = 72;
         std::mt19937 rng(5);
         std::normal_distribution<float> normal;
         auto refill = [&](HostTensor& t) {
           auto dims = t.dims();
           dims.back() = 72;
           t = HostTensor(DType::kFloat32, dims);
           for (std::int64_t i = 0; i < t.view().numel(); ++i) t.view().set_flat(i, normal(rng));
         };
         for (HostTensor* t : {&odd.q, &odd.k, &odd.v, &odd.k_cache, &odd.v_cache}) refill(*t);
         save_batch_record(dir, odd);
       },
       "head_size", {"--backend", "REFERENCE"}},
  };
  for (const BadInput& c : cases) {
    SCOPED_TRACE(c.name);
    const CliScratch dir("bad");
    save_batch_record(dir.path(), record);
    c.spoil(dir.path(), record);
    std::vector<std::string> args{"replay", dir.path()};
    args.insert(args.end(), c.extra_args.begin(), c.extra_args.end());
    const CliRun run = run_cli(args);
    EXPECT_FALSE(run.crashed) << run.both();
    EXPECT_EQ(run.exit_code, 1) << run.both();
    EXPECT_TRUE(has(run.err, c.field)) << "stderr does not name " << c.field << ":\n" << run.err;
    EXPECT_FALSE(fs::exists(dir.sub("out.npy"))) << "a failed replay wrote out.npy";
    EXPECT_FALSE(fs::exists(dir.sub("metadata.json")));
  }
  // The unspoiled record replays, so each failure above is due to its one change.
  const CliScratch dir("good");
  save_batch_record(dir.path(), record);
  const CliRun good = run_cli({"replay", dir.path(), "--backend", "REFERENCE"});
  EXPECT_EQ(good.exit_code, 0) << good.both();
  EXPECT_TRUE(fs::exists(dir.sub("out.npy")));
}

}  // namespace
}  // namespace attnkit::testing
