#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/simd.h"
#include "worker/algorithms/algorithms.h"
#include "worker/algorithms/base.h"

namespace tern {
namespace {

// CHOCO's loops over the whole model, as free functions: GCC honours __restrict on parameters
// (not on local pointers), and without it these stay scalar (a third of a worker's CPU in the
// race, docs/benchmarks.md). The arrays are distinct: the gradient and a bound model are separate
// regions of a trainer's segment.

// x + gc (s - ws x_hat_self): one coordinate of the consensus step, the same whether Settle
// applies it or the next local step fuses it.
inline float ChocoMixed(float x, float gc, float s, float ws, float hs) {
  return x + gc * (s - ws * hs);
}

// m = beta m + g; x = x + gc (s - ws hs) - lr m (gc == 0: no consensus term, s unread);
// d = x - hs: one pass over the model.
TERN_MULTIVERSION void ChocoLocalStep(size_t n, const float* __restrict g,
                                      const float* __restrict hs, const float* __restrict s,
                                      float* __restrict m, float* __restrict x, float* __restrict d,
                                      float beta, float lr, float gc, float ws) {
  if (gc != 0.0f) {
    for (size_t i = 0; i < n; ++i) {
      m[i] = beta * m[i] + g[i];
      x[i] = ChocoMixed(x[i], gc, s[i], ws, hs[i]) - lr * m[i];
      d[i] = x[i] - hs[i];
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      m[i] = beta * m[i] + g[i];
      x[i] -= lr * m[i];
      d[i] = x[i] - hs[i];
    }
  }
}

// d = x - y.
TERN_MULTIVERSION void Subtract(size_t n, const float* __restrict x, const float* __restrict y,
                                float* __restrict d) {
  for (size_t i = 0; i < n; ++i) d[i] = x[i] - y[i];
}

TERN_MULTIVERSION void ChocoMix(size_t n, const float* __restrict s, const float* __restrict hs,
                                float* __restrict x, float gc, float ws) {
  for (size_t i = 0; i < n; ++i) x[i] = ChocoMixed(x[i], gc, s[i], ws, hs[i]);
}

// CHOCO-SGD: public copies x_hat of itself and each neighbour, updated only by compressed
// differences, so any codec is safe: q = C(x - x_hat_self) goes out; x_hat_j += D(q_j) (with
// clipping on, D(q_j) scaled to the radius first: AlgorithmOptions::clip);
// x <- x + gamma_c sum_j w_ij (x_hat_j - x_hat_self).
//
// Mixing is deferred: in overlap mode the next Prepare follows at once and folds it into its pass
// over the model; otherwise the engine's Settle() applies it.
//
// The consensus term is c = s - (sum_j w_ij) x_hat_self with s = sum_j w_ij x_hat_j. s changes
// only where the neighbours' q's are non-zero, so it is kept up to date with them (+w_ij q_j)
// instead of being rebuilt from the copies each round, and x_hat_self is read by the mixing pass
// anyway. A round then costs the local step, the encoding, one sparse decode per message and one
// pass over the model. The neighbours' copies x_hat_j are needed only to rebuild s (when the row
// changes: a dropped neighbour, a dynamic topology; and every kRebuildEvery rounds, which bounds
// rounding drift); each q is added to its copy in the same decode that adds it to s
// (Codec::DecodeAccumulateEach: STC parses its positions once for both).
class Choco final : public AlgorithmBase {
 public:
  using AlgorithmBase::AlgorithmBase;
  std::string Name() const override { return "choco"; }
  double Momentum() const override { return options_.momentum; }
  std::vector<std::string> MessageParts() const override { return {"q"}; }
  std::vector<std::string> OptionalParts() const override { return {"hat"}; }
  bool KeepsNeighbourCopies() const override { return true; }
  uint64_t copies_resynced() const override { return resynced_; }
  void JoinedLate() override {
    // Its own copy starts at its model (the first q is then one step's change, not the model);
    // its neighbours take it whole with its first message, and it asks for theirs.
    hat_self_.assign(x_.data(), x_.data() + x_.size());
    late_ = true;
    send_hat_ = true;
  }
  absl::StatusOr<GossipMessage> Prepare(absl::Span<const float> g, float lr,
                                        int64_t step) override {
    m_.resize(x_.size(), 0.0f);
    diff_.resize(x_.size());
    // The last round's mixing in the same pass as this step's update.
    const float gc = mix_pending_ ? static_cast<float>(options_.consensus_step) : 0.0f;
    mix_pending_ = false;
    GossipMessage msg;
    const size_t k = codec_->TopK(x_.size());
    if (k == 0 || k >= x_.size()) {
      LocalStep(g, lr, gc);
      TERN_RETURN_IF_ERROR(AddPart(&msg, "q", diff_, codec_.get(), step));
    } else {
      SelectingStep(g, lr, gc, k);
      const TopKSelection selection{x_.size(), selected_, selected_values_};
      TERN_RETURN_IF_ERROR(AddSelectedPart(&msg, "q", selection, codec_.get(), step));
    }
    // Our own public copy moves by exactly what the neighbours will add to theirs.
    TERN_RETURN_IF_ERROR(Accumulate(worker_, msg, "q", 1.0, absl::MakeSpan(hat_self_)));
    if (send_hat_) {
      // A neighbour lost step with it: the whole copy, exactly, after this round's q.
      TERN_RETURN_IF_ERROR(AddPart(&msg, "hat", hat_self_, exact_.get(), step));
      send_hat_ = false;
      hat_sent_ = step;
    }
    msg.resync.assign(stale_.begin(), stale_.end());
    prepared_ = step;
    return msg;
  }
  absl::Status Combine(const MixingRow& row,
                       const std::map<int, const GossipMessage*>& received) override {
    TERN_RETURN_IF_ERROR(RequirePrepared(diff_));
    TERN_RETURN_IF_ERROR(CheckReceived(row, received));
    // Every message is checked before anything changes, so a bad one changes nothing.
    struct Heard {
      int j = 0;
      double w = 0;
      const EncodedTensor* q = nullptr;
      const EncodedTensor* hat = nullptr;  // its whole copy, when it sent one
      double norm = 0;
      bool whole = false;  // its copy taken from `hat`, not moved by q
    };
    std::vector<Heard> heard;
    heard.reserve(row.neighbours.size());
    for (const auto& [j, w] : row.neighbours) {
      const GossipMessage& msg = *received.at(j);
      Heard& h = heard.emplace_back(Heard{.j = j, .w = w});
      TERN_ASSIGN_OR_RETURN(h.q, FindValid(j, msg, "q"));
      if (msg.Find("hat") != nullptr) {
        TERN_ASSIGN_OR_RETURN(h.hat, FindValid(j, msg, "hat"));
      }
      // Clipping scales q itself: x_hat_j moves by at most the radius a round (from the payload:
      // STC's is sqrt(k) |mu|, a sparse codec's its values).
      if (options_.clip.enabled()) {
        EncodedView view = EncodedView::Of(*h.q);
        view.checked = true;  // FindValid's
        TERN_ASSIGN_OR_RETURN(h.norm, codecs_->Norm(view));
      }
    }
    // A copy stays in step only while every q of its neighbour is added to it: one that missed
    // a round (a message past the deadline, a neighbour down or joining) is out of step for good
    // and mixed no more until its neighbour sends its whole copy, which this worker's messages
    // ask for. A neighbour first heard is in step only in a run's first round.
    const bool first = !late_ && combined_++ == 0;
    for (const auto& [j, copy] : hat_) {
      if (std::none_of(heard.begin(), heard.end(), [j = j](const Heard& h) { return h.j == j; })) {
        stale_.insert(j);
      }
    }
    MixingRow mixed;
    bool replaced = false;
    for (Heard& h : heard) {
      const bool known = hat_.contains(h.j) && !stale_.contains(h.j);
      if (h.hat != nullptr && !known) {
        std::vector<float>& hat = hat_[h.j];
        hat.resize(x_.size());
        TERN_RETURN_IF_ERROR(DecodeChecked(h.j, *h.hat, "hat", absl::MakeSpan(hat)));
        if (options_.clip.enabled()) {
          // A whole copy, as a model is clipped: its distance from ours, to the radius such
          // distances had (it is taken as clipped, and then counts as in step).
          const double d = std::sqrt(SquaredDistance(x_.size(), hat.data(), hat_self_.data()));
          if (const float scale = static_cast<float>(RadiusOf("hat").Scale(d)); scale < 1.0f) {
            for (size_t i = 0; i < hat.size(); ++i) {
              hat[i] = hat_self_[i] + scale * (hat[i] - hat_self_[i]);
            }
          }
        }
        stale_.erase(h.j);
        h.whole = replaced = true;
        ++resynced_;
      } else if (!known && !(first && !hat_.contains(h.j))) {
        stale_.insert(h.j);
        continue;
      }
      mixed.neighbours.emplace_back(h.j, h.w);
    }
    // Asked for this worker's copy by a message made after it last sent one (with overlap, two
    // rounds after: the ask may predate it).
    for (const Heard& h : heard) {
      const std::vector<int>& asks = received.at(h.j)->resync;
      if (prepared_ > hat_sent_ + 2 && std::find(asks.begin(), asks.end(), worker_) != asks.end()) {
        send_hat_ = true;
      }
    }
    const bool incremental = !replaced && sum_valid_ && SameNeighbours(mixed, sum_row_) &&
                             ++rounds_since_rebuild_ < kRebuildEvery;
    // Each q is decoded once into the neighbour's copy and, between rebuilds, into s. (A q
    // clipped moves the copy by less than it moved its owner's: the price of the bound, as
    // before; asking for the whole copy then would undo the bound.)
    for (const Heard& h : heard) {
      if (h.whole || stale_.contains(h.j)) continue;  // taken whole, or left out
      std::vector<float>& hat = hat_[h.j];
      hat.resize(x_.size(), 0.0f);  // a neighbour of the run's first round starts at 0, as we do
      const double scale = options_.clip.enabled() ? RadiusOf("q").Scale(h.norm) : 1.0;
      const WeightedTarget both[2] = {{static_cast<float>(scale), absl::MakeSpan(hat)},
                                      {static_cast<float>(h.w * scale), absl::MakeSpan(sum_)}};
      TERN_RETURN_IF_ERROR(AccumulateEach(h.j, *h.q, "q",
                                          absl::MakeConstSpan(both, incremental ? 2 : 1),
                                          /*checked=*/true));
    }
    if (!incremental) TERN_RETURN_IF_ERROR(RebuildSum(mixed));
    mix_pending_ = true;  // by Settle(), or fused into the next Prepare
    return absl::OkStatus();
  }
  void Settle() override {
    if (!mix_pending_) return;
    const float gc = static_cast<float>(options_.consensus_step);
    const float ws = static_cast<float>(WeightSum(sum_row_));
    ChocoMix(x_.size(), sum_.data(), hat_self_.data(), x_.data(), gc, ws);
    mix_pending_ = false;
  }

