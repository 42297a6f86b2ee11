// What the built-in algorithms share (worker/algorithms/*.cc): the model's values, in the
// algorithm's own vector or in storage bound from outside, and AlgorithmBase, the plumbing every
// one of them builds on: a dense codec for exact exchanges, message parts encoded with a
// reproducible seed, and checked decoding and mixing of the neighbours' parts.
//
// Thread-safety: as Algorithm (worker/algorithm.h): one thread at a time.
#ifndef TERN_WORKER_ALGORITHMS_BASE_H_
#define TERN_WORKER_ALGORITHMS_BASE_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/rng.h"
#include "common/status_macros.h"
#include "core/model/clip_radius.h"
#include "kernels/select.h"
#include "worker/algorithm.h"

namespace tern {

// y += w x.
void Axpy(size_t n, float w, const float* __restrict x, float* __restrict y);
// |x - y|^2, summed in double.
double SquaredDistance(size_t n, const float* __restrict x, const float* __restrict y);

// The model's values: in the algorithm's own vector, or in storage bound from outside (a
// trainer's shared segment, which the trainer then reads in place, with no copy per step).
class ModelVector {
 public:
  size_t size() const { return view_.size(); }
  float& operator[](size_t i) { return view_[i]; }
  float operator[](size_t i) const { return view_[i]; }
  float* data() { return view_.data(); }
  operator absl::Span<const float>() const { return view_; }  // NOLINT: reads as a vector
  ModelVector& operator=(std::vector<float> v) {
    if (bound_) {
      std::copy(v.begin(), v.end(), view_.begin());  // same size: the model never resizes
    } else {
      own_ = std::move(v);
      view_ = absl::MakeSpan(own_);
    }
    return *this;
  }
  void Bind(absl::Span<float> storage) {
    std::copy(view_.begin(), view_.end(), storage.begin());
    view_ = storage;
    bound_ = true;
    own_ = std::vector<float>();
  }
  void Unbind() {
    if (!bound_) return;  // (assigning own_ from a view of itself would be undefined)
    own_.assign(view_.begin(), view_.end());
    view_ = absl::MakeSpan(own_);
    bound_ = false;
  }

 private:
  std::vector<float> own_;
  absl::Span<float> view_;
  bool bound_ = false;
};

// Shared plumbing: the model, a dense codec for exact exchanges, and checked decoding.
class AlgorithmBase : public Algorithm {
 public:
  AlgorithmBase(const AlgorithmOptions& options, const CodecRegistry* codecs)
      : options_(options), codecs_(codecs) {}

