// The flags of an aggregator run, shared by `tern server` and `tern run --mode=federated|
// local-sgd|ps` (which passes them on to the server it starts): every flag defined in
// aggregator_flags.cc is both commands' (cli/command_table.cc); and what the server makes of
// them.
#ifndef TERN_CLI_AGGREGATOR_FLAGS_H_
#define TERN_CLI_AGGREGATOR_FLAGS_H_

#include <cstdint>
#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "clients/flags/flag_types.h"
#include "server/service.h"

ABSL_DECLARE_FLAG(std::string, mode);
ABSL_DECLARE_FLAG(tern::Int<tern::AtLeast(1)>, rounds);
ABSL_DECLARE_FLAG(tern::Int<tern::AtLeast(1)>, clients_per_round);
ABSL_DECLARE_FLAG(tern::Int<tern::AtLeast(0)>, min_clients);
ABSL_DECLARE_FLAG(tern::Int<tern::AtLeast(0)>, min_replies);
ABSL_DECLARE_FLAG(tern::Double<tern::AtLeast(0)>, grace_s);
ABSL_DECLARE_FLAG(tern::Double<tern::Above(0)>, round_deadline_s);
ABSL_DECLARE_FLAG(tern::Double<tern::AtLeast(0)>, learned_deadline_k);
ABSL_DECLARE_FLAG(tern::Double<tern::Above(0)>, deadline_floor_s);
ABSL_DECLARE_FLAG(tern::Double<tern::In(0, 1)>, staleness_decay);
ABSL_DECLARE_FLAG(tern::Int<tern::AtLeast(0)>, max_staleness);
ABSL_DECLARE_FLAG(tern::Int<tern::AtLeast(1)>, buffer);
ABSL_DECLARE_FLAG(tern::Int<tern::AtLeast(0)>, concurrency);
ABSL_DECLARE_FLAG(std::string, staleness);
ABSL_DECLARE_FLAG(std::string, sampling);
ABSL_DECLARE_FLAG(tern::Int<tern::AtLeast(1)>, edge_rounds);
ABSL_DECLARE_FLAG(tern::Double<tern::AtLeast(0)>, dp_clip);
ABSL_DECLARE_FLAG(tern::Double<tern::AtLeast(0)>, dp_noise);
ABSL_DECLARE_FLAG(tern::Double<tern::Open(0, 1)>, dp_delta);
ABSL_DECLARE_FLAG(tern::Double<tern::AtLeast(0)>, dp_epsilon_budget);
ABSL_DECLARE_FLAG(tern::Double<tern::AtLeast(0)>, dp_clip_quantile);
ABSL_DECLARE_FLAG(tern::Double<tern::AtLeast(0)>, dp_clip_lr);
ABSL_DECLARE_FLAG(tern::Double<tern::AtLeast(0)>, dp_clip_count_noise);
ABSL_DECLARE_FLAG(bool, secagg);
ABSL_DECLARE_FLAG(tern::Int<tern::AtLeast(2)>, secagg_neighbours);
ABSL_DECLARE_FLAG(tern::Int<tern::AtLeast(0)>, secagg_threshold);
ABSL_DECLARE_FLAG(tern::Int<tern::AtLeast(8)>, secagg_bits);
ABSL_DECLARE_FLAG(tern::Int<tern::AtLeast(0)>, secagg_levels);
ABSL_DECLARE_FLAG(tern::Double<tern::Above(0)>, secagg_range);
ABSL_DECLARE_FLAG(tern::Double<tern::Above(0)>, secagg_stage_timeout_s);
ABSL_DECLARE_FLAG(std::string, rule);
ABSL_DECLARE_FLAG(tern::Double<tern::AtLeast(0)>, server_lr);
ABSL_DECLARE_FLAG(tern::Int<tern::AtLeast(0)>, eval_every);
ABSL_DECLARE_FLAG(tern::Double<tern::HalfOpen(0, 1)>, server_momentum);
ABSL_DECLARE_FLAG(std::string, downstream);
ABSL_DECLARE_FLAG(std::string, downstream_codec);
ABSL_DECLARE_FLAG(std::string, update_codec);
ABSL_DECLARE_FLAG(bool, error_feedback);
ABSL_DECLARE_FLAG(std::string, memory);
ABSL_DECLARE_FLAG(tern::Int<tern::AtLeast(0)>, local_epochs);
ABSL_DECLARE_FLAG(tern::Double<tern::HalfOpen(0, 1)>, local_momentum);
ABSL_DECLARE_FLAG(std::string, optimizer);
ABSL_DECLARE_FLAG(tern::Int<tern::AtLeast(0)>, warmup_rounds);
ABSL_DECLARE_FLAG(tern::Double<tern::AtLeast(0)>, adaptive_batch_eta);
ABSL_DECLARE_FLAG(tern::Double<tern::In(0, 1)>, overlap_anchor);
ABSL_DECLARE_FLAG(tern::Int<tern::In(1, 1048576)>, max_batch);
ABSL_DECLARE_FLAG(tern::Double<tern::HalfOpen(0, 1)>, beta1);
ABSL_DECLARE_FLAG(tern::Double<tern::HalfOpen(0, 1)>, beta2);
ABSL_DECLARE_FLAG(tern::Double<tern::AboveUpTo(0, 1)>, eps);
ABSL_DECLARE_FLAG(tern::Double<tern::Above(0)>, client_timeout_s);

namespace tern {

// --lr, or the aggregator runs' default (0.05) when 0.
double FedLr();
// `tern server`'s options from the flags (the task's work checked against --mode).
absl::StatusOr<ServerOptions> ServerOptionsFromFlags();

}  // namespace tern

#endif  // TERN_CLI_AGGREGATOR_FLAGS_H_
