// The clients an aggregator knows: each id with the name and sample count it joined with, the
// identity it joined as (bound to the id: only that caller acts in its name), when it was last
// heard from and whether it left; which of them are available for a round.
//
// Thread-safety: not thread-safe; the aggregator calls it under its lock.
#ifndef TERN_SERVER_CLIENT_BOOK_H_
#define TERN_SERVER_CLIENT_BOOK_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tern/internal/checkpoint.pb.h"

namespace tern {

class ClientBook {
 public:
  // A client not heard from for `timeout` is not available.
  explicit ClientBook(absl::Duration timeout) : timeout_(timeout) {}

  // `principal` joins with its id back (`want` >= 0, when it exists) or a new one: the id.
  // PermissionDenied when `want` was joined by another identity; an id joined without
  // credentials goes to the first authenticated caller that takes it back (a run that turned
  // authentication on).
  absl::StatusOr<uint32_t> Join(int64_t want, const std::string& principal, std::string name,
                                uint64_t num_samples, absl::Time now);
  // OK when `id` joined as `principal`: PermissionDenied when someone else did, NotFound when
  // nobody did.
  absl::Status CheckCaller(uint32_t id, const std::string& principal) const;
  // `id` was heard from at `now`; NotFound when it never joined.
  absl::Status Heard(uint32_t id, absl::Time now);
  // Every client heard from at `now` (a restarted server gives each a fresh timeout).
  void HeardAll(absl::Time now);
  absl::Status Leave(uint32_t id);

  bool Has(uint32_t id) const { return clients_.count(id) > 0; }
  size_t size() const { return clients_.size(); }
  // Not left, and heard from within the timeout.
  int CountAvailable(absl::Time now) const;
  std::set<int> Available(absl::Time now) const;
  // Forgets the clients that left or have been silent for `after`, but those in `keep` (the
  // open round's): a run that sees many clients come and go holds only the ones still around.
  // Returns how many were forgotten. A forgotten client that comes back joins as a new one;
  // ids are never given out twice.
  size_t Forget(absl::Time now, absl::Duration after, const std::vector<int>& keep);

  // Into and out of the aggregator's snapshot (its `clients`).
  void Save(internal::AggregatorCheckpoint* ckpt) const;
  void Restore(const internal::AggregatorCheckpoint& ckpt);

 private:
  struct Client {
    std::string name;
    std::string principal;  // who joined as this client ("" without credentials)
    uint64_t num_samples = 0;
    absl::Time last_seen = absl::InfinitePast();
    bool left = false;
  };
  bool IsAvailable(const Client& c, absl::Time now) const {
    return !c.left && now - c.last_seen <= timeout_;
  }

  const absl::Duration timeout_;
  std::map<uint32_t, Client> clients_;
  uint32_t next_id_ = 0;  // above every id given out, forgotten ones too
};

}  // namespace tern

#endif  // TERN_SERVER_CLIENT_BOOK_H_