  absl::Status Init(absl::Span<const float> x0, int worker,
                    std::vector<TensorBlock> blocks) override {
    blocks_ = std::move(blocks);
    // What exact-exchange algorithms send x and m with ("none" = fp32; fp16/bf16 halve it).
    TERN_ASSIGN_OR_RETURN(dense_, codecs_->Create(options_.codec));
    x_ = std::vector<float>(x0.begin(), x0.end());
    m_.clear();
    worker_ = worker;
    return InitState();
  }
  absl::Span<const float> params() const override { return x_; }
  std::vector<float> LocalMomentum() const override {
    return m_.size() == x_.size() ? m_ : std::vector<float>();
  }
  absl::Status AdoptLocalMomentum(absl::Span<const float> m) override {
    if (m.size() != x_.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("a momentum of ", m.size(), " values for a model of ", x_.size()));
    }
    m_.assign(m.begin(), m.end());
    return absl::OkStatus();
  }
  absl::Status BindParams(absl::Span<float> storage) override {
    if (storage.empty()) {
      x_.Unbind();
      return absl::OkStatus();
    }
    if (storage.size() != x_.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("storage for ", storage.size(), " values; the model has ", x_.size()));
    }
    x_.Bind(storage);
    return absl::OkStatus();
  }

 protected:
  virtual absl::Status InitState() { return absl::OkStatus(); }

  absl::Status AddPart(GossipMessage* msg, std::string name, absl::Span<const float> v,
                       Codec* codec = nullptr, int64_t step = 0) {
    EncodedTensor t;
    TERN_RETURN_IF_ERROR((codec ? codec : dense_.get())->Encode(v, PartOptions(*msg, step), &t));
    msg->parts.emplace_back(std::move(name), std::move(t));
    return absl::OkStatus();
  }
  // The same from the top-k selection of the part's values (a top-k codec's input).
  absl::Status AddSelectedPart(GossipMessage* msg, std::string name, const TopKSelection& selection,
                               Codec* codec, int64_t step) {
    EncodedTensor t;
    TERN_RETURN_IF_ERROR(codec->EncodeSelection(selection, PartOptions(*msg, step), &t));
    msg->parts.emplace_back(std::move(name), std::move(t));
    return absl::OkStatus();
  }
  EncodeOptions PartOptions(const GossipMessage& msg, int64_t step) const {
    EncodeOptions eo;
    // A fresh, reproducible stream per (seed, worker, step, part).
    eo.seed = Mix64(options_.seed ^ Mix64((static_cast<uint64_t>(worker_) << 32) ^
                                          (static_cast<uint64_t>(step) * 4 + msg.parts.size())));
    eo.blocks = blocks_;
    return eo;
  }

  // Part `name` of a message from `from`, after checking that it exists and fits the model.
  absl::StatusOr<const EncodedTensor*> FindPart(int from, const GossipMessage& msg,
                                                absl::string_view name) const {
    const EncodedTensor* t = msg.Find(name);
    if (t == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("message from worker ", from, " lacks part '", name, "'"));
    }
    if (t->numel != x_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("part '", name, "' from worker ", from,
                                                     " has ", t->numel, " elements, expected ",
                                                     x_.size()));
    }
    return t;
  }

  // Whether part `name` of msg would decode, without decoding it.
  absl::Status Validate(int from, const GossipMessage& msg, absl::string_view name) const {
    return FindValid(from, msg, name).status();
  }
  // Part `name` of msg once it is known to decode (FindPart, then the codec's check).
  absl::StatusOr<const EncodedTensor*> FindValid(int from, const GossipMessage& msg,
                                                 absl::string_view name) const {
    TERN_ASSIGN_OR_RETURN(const EncodedTensor* t, FindPart(from, msg, name));
    if (msg.checked) return t;  // checked on arrival
    absl::Status s = codecs_->Validate(EncodedView::Of(*t));
    if (!s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("part '", name, "' from worker ", from, ": ", s.message()));
    }
    return t;
  }

  double decode_seconds() const override { return decode_seconds_; }

  // acc += w * decode(part `name` of msg), after checking that it exists and fits.
  absl::Status Accumulate(int from, const GossipMessage& msg, absl::string_view name, double w,
                          absl::Span<float> acc) {
    TERN_ASSIGN_OR_RETURN(const EncodedTensor* t, FindPart(from, msg, name));
    const WeightedTarget one[1] = {{static_cast<float>(w), acc}};
    return AccumulateEach(from, *t, name, one, msg.checked);
  }
  // Accumulate into several tensors, the part decoded once (Codec::DecodeAccumulateEach).
  // `checked`: the part passed its codec's checks already (on arrival, or FindValid), which the
  // decoder then does not repeat.
  absl::Status AccumulateEach(int from, const EncodedTensor& t, absl::string_view name,
                              absl::Span<const WeightedTarget> targets, bool checked) {
    return TimedDecode(from, t, name, checked, [&](const EncodedView& view) {
      return codecs_->DecodeAccumulateEach(view, targets);
    });
  }
  // out += Σ w_j decode(part j), the parts (sender, part) summed in their order, each checked
  // already (FindValid): one pass over `out` where the codec can (Codec::DecodeAccumulateMany).
  absl::Status AccumulateMany(absl::Span<const std::pair<int, const EncodedTensor*>> parts,
                              absl::string_view name, absl::Span<const float> weights,
                              absl::Span<float> out) {
    std::vector<int> from;
    std::vector<EncodedView> views;
    for (const auto& [j, t] : parts) {
      from.push_back(j);
      views.push_back(EncodedView::Of(*t));
      views.back().checked = true;
    }
    return Timed(from, name, [&] { return codecs_->DecodeAccumulateMany(views, weights, out); });
  }
  // out = decode(t), a part that passed its codec's checks (FindValid).
  absl::Status DecodeChecked(int from, const EncodedTensor& t, absl::string_view name,
                             absl::Span<float> out) {
    return TimedDecode(from, t, name, /*checked=*/true,
                       [&](const EncodedView& view) { return codecs_->Decode(view, out); });
  }
  // `decode`(t's view) timed as decoding (decode_seconds); its error names the part and sender.
  template <typename Decode>
  absl::Status TimedDecode(int from, const EncodedTensor& t, absl::string_view name, bool checked,
                           Decode decode) {
    EncodedView view = EncodedView::Of(t);
    view.checked = checked;
    const int senders[1] = {from};
    return Timed(senders, name, [&] { return decode(view); });
  }
  // `decode`() timed as decoding (decode_seconds); its error names the part and its senders.
  template <typename Decode>
  absl::Status Timed(absl::Span<const int> from, absl::string_view name, Decode decode) {
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status s = decode();
    decode_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("part '", name, "' from worker",
                                                     from.size() == 1 ? " " : "s ",
                                                     absl::StrJoin(from, ", "), ": ", s.message()));
    }
    return absl::OkStatus();
  }

  // sum_j w_ij v_j over the neighbours' part `name`, plus w_ii * self. With clipping on
  // (AlgorithmOptions::clip), each neighbour's v_j - self is first scaled down to the part's
  // radius (ClippedGossip): w_ij (self + min(1, radius / |v_j - self|) (v_j - self)).
  absl::StatusOr<std::vector<float>> Mix(const MixingRow& row,
                                         const std::map<int, const GossipMessage*>& received,
                                         absl::string_view name, absl::Span<const float> self);

  // The clipping radius of part `name`'s contributions.
  ClipRadius& RadiusOf(absl::string_view name) {
    auto it = radii_.find(name);
    if (it == radii_.end()) it = radii_.emplace(std::string(name), ClipRadius(options_.clip)).first;
    return it->second;
  }
  uint64_t contributions_clipped() const override {
    uint64_t n = 0;
    for (const auto& [name, r] : radii_) n += r.clipped();
    return n;
  }

  // Combine mixes what Prepare staged; calling it first is a caller bug, reported, not UB.
  absl::Status RequirePrepared(const std::vector<float>& staged) const {
    if (staged.size() != x_.size()) {
      return absl::FailedPreconditionError(absl::StrCat(Name(), ": Combine before Prepare"));
    }
    return absl::OkStatus();
  }

  static absl::Status CheckReceived(const MixingRow& row,
                                    const std::map<int, const GossipMessage*>& received) {
    if (received.size() != row.neighbours.size()) {
      return absl::InvalidArgumentError(absl::StrCat("got ", received.size(), " messages for ",
                                                     row.neighbours.size(), " neighbours"));
    }
    for (const auto& [j, w] : row.neighbours) {
      auto it = received.find(j);
      if (it == received.end() || it->second == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("no message from neighbour ", j));
      }
    }
    return absl::OkStatus();
  }

  AlgorithmOptions options_;
  const CodecRegistry* codecs_;
  std::unique_ptr<Codec> dense_;
  ModelVector x_;
  // The momentum buffer of the algorithms that keep one (dmsgd, decentlam, heavy-ball, CHOCO's
  // local step), sized at their first use; empty for the others.
  std::vector<float> m_;
  int worker_ = 0;
  std::vector<TensorBlock> blocks_;
  double decode_seconds_ = 0;                             // see decode_seconds()
  std::map<std::string, ClipRadius, std::less<>> radii_;  // by part name
  std::vector<float> neighbour_;                          // Mix's decoded neighbour part
};

}  // namespace tern

#endif  // TERN_WORKER_ALGORITHMS_BASE_H_
