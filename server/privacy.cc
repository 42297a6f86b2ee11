#include "server/privacy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "core/federated/secagg_crypto.h"

namespace tern {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// log(exp(a) + exp(b)).
double LogAdd(double a, double b) {
  if (a == -kInf) return b;
  if (b == -kInf) return a;
  const double hi = std::max(a, b);
  return hi + std::log1p(std::exp(std::min(a, b) - hi));
}

// log(exp(a) - exp(b)), a >= b.
double LogSub(double a, double b) {
  if (b == -kInf) return a;
  if (a <= b) return -kInf;
  return a + std::log1p(-std::exp(b - a));
}

// log(erfc(x)), past where erfc underflows by its asymptotic series.
double LogErfc(double x) {
  if (x < 20) return std::log(std::erfc(x));
  const double x2 = x * x;
  return -std::log(M_PI) / 2 - std::log(x) - x2 - 0.5 / x2 + 0.625 / (x2 * x2) -
         37.0 / 24.0 / (x2 * x2 * x2) + 353.0 / 64.0 / (x2 * x2 * x2 * x2);
}

// log A_alpha for integer alpha: the binomial expansion of E[(1 - q + q e^{...})^alpha].
double LogAInt(double q, double z, int alpha) {
  double log_a = -kInf;
  for (int i = 0; i <= alpha; ++i) {
    const double log_coef = std::lgamma(alpha + 1.0) - std::lgamma(i + 1.0) -
                            std::lgamma(alpha - i + 1.0) + i * std::log(q) +
                            (alpha - i) * std::log1p(-q);
    log_a = LogAdd(log_a, log_coef + (static_cast<double>(i) * i - i) / (2 * z * z));
  }
  return log_a;
}

// log A_alpha for fractional alpha: the series split at z0 (Mironov, Talwar, Zhang 2019, 3.3).
double LogAFrac(double q, double z, double alpha) {
  double log_a0 = -kInf, log_a1 = -kInf;
  const double z0 = z * z * std::log(1 / q - 1) + 0.5;
  double log_abs_coef = 0;  // log |binom(alpha, i)|
  bool negative = false;    // its sign
  for (int i = 0; i < 100000; ++i) {
    if (i > 0) {
      const double f = (alpha - (i - 1)) / i;
      log_abs_coef += std::log(std::fabs(f));
      if (f < 0) negative = !negative;
    }
    const double j = alpha - i;
    const double log_t0 = log_abs_coef + i * std::log(q) + j * std::log1p(-q);
    const double log_t1 = log_abs_coef + j * std::log(q) + i * std::log1p(-q);
    const double log_e0 = std::log(0.5) + LogErfc((i - z0) / (M_SQRT2 * z));
    const double log_e1 = std::log(0.5) + LogErfc((z0 - j) / (M_SQRT2 * z));
    const double log_s0 = log_t0 + (static_cast<double>(i) * i - i) / (2 * z * z) + log_e0;
    const double log_s1 = log_t1 + (j * j - j) / (2 * z * z) + log_e1;
    if (!negative) {
      log_a0 = LogAdd(log_a0, log_s0);
      log_a1 = LogAdd(log_a1, log_s1);
    } else {
      log_a0 = LogSub(log_a0, log_s0);
      log_a1 = LogSub(log_a1, log_s1);
    }
    if (std::max(log_s0, log_s1) < -30) break;
  }
  return LogAdd(log_a0, log_a1);
}

// The orders the accountant tracks: fine near 1, where small epsilons are decided, then up to
// 256 for many rounds of little noise.
std::vector<double> DefaultOrders() {
  std::vector<double> o;
  for (int x = 1; x < 100; ++x) o.push_back(1 + x / 10.0);
  for (int a = 11; a <= 64; ++a) o.push_back(a);
  for (double a : {96.0, 128.0, 192.0, 256.0, 512.0}) o.push_back(a);
  return o;
}

}  // namespace

double SampledGaussianRdp(double q, double z, double alpha) {
  if (q <= 0) return 0;
  if (z <= 0) return kInf;
  if (q >= 1) return alpha / (2 * z * z);
  if (std::isinf(alpha)) return kInf;
  const double log_a = alpha == std::floor(alpha) && alpha < 1e6
                           ? LogAInt(q, z, static_cast<int>(alpha))
                           : LogAFrac(q, z, alpha);
  return log_a / (alpha - 1);
}

double EpsilonFromRdp(absl::Span<const double> orders, absl::Span<const double> rdp, double delta,
                      double* order) {
  double best = kInf, best_order = 0;
  for (size_t k = 0; k < orders.size() && k < rdp.size(); ++k) {
    const double a = orders[k], r = rdp[k];
    double eps = kInf;
    if (delta * delta + std::expm1(-r) >= 0) {
      eps = 0;
    } else if (a > 1.01) {
      eps = r + std::log1p(-1 / a) - std::log(delta * a) / (a - 1);
    }
    if (eps < best) {
      best = eps;
      best_order = a;
    }
  }
  if (order != nullptr) *order = best_order;
  return std::max(0.0, best);
}

RdpAccountant::RdpAccountant() : orders_(DefaultOrders()), rdp_(orders_.size(), 0.0) {}

void RdpAccountant::Add(double q, double z) {
  for (size_t k = 0; k < orders_.size(); ++k) rdp_[k] += SampledGaussianRdp(q, z, orders_[k]);
}