 protected:
  absl::Status InitState() override {
    TERN_ASSIGN_OR_RETURN(codec_, codecs_->Create(options_.codec));
    TERN_ASSIGN_OR_RETURN(exact_, codecs_->Create("none"));
    hat_self_.assign(x_.size(), 0.0f);
    stale_.clear();
    late_ = send_hat_ = false;
    combined_ = 0;
    prepared_ = hat_sent_ = std::numeric_limits<int64_t>::min() / 2;
    min_key_ = 0;
    margin_ = 0.9f;
    hat_.clear();
    sum_valid_ = false;
    mix_pending_ = false;
    return absl::OkStatus();
  }

 private:
  static constexpr int kRebuildEvery = 64;
  // SelectingStep's blocks (8 KiB of diff on the stack, in L1) and the bounds of how far under
  // the last k-th magnitude it filters: x_hat_self chases x, so diff's k-th magnitude moves
  // little from one round to the next; candidates past k cost a selection among them, too few a
  // pass more.
  static constexpr size_t kSelectBlock = 2048;
  static constexpr float kMinMargin = 0.25f, kMaxMargin = 0.99f;

  // m = beta m + g; x = x + gc (s - ws x_hat_self) - lr m; diff = x - x_hat_self.
  void LocalStep(absl::Span<const float> grad, float lr, float gc) {
    ChocoLocalStep(x_.size(), grad.data(), hat_self_.data(), gc != 0.0f ? sum_.data() : nullptr,
                   m_.data(), x_.data(), diff_.data(), static_cast<float>(options_.momentum), lr,
                   gc, static_cast<float>(WeightSum(sum_row_)));
  }

