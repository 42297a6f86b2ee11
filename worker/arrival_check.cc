#include "worker/arrival_check.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/gossip_bundle.h"

namespace tern {

absl::StatusOr<int> ArrivalCheck::SenderOf(const v1::TensorBundle& bundle) const {
  if (bundle.run_id() != options_.run_id) {
    return absl::InvalidArgumentError(
        absl::StrCat("message of run '", bundle.run_id(), "' sent to run '", options_.run_id, "'"));
  }
  int sender;
  if (!absl::SimpleAtoi(bundle.sender(), &sender) || sender < 0 || sender >= options_.num_workers ||
      sender == options_.worker_id) {
    return absl::InvalidArgumentError(
        absl::StrCat("sender '", bundle.sender(), "' is not another worker of this run"));
  }
  return sender;
}

absl::StatusOr<std::pair<int, GossipMessage>> ArrivalCheck::Check(ReceivedBundle received,
                                                                  int bucket, uint64_t num_params,
                                                                  PayloadScans* scans) const {
  if (num_params == 0) return absl::UnavailableError("this worker has no model registered yet");
  const v1::TensorBundle& bundle = received.bundle;
  TERN_ASSIGN_OR_RETURN(const int sender, SenderOf(bundle));
  if (bundle.round() > (uint64_t{1} << 62)) {
    return absl::OutOfRangeError(absl::StrCat("round ", bundle.round(), " is absurd"));
  }
  const int64_t round = static_cast<int64_t>(bundle.round());
  TERN_ASSIGN_OR_RETURN(Graph g, topology_->GraphFor(options_.num_workers, round));
  const auto& mine = g.neighbours[options_.worker_id];
  if (!std::binary_search(mine.begin(), mine.end(), sender)) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", sender, " is not a neighbour in round ", round));
  }
  TERN_ASSIGN_OR_RETURN(GossipMessage msg, GossipFromBundle(std::move(received), num_params));
  const auto wrong_count = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("message has ", msg.parts.size(), " parts, expected ", parts_.size(), " (",
                     absl::StrJoin(parts_, ", "), ")",
                     optional_parts_.empty()
                         ? ""
                         : absl::StrCat(" and any of ", absl::StrJoin(optional_parts_, ", "))));
  };
  if (msg.parts.size() < parts_.size() ||
      msg.parts.size() > parts_.size() + optional_parts_.size()) {
    return wrong_count();
  }
  // Checked without decoding (sparse payloads: positions only; cast payloads as they arrived,
  // where scanned); decoded once, when mixed. Parts are in the bundle's order (GossipFromBundle),
  // names unique.
  size_t found = 0;
  for (const std::vector<std::string>* names : {&parts_, &optional_parts_}) {
    for (const std::string& name : *names) {
      const auto part = std::find_if(msg.parts.begin(), msg.parts.end(),
                                     [&name](const auto& p) { return p.first == name; });
      if (part == msg.parts.end()) {
        if (names == &optional_parts_) continue;
        return absl::InvalidArgumentError(absl::StrCat("message lacks part '", name, "'"));
      }
      ++found;
      const size_t index = static_cast<size_t>(part - msg.parts.begin());
      TERN_RETURN_IF_ERROR(CheckPart(name, bucket, round, sender, part->second,
                                     scans == nullptr ? nullptr : scans->For(index, part->second)));
    }
  }
  if (found != msg.parts.size()) return wrong_count();  // one it does not know
  msg.checked = true;
  return std::make_pair(sender, std::move(msg));
}

std::string ArrivalCheck::GuardKey(const std::string& part, int bucket, int64_t round) const {
  return absl::StrCat(part, bucket == 0 ? "" : absl::StrCat("#", bucket),
                      round < options_.sync_steps ? "@warm-up" : "");
}

absl::Status ArrivalCheck::CheckPart(const std::string& name, int bucket, int64_t round, int sender,
                                     const EncodedTensor& t, PayloadScan* scan) const {
  const EncodedView view = EncodedView::Of(t);
  if (!options_.norm_guard.enabled()) {
    absl::Status d = scan != nullptr ? scan->Finish(view).status() : codecs_->Validate(view);
    if (d.ok()) return d;
    return absl::InvalidArgumentError(absl::StrCat("part '", name, "': ", d.message()));
  }
  // Validates too.
  absl::StatusOr<double> norm = scan != nullptr ? scan->Finish(view) : codecs_->Norm(view);
  if (!norm.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("part '", name, "': ", norm.status().message()));
  }
  absl::MutexLock lock(&mu_);
  auto it = guards_.find(GuardKey(name, bucket, round));
  if (it == guards_.end()) return absl::OkStatus();  // nothing of ours to compare with yet
  return it->second.Check(*norm, absl::StrCat("part '", name, "' from worker ", sender));
}

void ArrivalCheck::ScaleOuterReference(int bucket, double f) {
  absl::MutexLock lock(&mu_);
  for (const std::vector<std::string>* names : {&parts_, &optional_parts_}) {
    for (const std::string& name : *names) {
      auto it = guards_.find(GuardKey(name, bucket, options_.sync_steps));
      if (it != guards_.end()) it->second.Scale(f);
    }
  }
}

void ArrivalCheck::ObserveOwn(int bucket, int64_t round, const GossipMessage& msg) {
  if (!options_.norm_guard.enabled()) return;
  std::vector<std::pair<std::string, double>> norms;
  for (const auto& [name, t] : msg.parts) {
    absl::StatusOr<double> norm = codecs_->Norm(EncodedView::Of(t));
    if (norm.ok()) norms.emplace_back(GuardKey(name, bucket, round), *norm);
  }
  absl::MutexLock lock(&mu_);
  for (const auto& [key, norm] : norms) {
    guards_.try_emplace(key, options_.norm_guard).first->second.Observe(norm);
  }
}

}  // namespace tern
