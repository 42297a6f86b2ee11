// An edge aggregator's side of its parent (tern server --parent; docs/server.md, "Edge
// aggregators"). The edge is one client of the parent: each parent task hands it the parent's
// model (the base), its own clients run `rounds_per_task` rounds from it, and the update it owes
// the parent is its model after them minus the base, weighted by the examples of the updates
// those rounds accepted. This room keeps that bookkeeping and its part of the checkpoint; the
// aggregator asks it under its own lock and gates its rounds on it.
//
// Thread-safety: thread-compatible.
#ifndef TERN_SERVER_EDGE_H_
#define TERN_SERVER_EDGE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/model/layout.h"
#include "kernels/registry.h"
#include "tern/internal/checkpoint.pb.h"

namespace tern {

class EdgeTier {
 public:
  explicit EdgeTier(int rounds_per_task) : rounds_per_task_(rounds_per_task) {}

  // A parent task: `base`, the parent's model after `parent_round`, is what the edge's rounds
  // after `round` train from, until `rounds_per_task` of them closed, at the parent task's
  // local rate `parent_lr` (0: the edge's own).
  void Rebase(int64_t parent_round, int64_t parent_client, uint64_t parent_total_rounds,
              std::vector<float> base, int64_t round, float parent_lr);
  // Whether the edge's round `round + 1` may open: only for a parent task not yet done.
  bool MayOpen(int64_t round) const { return active_ && round < target_; }
  // The edge's round `round` closed having accepted updates of total `weight` (their weighted
  // mean loss and mean batch). A task whose rounds all closed with no update runs one more:
  // the parent is owed an update of clients, never an empty one.
  void Closed(int64_t round, double weight, double loss, double batch);
  // Whether the update for the parent is ready after round `round` closed.
  bool Ready(int64_t round) const { return active_ && round >= target_ && weight_ > 0; }

  bool active() const { return active_; }
  int64_t parent_round() const { return parent_round_; }
  int64_t parent_client() const { return parent_client_; }
  uint64_t parent_total_rounds() const { return parent_total_rounds_; }
  // The parent task's local rate, which the edge's clients train at (0: none given).
  float parent_lr() const { return parent_lr_; }
  int rounds_per_task() const { return rounds_per_task_; }
  const std::vector<float>& base() const { return base_; }
  uint32_t base_crc() const { return base_crc_; }
  double weight() const { return weight_; }
  double mean_loss() const { return weight_ > 0 ? loss_sum_ / weight_ : 0.0; }
  double mean_batch() const { return batch_rounds_ > 0 ? batch_sum_ / batch_rounds_ : 0.0; }

  absl::Status Save(const std::vector<ParamTensor>& layout, internal::EdgeCheckpoint* ckpt) const;
  // `layout`: the model's (the base must have it).
  absl::Status Restore(const internal::EdgeCheckpoint& ckpt, const std::vector<ParamTensor>& layout,
                       const CodecRegistry& codecs);

 private:
  const int rounds_per_task_;
  bool active_ = false;
  int64_t parent_round_ = -1;
  int64_t parent_client_ = -1;
  uint64_t parent_total_rounds_ = 0;
  float parent_lr_ = 0;
  std::vector<float> base_;
  uint32_t base_crc_ = 0;
  int64_t target_ = 0;
  double weight_ = 0;
  double loss_sum_ = 0;
  double batch_sum_ = 0;
  int batch_rounds_ = 0;
};

}  // namespace tern

#endif  // TERN_SERVER_EDGE_H_