double RdpAccountant::Epsilon(double delta, double then_q, double then_z) const {
  if (then_q <= 0) return EpsilonFromRdp(orders_, rdp_, delta);
  std::vector<double> r = rdp_;
  for (size_t k = 0; k < orders_.size(); ++k)
    r[k] += SampledGaussianRdp(then_q, then_z, orders_[k]);
  return EpsilonFromRdp(orders_, r, delta);
}

absl::Status RdpAccountant::Restore(absl::Span<const double> rdp) {
  if (rdp.empty()) return absl::OkStatus();  // nothing spent yet
  if (rdp.size() != orders_.size()) {
    return absl::DataLossError(absl::StrCat("the privacy accountant's state has ", rdp.size(),
                                            " orders; this server tracks ", orders_.size()));
  }
  for (double r : rdp) {
    if (!(r >= 0)) return absl::DataLossError("the privacy accountant's state is not >= 0");
  }
  rdp_.assign(rdp.begin(), rdp.end());
  return absl::OkStatus();
}

absl::Status CheckDpOptions(const DpOptions& o) {
  if (!(o.clip >= 0) || !(o.noise >= 0) || !(o.delta > 0 && o.delta < 1) ||
      !(o.epsilon_budget >= 0)) {
    return absl::InvalidArgumentError(
        "DP-FedAvg needs --dp_clip >= 0, --dp_noise >= 0, 0 < --dp_delta < 1 and "
        "--dp_epsilon_budget >= 0");
  }
  if (!(o.clip_quantile >= 0 && o.clip_quantile < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--dp_clip_quantile = ", o.clip_quantile, " is not in [0, 1)"));
  }
  if (o.clip_quantile == 0) return absl::OkStatus();
  if (!(o.clip_lr > 0) || !std::isfinite(o.clip_lr) || !(o.clip_count_noise >= 0)) {
    return absl::InvalidArgumentError(
        "adaptive clipping needs --dp_clip_lr > 0 and --dp_clip_count_noise >= 0");
  }
  if (o.noise > 0 && !(2 * o.clip_count_noise > o.noise)) {
    // The count's release alone would spend all of z's privacy (Andrew et al. 2021, Theorem 1).
    return absl::InvalidArgumentError(absl::StrCat(
        "adaptive clipping with --dp_noise=", o.noise, " needs a count noise over z / 2 = ",
        o.noise / 2, ", not ", o.clip_count_noise, " (--dp_clip_count_noise; default K / 20)"));
  }
  return absl::OkStatus();
}

double UpdateNoiseMultiplier(const DpOptions& o) {
  if (o.clip_quantile <= 0 || o.noise <= 0) return o.noise;
  const double rest = 1 / (o.noise * o.noise) - 1 / (4 * o.clip_count_noise * o.clip_count_noise);
  return rest > 0 ? 1 / std::sqrt(rest) : kInf;  // kInf only past CheckDpOptions
}

bool DpFedAvg::WithinClip(double norm) const { return norm <= clip_ * (1 + 1e-3) + 1e-7; }

void DpFedAvg::CountWithin(bool within, int times) {
  if (!adaptive()) return;  // a fixed clip counts nothing
  round_within_ += times * (within ? 0.5 : -0.5);
}

absl::Status DpFedAvg::AdaptClip(size_t sampled, double* fraction) {
  if (sampled == 0) return absl::FailedPreconditionError("a DP round with no client sampled");
  double noise = 0;
  if (options_.noise > 0 && options_.clip_count_noise > 0) {
    SecureNormals normals;
    double unused = 0;
    if (absl::Status s = normals.Next(&noise, &unused); !s.ok()) return s;
    noise *= options_.clip_count_noise;
  }
  const double b = 0.5 + (round_within_ + noise) / static_cast<double>(sampled);
  if (fraction != nullptr) *fraction = b;
  clip_ *= std::exp(-options_.clip_lr * (b - options_.clip_quantile));
  round_within_ = 0;
  return absl::OkStatus();
}

absl::Status DpFedAvg::Release(absl::Span<float> mean, size_t count, size_t sampled) const {
  if (sampled == 0) return absl::FailedPreconditionError("a DP round with no client sampled");
  const double keep = static_cast<double>(count) / static_cast<double>(sampled);
  const double sd = update_noise_ * clip_ / static_cast<double>(sampled);
  for (float& v : mean) v = static_cast<float>(v * keep);
  SecureNormals normals;
  return normals.AddTo(sd, mean);
}

bool DpFedAvg::WouldExceedBudget(double q, double* epsilon_then) const {
  const double eps = accountant_.Epsilon(options_.delta, q, options_.noise);  // z: both releases
  if (epsilon_then != nullptr) *epsilon_then = eps;
  return options_.epsilon_budget > 0 && eps > options_.epsilon_budget;
}

void DpFedAvg::Save(internal::DpState* state) const {
  state->clear_rdp();
  for (double r : accountant_.rdp()) state->add_rdp(r);
  state->set_clip(clip_);
  state->set_round_within(round_within_);
}

absl::Status DpFedAvg::Restore(const internal::DpState& state) {
  TERN_RETURN_IF_ERROR(accountant_.Restore(state.rdp()));
  if (state.clip() != 0) {  // 0: a checkpoint from before adaptive clipping, or of none
    if (!(state.clip() > 0) || !std::isfinite(state.clip()) ||
        !std::isfinite(state.round_within())) {
      return absl::DataLossError("the checkpoint's DP clip is not a positive finite number");
    }
    clip_ = state.clip();
    round_within_ = state.round_within();
  }
  return absl::OkStatus();
}

}  // namespace tern