  // The local step for a top-k codec (STC, top-k), selecting as it goes: each block of
  // diff = x - x_hat_self is computed into the stack and filtered there by a threshold a little
  // under the last round's k-th magnitude, so diff never goes to memory and is not read again.
  // When fewer than k pass (the magnitudes fell), diff is stored and selected whole, as the codec
  // would. Either way the selection is SelectTopK's, so the payload is Encode(diff)'s bit for bit.
  void SelectingStep(absl::Span<const float> grad, float lr, float gc, size_t k) {
    const size_t n = x_.size();
    selected_.clear();
    selected_values_.clear();
    bool enough = false;
    if (min_key_ != 0) {
      const float beta = static_cast<float>(options_.momentum);
      const float ws = static_cast<float>(WeightSum(sum_row_));
      float block[kSelectBlock];
      for (size_t b = 0; b < n; b += kSelectBlock) {
        const size_t len = std::min(kSelectBlock, n - b);
        ChocoLocalStep(len, grad.data() + b, hat_self_.data() + b,
                       gc != 0.0f ? sum_.data() + b : nullptr, m_.data() + b, x_.data() + b, block,
                       beta, lr, gc, ws);
        AppendAtLeast(absl::MakeConstSpan(block, len), static_cast<uint32_t>(b), min_key_,
                      &selected_, &selected_values_);
      }
      enough = selected_.size() >= k;
      if (!enough) Subtract(n, x_.data(), hat_self_.data(), diff_.data());
      // Closer under the k-th magnitude while well over k pass (a Gaussian's tail at 1 % holds
      // 4k above 0.8 of its k-th magnitude), further when too few did.
      if (!enough) {
        margin_ = std::max(kMinMargin, margin_ * 0.8f);
      } else if (selected_.size() > k + k / 2) {
        margin_ = std::min(kMaxMargin, margin_ * 1.02f);
      }
    } else {
      LocalStep(grad, lr, gc);
    }
    if (enough) {
      KeepTopK(k, &selected_, &selected_values_);
    } else {
      SelectTopK(diff_, k, &selected_, nullptr, &selected_values_);
    }
    float kth = std::numeric_limits<float>::infinity();
    for (float v : selected_values_) kth = std::min(kth, std::fabs(v));
    // Key 0 (a zero k-th magnitude) would pass everything: no filter next round then.
    min_key_ = MagnitudeKey(kth * margin_);
  }

