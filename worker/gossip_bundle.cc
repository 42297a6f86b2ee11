#include "worker/gossip_bundle.h"

#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/wire.h"

namespace tern {

v1::TensorBundle GossipToBundle(GossipMessage&& msg, const std::string& run_id, int64_t round,
                                int sender) {
  v1::TensorBundle b;
  b.set_run_id(run_id);
  b.set_round(static_cast<uint64_t>(round));
  b.set_sender(absl::StrCat(sender));
  for (auto& [name, t] : msg.parts) {
    v1::NamedTensor* nt = b.add_tensors();
    nt->set_name(name);
    nt->mutable_tensor()->set_dtype(v1::DTYPE_FLOAT32);
    ToProto(std::move(t), nt->mutable_tensor());
  }
  if (msg.group_crc.has_value()) b.set_group_crc(*msg.group_crc);
  for (int id : msg.resync) b.add_resync(static_cast<uint32_t>(id));
  if (msg.propose_local_steps.has_value()) b.set_propose_local_steps(*msg.propose_local_steps);
  if (msg.propose_fragments.has_value()) b.set_propose_fragments(*msg.propose_fragments);
  return b;
}

absl::StatusOr<GossipMessage> GossipFromBundle(v1::TensorBundle bundle, uint64_t expected_numel) {
  return GossipFromBundle(ReceivedBundle{std::move(bundle), {}}, expected_numel);
}

absl::StatusOr<GossipMessage> GossipFromBundle(ReceivedBundle received, uint64_t expected_numel) {
  GossipMessage msg;
  std::set<std::string> seen;
  v1::TensorBundle& bundle = received.bundle;
  for (int i = 0; i < bundle.tensors_size(); ++i) {
    v1::NamedTensor& nt = *bundle.mutable_tensors(i);
    if (!seen.insert(nt.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat("part '", nt.name(), "' appears twice"));
    }
    v1::EncodedTensor& m = *nt.mutable_tensor();
    if (m.numel() != expected_numel) {
      return absl::InvalidArgumentError(absl::StrCat("part '", nt.name(), "' has ", m.numel(),
                                                     " elements, the model has ", expected_numel));
    }
    // The shape, when given, must multiply out to numel (docs/wire-format.md).
    if (absl::Status s = ViewOf(m).status(); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("part '", nt.name(), "': ", s.message()));
    }
    EncodedTensor t;
    t.codec = m.codec();
    t.params = m.params();
    t.numel = m.numel();
    t.scales.assign(m.scales().begin(), m.scales().end());
    t.payload = std::move(*m.mutable_payload());  // the bundle is ours: no copy of the bytes
    if (static_cast<size_t>(i) < received.in_place.size()) {
      t.in_place = std::move(received.in_place[static_cast<size_t>(i)]);
    }
    msg.parts.emplace_back(nt.name(), std::move(t));
  }
  if (bundle.has_group_crc()) msg.group_crc = bundle.group_crc();
  if (bundle.resync_size() > kMaxResync) {
    return absl::InvalidArgumentError(
        absl::StrCat("a resync list of ", bundle.resync_size(), " workers; at most ", kMaxResync));
  }
  for (uint32_t id : bundle.resync()) {
    if (id > static_cast<uint32_t>(std::numeric_limits<int>::max())) {
      return absl::InvalidArgumentError(absl::StrCat("resync names worker ", id));
    }
    msg.resync.push_back(static_cast<int>(id));
  }
  if (const uint32_t h = bundle.propose_local_steps(); h != 0) {
    if (h > kMaxLocalSteps) {
      return absl::InvalidArgumentError(
          absl::StrCat("a proposal of ", h, " steps between exchanges; at most ", kMaxLocalSteps));
    }
    msg.propose_local_steps = h;
  }
  if (const uint32_t q = bundle.propose_fragments(); q != 0) {
    if (q > kMaxFragments) {
      return absl::InvalidArgumentError(
          absl::StrCat("a proposal of ", q, " fragments; at most ", kMaxFragments));
    }
    msg.propose_fragments = q;
  }
  return msg;
}

}  // namespace tern
