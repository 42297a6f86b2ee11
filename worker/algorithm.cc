#include "worker/algorithm.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/rng.h"
#include "common/simd.h"
#include "common/status_macros.h"
#include "kernels/select.h"

namespace tern {

size_t GossipMessage::PayloadBytes() const {
  size_t n = 0;
  for (const auto& [name, t] : parts) n += t.ByteSize();
  return n;
}

const EncodedTensor* GossipMessage::Find(absl::string_view name) const {
  for (const auto& [n, t] : parts) {
    if (n == name) return &t;
  }
  return nullptr;
}

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

// y += w x.
TERN_MULTIVERSION void Axpy(size_t n, float w, const float* __restrict x, float* __restrict y) {
  for (size_t i = 0; i < n; ++i) y[i] += w * x[i];
}

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
    worker_ = worker;
    return InitState();
  }
  absl::Span<const float> params() const override { return x_; }
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
    const auto t0 = std::chrono::steady_clock::now();
    EncodedView view = EncodedView::Of(t);
    view.checked = checked;
    absl::Status s = codecs_->DecodeAccumulateEach(view, targets);
    decode_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("part '", name, "' from worker ", from, ": ", s.message()));
    }
    return absl::OkStatus();
  }

  // sum_j w_ij v_j over the neighbours' part `name`, plus w_ii * self.
  absl::StatusOr<std::vector<float>> Mix(const MixingRow& row,
                                         const std::map<int, const GossipMessage*>& received,
                                         absl::string_view name, absl::Span<const float> self) {
    TERN_RETURN_IF_ERROR(CheckReceived(row, received));
    std::vector<float> acc(self.size());
    const float ws = static_cast<float>(row.self);
    for (size_t i = 0; i < acc.size(); ++i) acc[i] = ws * self[i];
    for (const auto& [j, w] : row.neighbours) {
      TERN_RETURN_IF_ERROR(Accumulate(j, *received.at(j), name, w, absl::MakeSpan(acc)));
    }
    return acc;
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
  int worker_ = 0;
  std::vector<TensorBlock> blocks_;
  double decode_seconds_ = 0;  // see decode_seconds()
};

// D-PSGD (adapt then combine) and DmSGD: send x - lr * d with d = g (beta = 0) or the momentum
// buffer m = beta m + g; x <- sum_j w_ij (x_j - lr d_j).
class Dpsgd final : public AlgorithmBase {
 public:
  Dpsgd(const AlgorithmOptions& o, const CodecRegistry* c, bool momentum)
      : AlgorithmBase(o, c), momentum_(momentum) {}
  std::string Name() const override { return momentum_ ? "dmsgd" : "dpsgd"; }
  double Momentum() const override { return momentum_ ? options_.momentum : 0; }
  std::vector<std::string> MessageParts() const override { return {"x"}; }
  absl::StatusOr<GossipMessage> Prepare(absl::Span<const float> g, float lr,
                                        int64_t step) override {
    half_.resize(x_.size());
    if (momentum_) {
      m_.resize(x_.size(), 0.0f);
      const float beta = static_cast<float>(options_.momentum);
      for (size_t i = 0; i < x_.size(); ++i) {
        m_[i] = beta * m_[i] + g[i];
        half_[i] = x_[i] - lr * m_[i];
      }
    } else {
      for (size_t i = 0; i < x_.size(); ++i) half_[i] = x_[i] - lr * g[i];
    }
    GossipMessage msg;
    TERN_RETURN_IF_ERROR(AddPart(&msg, "x", half_));
    return msg;
  }
  absl::Status Combine(const MixingRow& row,
                       const std::map<int, const GossipMessage*>& received) override {
    TERN_RETURN_IF_ERROR(RequirePrepared(half_));
    TERN_ASSIGN_OR_RETURN(x_, Mix(row, received, "x", half_));
    return absl::OkStatus();
  }

 private:
  const bool momentum_;
  std::vector<float> half_, m_;
};

// DecentLaM: mix = sum_j w_ij (x_j - lr g_j); m <- beta m + (x - mix) / lr; x <- x - lr m.
class DecentLam final : public AlgorithmBase {
 public:
  using AlgorithmBase::AlgorithmBase;
  std::string Name() const override { return "decentlam"; }
  double Momentum() const override { return options_.momentum; }
  std::vector<std::string> MessageParts() const override { return {"x"}; }
  absl::StatusOr<GossipMessage> Prepare(absl::Span<const float> g, float lr, int64_t) override {
    lr_ = lr;
    half_.resize(x_.size());
    for (size_t i = 0; i < x_.size(); ++i) half_[i] = x_[i] - lr * g[i];
    GossipMessage msg;
    TERN_RETURN_IF_ERROR(AddPart(&msg, "x", half_));
    return msg;
  }
  absl::Status Combine(const MixingRow& row,
                       const std::map<int, const GossipMessage*>& received) override {
    TERN_RETURN_IF_ERROR(RequirePrepared(half_));
    TERN_ASSIGN_OR_RETURN(std::vector<float> mix, Mix(row, received, "x", half_));
    m_.resize(x_.size(), 0.0f);
    const float beta = static_cast<float>(options_.momentum);
    for (size_t i = 0; i < x_.size(); ++i) {
      m_[i] = beta * m_[i] + (x_[i] - mix[i]) / lr_;
      x_[i] -= lr_ * m_[i];
    }
    return absl::OkStatus();
  }