  static double WeightSum(const MixingRow& row) {
    double s = 0;
    for (const auto& [j, w] : row.neighbours) s += w;
    return s;
  }
  static bool SameNeighbours(const MixingRow& a, const MixingRow& b) {
    return a.neighbours == b.neighbours;
  }
  // s = sum_j w_ij x_hat_j from the copies.
  absl::Status RebuildSum(const MixingRow& row) {
    sum_.assign(x_.size(), 0.0f);
    for (const auto& [j, w] : row.neighbours) {
      std::vector<float>& hat = hat_[j];
      hat.resize(x_.size(), 0.0f);
      Axpy(x_.size(), static_cast<float>(w), hat.data(), sum_.data());
    }
    sum_row_ = row;
    sum_valid_ = true;
    rounds_since_rebuild_ = 0;
    return absl::OkStatus();
  }

  std::unique_ptr<Codec> codec_;
  std::unique_ptr<Codec> exact_;  // fp32: a whole public copy
  std::vector<float> diff_, hat_self_;
  std::vector<uint32_t> selected_;  // this round's top-k of diff (a top-k codec's input)
  std::vector<float> selected_values_;
  uint32_t min_key_ = 0;  // SelectingStep's filter; 0: none yet
  float margin_ = 0.9f;   // min_key_ over the last k-th magnitude
  std::map<int, std::vector<float>> hat_;
  std::vector<float> sum_;  // s, for sum_row_'s neighbours and weights
  MixingRow sum_row_;
  bool sum_valid_ = false;
  int rounds_since_rebuild_ = 0;
  bool mix_pending_ = false;  // Combine's mixing not applied yet
  // Neighbours whose copy is out of step: left out of the mixing, asked for (resync).
  std::set<int> stale_;
  bool late_ = false;      // JoinedLate: no copy of a neighbour first heard is in step
  int64_t combined_ = 0;   // Combine calls since Init
  bool send_hat_ = false;  // the next message carries our whole copy ("hat")
  int64_t prepared_ = 0, hat_sent_ = 0;  // steps of the last Prepare and the last "hat" sent
  uint64_t resynced_ = 0;                // copies taken whole (copies_resynced)
};

}  // namespace

std::unique_ptr<Algorithm> NewChoco(const AlgorithmOptions& options, const CodecRegistry* codecs) {
  return std::make_unique<Choco>(options, codecs);
}

}  // namespace tern
