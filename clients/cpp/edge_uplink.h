// An edge aggregator's uplink (tern server --parent; docs/server.md, "Edge aggregators"). Seen
// from its parent, an edge is one client whose local work is rounds of its own clients:
// EdgeParticipant is that client's Participant over the edge's Aggregator. Its layout and
// initial model are the edge's (the edge's first client brings them); each parent task rebases
// the edge on the parent's model and waits for the edge's rounds (server/edge.h); the update is
// the edge's model after them minus the parent's, weighted by the examples of the updates those
// rounds accepted. The parent's task names the uplink's codec and error feedback
// (AggregatorClient's ClientModel keeps the residual), whatever the edge asks of its clients.
//
// Thread-safety: EdgeParticipant is called from its AggregatorClient's thread only; the
// aggregator it drives is thread-safe.
#ifndef TERN_CLIENTS_CPP_EDGE_UPLINK_H_
#define TERN_CLIENTS_CPP_EDGE_UPLINK_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "clients/cpp/aggregator_client.h"
#include "common/clock.h"
#include "core/rpc/security.h"
#include "server/aggregator.h"

namespace tern {

class EdgeParticipant : public Participant {
 public:
  // `edge`, `clock` and `stop` must outlive it; `poll` is how often a task's wait looks at the
  // edge's rounds.
  EdgeParticipant(Aggregator* edge, Clock* clock, const std::atomic<bool>* stop,
                  absl::Duration poll = absl::Milliseconds(20));

  // Waits until the edge has a model (its first client sends it) and takes its layout:
  // Cancelled when `stop` came first. Call before the others.
  absl::Status AwaitModel();

  const std::vector<ParamTensor>& Layout() const override { return layout_; }
  absl::Status InitialModel(absl::Span<float> x) override;
  // The examples behind the edge's last update (1 before the first).
  uint64_t NumExamples() const override { return examples_; }
  // Rebases the edge on `global` (unless it already works on this very task: restarted from
  // its checkpoint) and waits for its rounds.
  absl::StatusOr<WorkResult> Work(const v1::Task& task, const std::vector<float>& global,
                                  const WorkContext& context) override;

 private:
  Aggregator* const edge_;
  Clock* const clock_;
  const std::atomic<bool>* const stop_;
  const absl::Duration poll_;
  std::vector<ParamTensor> layout_;
  uint64_t examples_ = 1;
};

// The edge `edge` as a client of the aggregator at `parent` (TLS and token as `tls` says) until
// the parent's run is over (the edge's then ends too: Aggregator::Finish), `stop` is set (OK),
// or an error retrying cannot mend. Counts its traffic in the edge's status (parent_*), and
// takes back the id the edge's checkpoint holds.
absl::Status RunEdgeUplink(Aggregator* edge, const std::string& parent, const TlsFiles& tls,
                           AggregatorClientOptions options, const std::atomic<bool>& stop);

}  // namespace tern

#endif  // TERN_CLIENTS_CPP_EDGE_UPLINK_H_