 private:
  float lr_ = 0;
  std::vector<float> half_, m_;
};

// Heavy-ball consensus: neighbours exchange x and m; m <- beta sum_j w_ij m_j + g;
// x <- sum_j w_ij x_j - lr m.
class HeavyBall final : public AlgorithmBase {
 public:
  using AlgorithmBase::AlgorithmBase;
  std::string Name() const override { return "heavy-ball"; }
  double Momentum() const override { return options_.momentum; }
  std::vector<std::string> MessageParts() const override { return {"x", "m"}; }
  absl::StatusOr<GossipMessage> Prepare(absl::Span<const float> g, float lr, int64_t) override {
    lr_ = lr;
    g_.assign(g.begin(), g.end());
    m_.resize(x_.size(), 0.0f);
    GossipMessage msg;
    TERN_RETURN_IF_ERROR(AddPart(&msg, "x", x_));
    TERN_RETURN_IF_ERROR(AddPart(&msg, "m", m_));
    return msg;
  }
  absl::Status Combine(const MixingRow& row,
                       const std::map<int, const GossipMessage*>& received) override {
    TERN_RETURN_IF_ERROR(RequirePrepared(g_));
    TERN_ASSIGN_OR_RETURN(std::vector<float> mx, Mix(row, received, "x", x_));
    TERN_ASSIGN_OR_RETURN(std::vector<float> mm, Mix(row, received, "m", m_));
    const float beta = static_cast<float>(options_.momentum);
    for (size_t i = 0; i < x_.size(); ++i) {
      m_[i] = beta * mm[i] + g_[i];
      x_[i] = mx[i] - lr_ * m_[i];
    }
    return absl::OkStatus();
  }

 private:
  float lr_ = 0;
  std::vector<float> g_, m_;
};

// CHOCO-SGD: public copies x_hat of itself and each neighbour, updated only by compressed
// differences, so any codec is safe: q = C(x - x_hat_self) goes out; x_hat_j += D(q_j);
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
    return msg;
  }
  absl::Status Combine(const MixingRow& row,
                       const std::map<int, const GossipMessage*>& received) override {
    TERN_RETURN_IF_ERROR(RequirePrepared(diff_));
    TERN_RETURN_IF_ERROR(CheckReceived(row, received));
    // Every message is checked before anything changes, so a bad one changes nothing.
    std::vector<const EncodedTensor*> qs;
    qs.reserve(row.neighbours.size());
    for (const auto& [j, w] : row.neighbours) {
      TERN_ASSIGN_OR_RETURN(qs.emplace_back(), FindValid(j, *received.at(j), "q"));
    }
    const bool incremental =
        sum_valid_ && SameNeighbours(row, sum_row_) && ++rounds_since_rebuild_ < kRebuildEvery;
    // Each q is decoded once into the neighbour's copy and, between rebuilds, into s.
    for (size_t k = 0; k < row.neighbours.size(); ++k) {
      const auto& [j, w] = row.neighbours[k];
      std::vector<float>& hat = hat_[j];
      hat.resize(x_.size(), 0.0f);  // a neighbour not heard before starts at 0, like x_hat_self
      const WeightedTarget both[2] = {{1.0f, absl::MakeSpan(hat)},
                                      {static_cast<float>(w), absl::MakeSpan(sum_)}};
      TERN_RETURN_IF_ERROR(AccumulateEach(j, *qs[k], "q",
                                          absl::MakeConstSpan(both, incremental ? 2 : 1),
                                          /*checked=*/true));
    }
    if (!incremental) TERN_RETURN_IF_ERROR(RebuildSum(row));
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
    hat_self_.assign(x_.size(), 0.0f);
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
  std::vector<float> m_, diff_, hat_self_;
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
};

// Local SGD: H plain SGD steps, then one exact gossip average of the models.
class LocalSgd final : public AlgorithmBase {
 public:
  using AlgorithmBase::AlgorithmBase;
  std::string Name() const override { return "local-sgd"; }
  std::vector<std::string> MessageParts() const override { return {"x"}; }
  bool Communicates(int64_t step) const override {
    return (step + 1) % std::max(1, options_.local_steps) == 0;
  }
  absl::StatusOr<GossipMessage> Prepare(absl::Span<const float> g, float lr,
                                        int64_t step) override {
    for (size_t i = 0; i < x_.size(); ++i) x_[i] -= lr * g[i];
    GossipMessage msg;
    if (Communicates(step)) TERN_RETURN_IF_ERROR(AddPart(&msg, "x", x_));
    return msg;
  }
  absl::Status Combine(const MixingRow& row,
                       const std::map<int, const GossipMessage*>& received) override {
    TERN_ASSIGN_OR_RETURN(x_, Mix(row, received, "x", x_));
    return absl::OkStatus();
  }
};

