// DP-FedAvg (McMahan et al. 2018; docs/server.md, "Differential privacy"): each client's update
// clipped to L2 norm S, Gaussian noise N(0, z^2 S^2) added to the round's sum at the server, and
// the privacy spent tracked by a Renyi-DP accountant of the subsampled Gaussian mechanism
// (Mironov, Talwar, Zhang 2019), reported as epsilon at delta. The clip S is fixed, or adapted
// each round towards a quantile of the clients' update norms (Andrew et al. 2021).
//
// Thread-safety: thread-compatible (the aggregator holds them under its lock).
#ifndef TERN_SERVER_PRIVACY_H_
#define TERN_SERVER_PRIVACY_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "tern/internal/checkpoint.pb.h"

namespace tern {

// RDP of order `alpha` (> 1) of one step of the Gaussian mechanism with noise multiplier `z`
// on a Poisson sample of rate `q` (Mironov, Talwar, Zhang 2019, section 3.3): integer orders by
// the binomial sum, fractional ones by the two-sided series; +inf where it does not converge.
double SampledGaussianRdp(double q, double z, double alpha);

// Epsilon at `delta` from RDP values at `orders`: the smallest over the orders of
// rdp + log(1 - 1/a) - (log delta + log a) / (a - 1) (Canonne, Kamath, Steinke 2020,
// Proposition 12: tighter than the classic rdp - log(delta) / (a - 1)). Sets `*order` to the
// order it came from.
double EpsilonFromRdp(absl::Span<const double> orders, absl::Span<const double> rdp, double delta,
                      double* order = nullptr);

class RdpAccountant {
 public:
  RdpAccountant();
  // One more release of the subsampled Gaussian mechanism (q, z), composed with the ones before.
  void Add(double q, double z);
  // Epsilon at `delta` of everything added so far; with `then_q` > 0, as it would be after one
  // more (then_q, then_z) step (a budget's look ahead).
  double Epsilon(double delta, double then_q = 0, double then_z = 0) const;
  const std::vector<double>& orders() const { return orders_; }
  const std::vector<double>& rdp() const { return rdp_; }
  // The composed RDP, for the checkpoint; Restore refuses one of another length.
  absl::Status Restore(absl::Span<const double> rdp);

 private:
  std::vector<double> orders_;
  std::vector<double> rdp_;
};

struct DpOptions {
  double clip = 0;            // S (the first S when adaptive); 0: DP off
  double noise = 1.0;         // z: the noise's standard deviation is z S on the round's sum
  double delta = 1e-5;        // epsilon is reported at this delta
  double epsilon_budget = 0;  // > 0: no round opens that would take epsilon past it
  // Adaptive clipping (Andrew et al. 2021): with a quantile gamma in (0, 1), each client also
  // says whether its update's norm was within S (TensorBundle.dp_within_clip), and after each
  // round S <- S exp(-clip_lr (b - gamma)), b the fraction within, estimated with Gaussian noise
  // of sd clip_count_noise on the count. z stays the privacy of the pair of releases: the
  // update's noise multiplier becomes (z^-2 - (2 clip_count_noise)^-2)^-1/2 (their Theorem 1).
  double clip_quantile = 0;     // gamma; 0: the clip stays S
  double clip_lr = 0.2;         // eta_C
  double clip_count_noise = 0;  // sigma_b, > z / 2; 0: the server makes it K / 20
};

// The checks on DpOptions that need no run: quantile in [0, 1), lr > 0, and a count noise that
// leaves the update some (2 sigma_b > z) when the clip adapts under noise.
absl::Status CheckDpOptions(const DpOptions& options);

// z_Delta, the noise multiplier the update's release gets so that it and the count's release
// together are one Gaussian mechanism of multiplier z (Andrew et al. 2021, Theorem 1); z itself
// when the clip is fixed.
double UpdateNoiseMultiplier(const DpOptions& options);

// The central mechanism of a DP-FedAvg run.
class DpFedAvg {
 public:
  explicit DpFedAvg(DpOptions options)
      : options_(options), clip_(options.clip), update_noise_(UpdateNoiseMultiplier(options)) {}

  const DpOptions& options() const { return options_; }
  bool adaptive() const { return options_.clip_quantile > 0; }
  // The clip the open round's clients get (Task.dp_clip) and are held to.
  double clip() const { return clip_; }
  // Whether an update of L2 norm `norm` is within the clip (a little slack for fp16 payloads).
  bool WithinClip(double norm) const;
  // The round's release from the mean of `count` clipped updates (each weighted 1) when
  // `sampled` clients were asked: (sum + N(0, z_Delta^2 S^2 I)) / sampled, the denominator fixed
  // by the sampling, not by who replied. Noise from OpenSSL's RAND_bytes.
  absl::Status Release(absl::Span<float> mean, size_t count, size_t sampled) const;
  // Adaptive clipping: an accepted update of the open round whose norm was (or was not) within
  // the clip before its client clipped it; `times` -1 takes one back. Nothing with a fixed clip.
  void CountWithin(bool within, int times = 1);
  // Adaptive clipping, as the round closes after Release: the clip for the next round from the
  // noised fraction of the `sampled` clients within it (the centred count, so that a client
  // that never replied counts as neither). Sets `*fraction` to that estimate.
  absl::Status AdaptClip(size_t sampled, double* fraction);
  // The round's privacy is spent: q the clients sampled over those available, z the noise
  // multiplier the round's release had (options().noise, or less when fewer clients than
  // planned added their share of it).
  void Spend(double q, double z) { accountant_.Add(q, z); }
  double Epsilon() const { return accountant_.Epsilon(options_.delta); }
  // Whether one more round at rate q would take epsilon past the budget.
  bool WouldExceedBudget(double q, double* epsilon_then) const;

  void Save(internal::DpState* state) const;
  absl::Status Restore(const internal::DpState& state);

 private:
  const DpOptions options_;
  RdpAccountant accountant_;
  double clip_;
  const double update_noise_;
  double round_within_ = 0;  // the open round's sum of (within - 1/2)
};

}  // namespace tern

#endif  // TERN_SERVER_PRIVACY_H_
