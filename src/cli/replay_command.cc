#include <filesystem>
#include <iostream>
#include <system_error>

#include "attnkit/core/error.h"
#include "attnkit/replay/replay.h"
#include "attnkit/selection/platform_choice.h"
#include "commands.h"

namespace attnkit::cli {

void add_replay_command(CLI::App& app, int& exit_code) {
  struct Flags {
    std::string dir;
    std::string backend;
    std::string out_dir;
    std::string platform = "auto";
    bool lse = false;
    bool no_check = false;
    bool verbose = false;
    int context_parallel = 1;
    int cp_interleave = 1;
  };
  auto flags = std::make_shared<Flags>();
  auto* cmd = app.add_subcommand(
      "replay",
      "Replay a recorded batch (docs/replay-format.md): KV update through the slot mapping, then attention. Writes "
      "out.npy, lse.npy (with --lse) and metadata.json.");
  cmd->add_option("DIR", flags->dir, "Directory with batch.json and q/k/v/k_cache/v_cache.npy")->required();
  cmd->add_option("--backend", flags->backend, "Explicit backend (default: auto selection)");
  cmd->add_option("--platform", flags->platform,
                  "auto (where --backend runs; without one the GPU when there is one), cpu or cuda")
      ->capture_default_str();
  cmd->add_flag("--lse", flags->lse, "Also write lse.npy [tokens, q_heads] (natural log)");
  cmd->add_option("--out", flags->out_dir, "Where to write the results, created with its parents (default: DIR)");
  cmd->add_flag("--no-check", flags->no_check, "Skip the V1-V9 invariant checker");
  cmd->add_flag("-v,--verbose", flags->verbose, "Log selection and KV-group negotiation");
  cmd->add_option("--context-parallel", flags->context_parallel,
                  "Replay as this many context-parallel ranks (threads, each holding its share of the KV; "
                  "the record's page_size must be a multiple of ranks x --cp-interleave)")
      ->capture_default_str();
  cmd->add_option("--cp-interleave", flags->cp_interleave, "Consecutive positions per rank turn")->capture_default_str();
  cmd->callback([flags, &exit_code] {
    const BatchRecord record = load_batch_record(flags->dir);
    ReplayOptions options;
    options.platform = choose_platform(flags->platform, flags->backend, "--platform");
    if (!flags->backend.empty()) options.backend = flags->backend;
    options.want_lse = flags->lse;
    options.check_invariants = !flags->no_check;
    options.context_parallel_size = flags->context_parallel;
    options.context_parallel_interleave = flags->cp_interleave;
    if (flags->verbose) options.log = [](std::string_view line) { std::cerr << line << "\n"; };
    const ReplayResult result = replay_batch(record, options);
    const std::string out = flags->out_dir.empty() ? flags->dir : flags->out_dir;
    // Only now, after the replay succeeded: a failed replay leaves no output directory behind.
    std::error_code ec;
    std::filesystem::create_directories(out, ec);
    if (ec) throw Error("--out", out, "a directory that exists or can be created", ec.message());
    write_replay_result(out, result);
    std::cout << "platform " << options.platform.describe() << ", backend " << result.backend << ", kernel "
              << result.variant << "; "
              << (options.context_parallel_size > 1
                      ? std::to_string(options.context_parallel_size) + " context-parallel ranks (interleave " +
                            std::to_string(options.context_parallel_interleave) + "), the same output on each; "
                      : std::string())
              << record.requests.size() << " requests, " << record.num_tokens() << " tokens"
              << (options.check_invariants ? "; invariants V1-V9 hold" : "") << "\n"
              << "wrote " << out << "/out.npy" << (flags->lse ? ", lse.npy" : "") << ", metadata.json\n";
    exit_code = kExitOk;
  });
}

}  // namespace attnkit::cli