// SwarmSGD: H local SGD steps, then x <- (x + Q(x_j)) / 2 with one random neighbour j, without
// global rounds (the engine runs the pairwise exchanges). Combine mixes whatever it is handed,
// so the engine can also apply an average a neighbour started.
class Swarm final : public AlgorithmBase {
 public:
  using AlgorithmBase::AlgorithmBase;
  std::string Name() const override { return "swarm"; }
  std::vector<std::string> MessageParts() const override { return {"x"}; }
  bool Asynchronous() const override { return true; }
  bool Communicates(int64_t step) const override {
    return (step + 1) % std::max(1, options_.local_steps) == 0;
  }
  absl::StatusOr<GossipMessage> Prepare(absl::Span<const float> g, float lr,
                                        int64_t step) override {
    for (size_t i = 0; i < x_.size(); ++i) x_[i] -= lr * g[i];
    return Publish(step);
  }
  absl::StatusOr<GossipMessage> Publish(int64_t step) override {
    GossipMessage msg;
    TERN_RETURN_IF_ERROR(AddPart(&msg, "x", x_, nullptr, step));
    return msg;
  }
  absl::Status Combine(const MixingRow& row,
                       const std::map<int, const GossipMessage*>& received) override {
    TERN_ASSIGN_OR_RETURN(x_, Mix(row, received, "x", x_));
    return absl::OkStatus();
  }
};

}  // namespace

namespace {

absl::Status CheckOptions(const AlgorithmOptions& o) {
  if (o.momentum < 0 || o.momentum >= 1) {
    return absl::InvalidArgumentError(absl::StrCat("momentum must be in [0, 1), got ", o.momentum));
  }
  if (o.consensus_step <= 0 || o.consensus_step > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("consensus step must be in (0, 1], got ", o.consensus_step));
  }
  if (o.local_steps < 1) return absl::InvalidArgumentError("local_steps must be >= 1");
  return absl::OkStatus();
}

// Algorithms other than CHOCO send the model (and momentum) itself, with no error compensation:
// a lossy codec's error lands in x every round and accumulates (DecentLaM with top-k 1 %
// trains to 45 % where fp16 gets 84 %). Only near-exact codecs keep them converging; CHOCO's
// x-hat copies absorb any compressor's error (ALGORITHMS.md, compressed gossip).
absl::Status CheckCodecFor(absl::string_view algorithm, const AlgorithmOptions& o,
                           const CodecRegistry* codecs) {
  TERN_RETURN_IF_ERROR(codecs->Create(o.codec).status());
  if (algorithm == "choco") return absl::OkStatus();
  const std::string name = o.codec.substr(0, o.codec.find(':'));
  for (const char* exact : {"none", "fp16", "bf16", "int8"}) {
    if (name == exact) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(algorithm,
                   " sends the model itself, so its codec must be near-exact (none, fp16, bf16, "
                   "int8); '",
                   o.codec,
                   "' would compound its error every round: use --algorithm=choco for "
                   "compressed gossip"));
}

// A factory for algorithm `name`, implemented by A; the options and the codec are checked here,
// so a bad one fails at creation rather than at Init.
template <typename A, typename... Extra>
AlgorithmRegistry::Factory Make(const char* name, Extra... extra) {
  return
      [name, extra...](SpecParams&, const AlgorithmOptions& o,
                       const CodecRegistry* codecs) -> absl::StatusOr<std::unique_ptr<Algorithm>> {
        TERN_RETURN_IF_ERROR(CheckOptions(o));
        TERN_RETURN_IF_ERROR(CheckCodecFor(name, o, codecs));
        return std::make_unique<A>(o, codecs, extra...);
      };
}

}  // namespace

std::unique_ptr<AlgorithmRegistry> NewBuiltinAlgorithmRegistry() {
  auto r = std::make_unique<AlgorithmRegistry>("algorithm");
  const std::pair<const char*, AlgorithmRegistry::Factory> all[] = {
      {"dpsgd", Make<Dpsgd>("dpsgd", false)},
      {"dmsgd", Make<Dpsgd>("dmsgd", true)},
      {"decentlam", Make<DecentLam>("decentlam")},
      {"heavy-ball", Make<HeavyBall>("heavy-ball")},
      {"choco", Make<Choco>("choco")},
      {"local-sgd", Make<LocalSgd>("local-sgd")},
      {"swarm", Make<Swarm>("swarm")},
  };
  // Distinct names by construction: Register cannot fail here.
  for (const auto& [name, factory] : all) (void)r->Register(name, factory);
  return r;
}

}  // namespace tern
