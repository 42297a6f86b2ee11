#include "server/edge.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/crc32.h"
#include "common/status_macros.h"
#include "core/model/bundle.h"

namespace tern {

void EdgeTier::Rebase(int64_t parent_round, int64_t parent_client, uint64_t parent_total_rounds,
                      std::vector<float> base, int64_t round, float parent_lr) {
  active_ = true;
  parent_lr_ = parent_lr;
  parent_round_ = parent_round;
  parent_client_ = parent_client;
  parent_total_rounds_ = parent_total_rounds;
  base_ = std::move(base);
  base_crc_ = Crc32(base_.data(), 4 * base_.size());
  target_ = round + rounds_per_task_;
  weight_ = loss_sum_ = batch_sum_ = 0;
  batch_rounds_ = 0;
}

void EdgeTier::Closed(int64_t round, double weight, double loss, double batch) {
  if (!active_ || round > target_) return;
  weight_ += weight;
  loss_sum_ += weight * loss;
  if (batch > 0) {
    batch_sum_ += batch;
    ++batch_rounds_;
  }
  if (round == target_ && weight_ <= 0) ++target_;
}

absl::Status EdgeTier::Save(const std::vector<ParamTensor>& layout,
                            internal::EdgeCheckpoint* ckpt) const {
  ckpt->set_active(active_);
  if (!active_) return absl::OkStatus();
  ckpt->set_parent_round(static_cast<uint64_t>(parent_round_));
  ckpt->set_parent_client(parent_client_);
  ckpt->set_parent_total_rounds(parent_total_rounds_);
  ckpt->set_parent_lr(parent_lr_);
  TERN_ASSIGN_OR_RETURN(*ckpt->mutable_base(), FlatToBundle(layout, base_));
  ckpt->set_target_round(static_cast<uint64_t>(target_));
  ckpt->set_weight(weight_);
  ckpt->set_loss_sum(loss_sum_);
  ckpt->set_batch_sum(batch_sum_);
  ckpt->set_batch_rounds(static_cast<uint32_t>(batch_rounds_));
  return absl::OkStatus();
}

absl::Status EdgeTier::Restore(const internal::EdgeCheckpoint& ckpt,
                               const std::vector<ParamTensor>& layout,
                               const CodecRegistry& codecs) {
  active_ = ckpt.active();
  if (!active_) return absl::OkStatus();
  std::vector<float> base(LayoutNumel(layout));
  if (absl::Status s = BundleToFlat(ckpt.base(), layout, codecs, absl::MakeSpan(base)); !s.ok()) {
    return absl::DataLossError(absl::StrCat("the edge's base model: ", s.message()));
  }
  Rebase(static_cast<int64_t>(ckpt.parent_round()), ckpt.parent_client(),
         ckpt.parent_total_rounds(), std::move(base), 0, ckpt.parent_lr());
  target_ = static_cast<int64_t>(ckpt.target_round());
  weight_ = ckpt.weight();
  loss_sum_ = ckpt.loss_sum();
  batch_sum_ = ckpt.batch_sum();
  batch_rounds_ = static_cast<int>(ckpt.batch_rounds());
  return absl::OkStatus();
}

}  // namespace tern
