#pragma once
// Simulation workloads: replay of the Azure LLM inference trace CSV format
// (TIMESTAMP, ContextTokens, GeneratedTokens), time-compressed by a rate
// multiplier, or synthetic Poisson / bursty arrivals. Seeded; deterministic.

#include <cstdint>
#include <string>
#include <vector>

#include "chaos/sim_scenario.hpp"
#include "common/error.hpp"

namespace exa::chaos {

/// Bounds on a workload (habit 7): a trace file's size and rows, and the
/// requests of any workload (the scenario parser checks synthetic rates
/// against it; load_azure_trace refuses replays that would pass it).
inline constexpr std::uint64_t max_trace_bytes = std::uint64_t{256} << 20;
inline constexpr std::uint64_t max_workload_rows = 10'000'000;
/// Largest token count of one trace row.
inline constexpr std::uint32_t max_trace_tokens = 1u << 20;

/// A run of token ids that stands for one piece of a prompt (a system
/// prompt, a user turn, an earlier answer): equal keys, equal ids.
struct token_segment {
  std::uint64_t key = 0;
  std::uint32_t tokens = 0;
};

struct sim_request {
  double at_s = 0;                 // arrival, from the start of the run
  std::uint32_t prompt_tokens = 0;
  std::uint32_t max_tokens = 0;    // tokens to generate (the trace's GeneratedTokens)
  std::string tenant;              // "" unless the workload names tenants
  /// The prompt as segments (their tokens add up to prompt_tokens); empty:
  /// a prompt of the request's own that shares nothing with another.
  std::vector<token_segment> segments;
};

/// The prompt's token ids from its segments: a deterministic function of
/// each segment's key and position, in [3, vocab) (ids 0..2 are special).
std::vector<std::int32_t> segment_prompt_ids(const std::vector<token_segment>& segments, std::uint32_t vocab);

/// Turns independent trace rows into multi-turn conversations, keeping every
/// row's arrival, prompt and output length (seeded, deterministic). Rows in
/// time order; each row either
///   - continues an open conversation (with continue_probability, when one
///     whose history -- last prompt plus last answer, L tokens -- is shorter
///     than the row's prompt C; uniformly among those): its prompt is the
///     history followed by C - L new user tokens; or
///   - starts one: an application drawn uniformly, whose system prompt (the
///     first min(system_prompt_tokens, C - 1) tokens, the same for every
///     conversation of that application) is followed by user tokens.
/// An answer is a segment of its own with the length the trace generated
/// (the simulated engine's tokens differ; the engine caches prompt blocks
/// only, so the next turn's prompt holds the answer as new tokens either way).
/// At most open_max conversations stay open (the oldest is forgotten), each
/// for at most turns_max turns.
void make_conversations(std::vector<sim_request>& requests, const conversation_spec& spec, std::uint64_t seed);

/// Parses an Azure-format CSV (header TIMESTAMP,ContextTokens,GeneratedTokens;
/// timestamps "YYYY-MM-DD HH:MM:SS.fffffff"). Arrival times are offsets from
/// the first row divided by `rate_multiplier`; rows beyond `duration_s` are
/// dropped; if the trace (compressed) is shorter than the duration it is
/// replayed again from its start (shifted), so an hour at 20x is 20 copies.
/// Errors (corrupt_data) name the line and column; zero-token rows are kept
/// as 1 token. Rows must be in time order. The replay period is the
/// compressed span plus one mean gap between rows, so the seam between copies
/// keeps the trace's average rate. Refused (invalid_argument): files over
/// max_trace_bytes, more than max_workload_rows rows or requests, a rate
/// multiplier or duration that is not positive; io_error: unreadable file.
expected<std::vector<sim_request>> load_azure_trace(const std::string& path, double rate_multiplier,
                                                    double duration_s);

/// Poisson arrivals at rate_per_s, or (bursty) a Poisson process whose rate
/// is a square wave of period burst_period_s: burst_factor times the mean for
/// the first 1/(burst_factor + 1) of each period, 1/burst_factor of the mean
/// for the rest -- so the mean is exactly rate_per_s and the peak is
/// burst_factor times it -- drawn by thinning. Prompt and output lengths are
/// the spec's jittered uniformly within ±25% (at least 1). Any kind other than
/// bursty is Poisson. At most max_workload_rows requests.
std::vector<sim_request> synthetic_workload(const sim_workload_spec& w, double duration_s, std::uint64_t seed);

/// The diurnal curve at `t_s` (sim_workload_spec::diurnal_*): 1 without one.
double diurnal_factor(const sim_workload_spec& w, double t_s);

/// The workload of a scenario, whichever kind it is, thinned by its diurnal
/// curve when it has one.
expected<std::vector<sim_request>> make_workload(const scenario& s, std::uint64_t seed);

}  // namespace exa::chaos
