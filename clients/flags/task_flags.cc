// A round's task, set alike for a gossip worker and an aggregator's clients: `tern worker`, `tern
// run` (both modes), `tern server` (command_table.cc: this file is their group).
#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "clients/flags/flag_types.h"
#include "clients/flags/train_flags.h"

ABSL_FLAG(tern::Int<tern::In(1, 1048576)>, batch, 32, "training: minibatch per worker per step");
ABSL_FLAG(tern::Int<tern::AtLeast(1)>, local_steps, 4, "training: local-sgd's and diloco's H");
ABSL_FLAG(std::string, outer, "",
          "training and server/run (federated, local-sgd): the outer optimizer on the mean update "
          "of the workers (--algorithm=diloco) or of the clients: average | "
          "heavy-ball[:lr=1,momentum=0.5] (SlowMo) | nesterov[:lr=0.7,momentum=0.9] (DiLoCo) | "
          "sparseloco[:lr=1,beta=0.95] (no outer momentum; the senders' error feedback decays by "
          "beta); empty: nesterov for diloco, heavy-ball with --server_lr and --server_momentum "
          "for the server");
ABSL_FLAG(tern::Double<tern::AtLeast(0)>, lr, 0,
          "training: base learning rate; 0 = 0.1 x (1 - momentum) for the momentum algorithms "
          "(dmsgd, decentlam, heavy-ball, choco), 0.1 for dpsgd, local-sgd, swarm and diloco");
ABSL_FLAG(std::string, lr_schedule, "constant",
          "training (worker, run): the rate by step; server, run --mode=ps|federated|local-sgd|"
          "fedbuff: by round (ps: the server's step; else the clients' local rate). constant | "
          "cosine[:min=M] | step:every=N[,gamma=G], each with [,warmup=W]");
ABSL_FLAG(tern::Double<tern::AtLeast(0)>, norm_guard, 10,
          "training and aggregator: refuse a neighbour's message (a client's update) whose L2 "
          "norm is over this many times the median of recent trusted ones (own messages; "
          "accepted updates); 0 turns the guard off (docs/robustness.md)");
