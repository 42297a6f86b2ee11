#include "server/client_book.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tern {
namespace {

absl::Status NotJoined(uint32_t id) {
  return absl::NotFoundError(absl::StrCat("client ", id, " has not joined"));
}

}  // namespace

absl::StatusOr<uint32_t> ClientBook::Join(int64_t want, const std::string& principal,
                                          std::string name, uint64_t num_samples, absl::Time now) {
  auto old = want >= 0 ? clients_.find(static_cast<uint32_t>(want)) : clients_.end();
  uint32_t id;
  if (old != clients_.end()) {
    if (!old->second.principal.empty() && old->second.principal != principal) {
      return absl::PermissionDeniedError(absl::StrCat(
          "client ", old->first, " joined as '", old->second.principal, "'; '", principal,
          "' cannot take it back (join with client_id -1 for an id of ", "its own)"));
    }
    id = old->first;
  } else {
    id = next_id_;
  }
  next_id_ = std::max(next_id_, id + 1);
  Client& c = clients_[id];
  c.principal = principal;
  c.name = std::move(name);
  c.num_samples = num_samples;
  c.last_seen = now;
  c.left = false;
  return id;
}

absl::Status ClientBook::CheckCaller(uint32_t id, const std::string& principal) const {
  auto it = clients_.find(id);
  if (it == clients_.end()) return NotJoined(id);
  if (it->second.principal != principal) {
    return absl::PermissionDeniedError(absl::StrCat("client ", id, " joined as '",
                                                    it->second.principal,
                                                    "'; this call comes from '", principal, "'"));
  }
  return absl::OkStatus();
}

absl::Status ClientBook::Heard(uint32_t id, absl::Time now) {
  auto it = clients_.find(id);
  if (it == clients_.end()) return NotJoined(id);
  it->second.last_seen = now;
  return absl::OkStatus();
}

void ClientBook::HeardAll(absl::Time now) {
  for (auto& [id, c] : clients_) c.last_seen = now;
}

absl::Status ClientBook::Leave(uint32_t id) {
  auto it = clients_.find(id);
  if (it == clients_.end()) return NotJoined(id);
  it->second.left = true;
  return absl::OkStatus();
}

int ClientBook::CountAvailable(absl::Time now) const {
  int n = 0;
  for (const auto& [id, c] : clients_) n += IsAvailable(c, now) ? 1 : 0;
  return n;
}

std::set<int> ClientBook::Available(absl::Time now) const {
  std::set<int> out;
  for (const auto& [id, c] : clients_) {
    if (IsAvailable(c, now)) out.insert(static_cast<int>(id));
  }
  return out;
}

size_t ClientBook::Forget(absl::Time now, absl::Duration after, const std::vector<int>& keep) {
  size_t forgotten = 0;
  for (auto it = clients_.begin(); it != clients_.end();) {
    const bool gone = it->second.left || now - it->second.last_seen > after;
    if (gone && !std::binary_search(keep.begin(), keep.end(), static_cast<int>(it->first))) {
      it = clients_.erase(it);
      ++forgotten;
    } else {
      ++it;
    }
  }
  return forgotten;
}

void ClientBook::Save(internal::AggregatorCheckpoint* ckpt) const {
  ckpt->set_next_client_id(next_id_);
  for (const auto& [id, c] : clients_) {
    internal::CheckpointClient* p = ckpt->add_clients();
    p->set_id(id);
    p->set_name(c.name);
    p->set_num_samples(c.num_samples);
    p->set_left(c.left);
    p->set_principal(c.principal);
  }
}

void ClientBook::Restore(const internal::AggregatorCheckpoint& ckpt) {
  next_id_ = std::max(next_id_, ckpt.next_client_id());
  for (const internal::CheckpointClient& c : ckpt.clients()) {
    next_id_ = std::max(next_id_, c.id() + 1);
    Client& client = clients_[c.id()];
    client.name = c.name();
    client.num_samples = c.num_samples();
    client.left = c.left();
    client.principal = c.principal();
  }
}

}  // namespace tern
