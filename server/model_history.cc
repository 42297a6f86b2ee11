#include "server/model_history.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tern {

ModelHistory::ModelHistory(int keep_models, int keep_crcs)
    : keep_models_(static_cast<size_t>(std::max(1, keep_models))),
      keep_crcs_(static_cast<size_t>(std::max(1, keep_crcs))) {}

void ModelHistory::Publish(KeptModel m, uint32_t crc) {
  crcs_[m.round] = crc;
  models_.push_back(std::move(m));
  while (models_.size() > keep_models_) models_.pop_front();
  while (crcs_.size() > keep_crcs_) crcs_.erase(crcs_.begin());
  chunks_.clear();  // downstream copies are made when clients fetch
}

void ModelHistory::Clear() {
  models_.clear();
  crcs_.clear();
  chunks_.clear();
}

absl::StatusOr<KeptModel> ModelHistory::Find(int64_t round) const {
  if (models_.empty()) return absl::UnavailableError("no model yet");
  if (round <= 0) return models_.back();
  for (const KeptModel& m : models_) {
    if (m.round == round) return m;
  }
  if (round > models_.back().round) {
    return absl::UnavailableError(absl::StrCat("round ", round, " has not closed yet"));
  }
  return absl::NotFoundError(absl::StrCat("the model of round ", round, " is no longer kept"));
}

std::optional<uint32_t> ModelHistory::Crc(int64_t round) const {
  auto it = crcs_.find(round);
  if (it == crcs_.end()) return std::nullopt;
  return it->second;
}

const ChunkedPayload* ModelHistory::Chunks(int64_t from) const {
  auto it = chunks_.find(from);
  return it == chunks_.end() ? nullptr : &it->second;
}

}  // namespace tern
