#include "server/secure_rounds.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/rng.h"
#include "common/status_macros.h"
#include "kernels/format/sparse.h"

namespace tern {

absl::Status CheckSecAggOptions(const SecAggOptions& o) {
  if (!o.enabled) return absl::OkStatus();
  if (o.neighbours < 2) {
    return absl::InvalidArgumentError("--secagg_neighbours must be >= 2");
  }
  if (o.threshold > o.neighbours) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--secagg_threshold=", o.threshold, " is more than --secagg_neighbours=", o.neighbours));
  }
  if (o.bits < 8 || o.bits > 32) {
    return absl::InvalidArgumentError(absl::StrCat("--secagg_bits=", o.bits, " must be in 8..32"));
  }
  if (!(o.range > 0) || !(o.range < 1e30)) {
    return absl::InvalidArgumentError("--secagg_range must be positive and finite");
  }
  if (o.stage_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--secagg_stage_timeout must be > 0");
  }
  return absl::OkStatus();
}

void SecureRounds::Open(int64_t round, const std::vector<int>& sampled, size_t dim, uint64_t seed,
                        absl::Time now, std::string* why) {
  round_.reset();
  revealed_.clear();
  number_ = round;
  sampled_.clear();
  for (int c : sampled) sampled_.insert(static_cast<uint32_t>(c));
  const uint32_t n = static_cast<uint32_t>(sampled_.size());
  const uint32_t degree =
      std::min<uint32_t>(2 * ((options_.neighbours + 1) / 2), n == 0 ? 0 : n - 1);
  params_.Clear();
  params_.set_neighbours(options_.neighbours);
  // More than half of each neighbourhood: a server that told some neighbours a client
  // survived and others that it dropped cannot gather t shares of both its secrets.
  params_.set_threshold(options_.threshold > 0 ? options_.threshold : degree / 2 + 1);
  params_.set_modulus_bits(options_.bits);
  params_.set_noise_sd(static_cast<float>(options_.noise_sd));
  const uint64_t room = (uint64_t{1} << options_.bits) - 1;
  params_.set_levels(options_.levels > 0 ? options_.levels
                                         : static_cast<uint32_t>(std::min<uint64_t>(
                                               room / std::max<uint32_t>(1, n), 0xffffffffu)));
  params_.set_clip_range(static_cast<float>(options_.range));
  if (options_.keep_ratio > 0) {
    params_.set_keep(static_cast<uint32_t>(
        std::min<size_t>(format::SparseK(options_.keep_ratio, dim), 0xffffffffu)));
    params_.set_keep_seed(Mix64(seed ^ static_cast<uint64_t>(round) ^ 0x6b656570ULL));
    params_.set_keep_unbiased(options_.keep_unbiased);
  }
  dim_ = dim;
  absl::Status s = CheckSecAggParams(params_, n);
  if (s.ok() && n < 3) {
    // With two, the sum and one's own update give the other's.
    s = absl::FailedPreconditionError(
        absl::StrCat(n, " clients sampled; a secure round needs 3 at least"));
  } else if (s.ok() && n < params_.threshold() + 1) {
    s = absl::FailedPreconditionError(absl::StrCat(n, " clients sampled; a threshold of ",
                                                   params_.threshold(), " needs ",
                                                   params_.threshold() + 1));
  }
  if (!s.ok()) {
    *why = std::string(s.message());
    return;
  }
  round_ = std::make_unique<SecAggServerRound>(params_, static_cast<uint64_t>(round),
                                               SecAggMaskedDim(params_, dim),
                                               Mix64(seed ^ static_cast<uint64_t>(round)));
  stage_since_ = now;
}

absl::StatusOr<v1::SecAggReply> SecureRounds::Handle(const v1::SecAggRequest& request) {
  if (round_ == nullptr || static_cast<int64_t>(request.round()) != number_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "round ", request.round(), " has no secure aggregation under way",
        round_ == nullptr ? std::string() : absl::StrCat(" (round ", number_, "'s is)")));
  }
  const uint32_t client = request.client_id();
  if (!sampled_.contains(client)) {
    return absl::PermissionDeniedError(
        absl::StrCat("client ", client, " was not sampled into round ", number_));
  }
  // The message names its sender and round too: they must be the caller's.
  auto mine = [&](uint32_t id, uint64_t r) -> absl::Status {
    if (id != client || r != request.round()) {
      return absl::InvalidArgumentError(absl::StrCat("a message of client ", id, " for round ", r,
                                                     " sent by client ", client, " for round ",
                                                     request.round()));
    }
    return absl::OkStatus();
  };
  switch (request.message_case()) {
    case v1::SecAggRequest::kKeys:
      TERN_RETURN_IF_ERROR(mine(request.keys().client_id(), request.keys().round()));
      TERN_RETURN_IF_ERROR(round_->AddKeys(request.keys()));
      break;
    case v1::SecAggRequest::kShares:
      TERN_RETURN_IF_ERROR(mine(request.shares().client_id(), request.shares().round()));
      TERN_RETURN_IF_ERROR(round_->AddShares(request.shares()));
      break;
    case v1::SecAggRequest::kReveal:
      TERN_RETURN_IF_ERROR(mine(request.reveal().client_id(), request.reveal().round()));
      TERN_RETURN_IF_ERROR(round_->AddReveal(request.reveal()));
      revealed_.insert(client);
      break;
    case v1::SecAggRequest::MESSAGE_NOT_SET:
      break;
  }
  v1::SecAggReply reply;
  using Stage = SecAggServerRound::Stage;
  const Stage stage = round_->stage();
  switch (request.want()) {
    case v1::SecAggRequest::NEIGHBOURS: {
      if (stage == Stage::kKeys) {
        reply.set_pending(true);
        break;
      }
      absl::StatusOr<v1::SecAggKeysReply> r = round_->KeysFor(client);
      if (!r.ok()) return r.status();
      *reply.mutable_neighbours() = *std::move(r);
      break;
    }
    case v1::SecAggRequest::SHARES: {
      if (stage <= Stage::kShares) {
        reply.set_pending(true);
        break;
      }
      absl::StatusOr<v1::SecAggSharesReply> r = round_->SharesFor(client);
      if (!r.ok()) return r.status();
      *reply.mutable_shares() = *std::move(r);
      break;
    }
    case v1::SecAggRequest::UNMASK: {
      if (stage <= Stage::kMasked) {
        reply.set_pending(true);
        break;
      }
      absl::StatusOr<v1::SecAggUnmaskRequest> r = round_->UnmaskRequestFor(client);
      if (!r.ok()) return r.status();
      *reply.mutable_unmask() = *std::move(r);
      break;
    }
    default:
      break;
  }
  return reply;
}

bool SecureRounds::Admits(uint32_t client) const {
  return round_ != nullptr && round_->stage() == SecAggServerRound::Stage::kKeys &&
         !round_->keyed_clients().contains(client);
}

absl::Status SecureRounds::TakesMasked(uint32_t client, int64_t round) const {
  if (round != number_) {
    return absl::InvalidArgumentError(
        absl::StrCat("a masked update for round ", round, "; the open round is ", number_));
  }
  if (round_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("round ", round, " has no secure aggregation under way"));
  }
  if (round_->stage() != SecAggServerRound::Stage::kMasked) {
    return absl::FailedPreconditionError(
        absl::StrCat("round ", round, " is not taking masked updates now"));
  }
  if (!round_->sharing_clients().contains(client)) {
    return absl::PermissionDeniedError(absl::StrCat("client ", client, " is not masking in round ",
                                                    round,
                                                    " (its keys or shares missed "
                                                    "their stage)"));
  }
  return absl::OkStatus();
}

absl::Status SecureRounds::AddMasked(uint32_t client, int64_t round, std::string_view masked) {
  TERN_RETURN_IF_ERROR(TakesMasked(client, round));
  return round_->AddMasked(client, static_cast<uint64_t>(round), masked);
}

std::optional<absl::StatusOr<SecAggServerRound::Result>> SecureRounds::Advance(absl::Time now,
                                                                               bool replies_in) {
  if (round_ == nullptr) return std::nullopt;
  using Stage = SecAggServerRound::Stage;
  const bool timed_out = now - stage_since_ >= options_.stage_timeout;
  absl::Status s;
  switch (round_->stage()) {
    case Stage::kKeys:
      if (round_->keys_in() < sampled_.size() && !timed_out) return std::nullopt;
      s = round_->CloseKeys();
      break;
    case Stage::kShares:
      if (round_->shares_in() < round_->keyed_clients().size() && !timed_out) {
        return std::nullopt;
      }
      s = round_->CloseShares();
      break;
    case Stage::kMasked:
      if (round_->masked_clients().size() < round_->sharing_clients().size() && !replies_in) {
        return std::nullopt;
      }
      s = round_->CloseMasked();
      break;
    case Stage::kReveal: {
      if (revealed_.size() < round_->masked_clients().size() && !timed_out) return std::nullopt;
      absl::StatusOr<SecAggServerRound::Result> result = round_->Finish();
      round_.reset();
      if (result.ok()) result->mean = SecAggScatter(params_, std::move(result->mean), dim_);
      return result;
    }
    case Stage::kDone:
      s = absl::FailedPreconditionError("the round ended");
      break;
  }
  stage_since_ = now;
  if (!s.ok()) {
    round_.reset();
    return absl::StatusOr<SecAggServerRound::Result>(s);
  }
  return Advance(now, replies_in);  // the next stage may be ready at once (e.g. none masking)
}

}  // namespace tern
