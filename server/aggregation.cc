#include "server/aggregation.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/spec.h"
#include "common/status_macros.h"

namespace tern {
namespace {

absl::Status CheckUpdates(const std::vector<ClientUpdate>& updates, size_t size, size_t min) {
  if (updates.size() < std::max<size_t>(min, 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("need at least ", std::max<size_t>(min, 1), " updates, got ", updates.size()));
  }
  for (size_t i = 0; i < updates.size(); ++i) {
    if (updates[i].values.size() != size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "update ", i, " has ", updates[i].values.size(), " values, expected ", size));
    }
    if (!(updates[i].weight >= 0) || !std::isfinite(updates[i].weight)) {
      return absl::InvalidArgumentError(
          absl::StrCat("update ", i, " has weight ", updates[i].weight));
    }
  }
  return absl::OkStatus();
}

// The rules work on clipped copies when clipping is on; otherwise on the caller's spans.
class Clipped {
 public:
  Clipped(const std::vector<ClientUpdate>& in, double clip) : updates_(in) {
    if (clip <= 0) return;
    copies_.reserve(in.size());
    for (size_t i = 0; i < in.size(); ++i) {
      copies_.emplace_back(in[i].values.begin(), in[i].values.end());
      ClipToNorm(absl::MakeSpan(copies_.back()), clip);
      updates_[i].values = copies_.back();
    }
  }
  const std::vector<ClientUpdate>& updates() const { return updates_; }

 private:
  std::vector<ClientUpdate> updates_;
  std::vector<std::vector<float>> copies_;
};

class RuleBase : public AggregationRule {
 public:
  RuleBase(std::string name, std::string params, double clip)
      : name_(std::move(name)), params_(std::move(params)), clip_(clip) {}
  std::string Spec() const override {
    std::string p = params_;
    if (clip_ > 0) absl::StrAppend(&p, p.empty() ? "" : ",", absl::StrFormat("clip=%g", clip_));
    return p.empty() ? name_ : absl::StrCat(name_, ":", p);
  }
  absl::Status Aggregate(const std::vector<ClientUpdate>& updates,
                         absl::Span<float> out) const final {
    TERN_RETURN_IF_ERROR(CheckUpdates(updates, out.size(), MinUpdates()));
    Clipped c(updates, clip_);
    return Run(c.updates(), out);
  }

 protected:
  virtual size_t MinUpdates() const { return 1; }
  virtual absl::Status Run(const std::vector<ClientUpdate>& u, absl::Span<float> out) const = 0;

 private:
  std::string name_, params_;
  double clip_;
};

class FedAvg final : public RuleBase {
 public:
  using RuleBase::RuleBase;
  absl::Status Run(const std::vector<ClientUpdate>& u, absl::Span<float> out) const override {
    double total = 0;
    for (const auto& x : u) total += x.weight;
    if (!(total > 0)) return absl::InvalidArgumentError("total weight must be positive");
    std::vector<double> acc(out.size(), 0.0);
    for (const auto& x : u) {
      const double w = x.weight / total;
      for (size_t k = 0; k < acc.size(); ++k) acc[k] += w * x.values[k];
    }
    for (size_t k = 0; k < acc.size(); ++k) out[k] = static_cast<float>(acc[k]);
    return absl::OkStatus();
  }
};

// Coordinate-wise: sort each coordinate's n values, drop `trim` of them at each end, average the
// rest. trim = (n - 1) / 2 of each end (rounded so one or two stay) is the median.
class CoordinateWise final : public RuleBase {
 public:
  CoordinateWise(std::string name, std::string params, double clip, double trim, bool median)
      : RuleBase(std::move(name), std::move(params), clip), trim_(trim), median_(median) {}
  absl::Status Run(const std::vector<ClientUpdate>& u, absl::Span<float> out) const override {
    const size_t n = u.size();
    size_t drop = median_ ? (n - 1) / 2 : static_cast<size_t>(std::floor(trim_ * n));
    if (2 * drop >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("trimming ", drop, " of each end leaves nothing of ", n, " updates"));
    }
    std::vector<float> col(n);
    for (size_t k = 0; k < out.size(); ++k) {
      for (size_t i = 0; i < n; ++i) col[i] = u[i].values[k];
      std::sort(col.begin(), col.end());
      double s = 0;
      for (size_t i = drop; i < n - drop; ++i) s += col[i];
      out[k] = static_cast<float>(s / static_cast<double>(n - 2 * drop));
    }
    return absl::OkStatus();
  }

 private:
  double trim_;
  bool median_;
};

// Majority-vote signSGD (Bernstein et al. 2019): each coordinate's vote is the sign of how many
// updates are positive there less how many are negative, so every worker has one vote whatever
// its scale, and a minority that flips its signs cannot turn a coordinate the others agree on.
// A tied count goes to the sign of the updates' sum (the voters' magnitudes break it: a vote sent
// as one bit must go one way); 0 only where every update is 0. Weights are not counted.
class MajorityVote final : public RuleBase {
 public:
  using RuleBase::RuleBase;
  absl::Status Run(const std::vector<ClientUpdate>& u, absl::Span<float> out) const override {
    // Update by update, each read once in order.
    std::vector<int32_t> count(out.size(), 0);
    std::vector<double> sum(out.size(), 0.0);
    for (const auto& x : u) {
      for (size_t k = 0; k < out.size(); ++k) {
        const float v = x.values[k];
        count[k] += (v > 0) - (v < 0);
        sum[k] += v;
      }
    }
    for (size_t k = 0; k < out.size(); ++k) {
      const double tally = count[k] != 0 ? count[k] : sum[k];
      out[k] = tally > 0 ? 1.0f : tally < 0 ? -1.0f : 0.0f;
    }
    return absl::OkStatus();
  }
};

// Krum (Blanchard et al. 2017): score each update by the sum of squared distances to its
// n - f - 2 nearest others; Multi-Krum averages the m best-scored. Needs n > 2f + 2.
class Krum final : public RuleBase {
 public:
  Krum(std::string name, std::string params, double clip, int f, int m)
      : RuleBase(std::move(name), std::move(params), clip), f_(f), m_(m) {}
  size_t MinUpdates() const override { return static_cast<size_t>(2 * f_ + 3); }
  absl::Status Run(const std::vector<ClientUpdate>& u, absl::Span<float> out) const override {
    const size_t n = u.size();
    std::vector<std::vector<double>> d(n, std::vector<double>(n, 0.0));
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = i + 1; j < n; ++j) {
        double s = 0;
        for (size_t k = 0; k < out.size(); ++k) {
          const double e = static_cast<double>(u[i].values[k]) - u[j].values[k];
          s += e * e;
        }
        d[i][j] = d[j][i] = s;
      }
    }
    const size_t closest = n - static_cast<size_t>(f_) - 2;
    std::vector<std::pair<double, size_t>> score(n);
    for (size_t i = 0; i < n; ++i) {
      std::vector<double> row;
      for (size_t j = 0; j < n; ++j) {
        if (j != i) row.push_back(d[i][j]);
      }
      std::partial_sort(row.begin(), row.begin() + closest, row.end());
      score[i] = {std::accumulate(row.begin(), row.begin() + closest, 0.0), i};
    }
    std::sort(score.begin(), score.end());
    const size_t m = std::min<size_t>(static_cast<size_t>(m_), n);
    std::vector<double> acc(out.size(), 0.0);
    for (size_t r = 0; r < m; ++r) {
      const auto& v = u[score[r].second].values;
      for (size_t k = 0; k < acc.size(); ++k) acc[k] += v[k];
    }
    for (size_t k = 0; k < acc.size(); ++k) out[k] = static_cast<float>(acc[k] / m);
    return absl::OkStatus();
  }

 private:
  int f_, m_;
};

}  // namespace

double ClipToNorm(absl::Span<float> v, double max_norm) {
  double sq = 0;
  for (float x : v) sq += static_cast<double>(x) * x;
  const double norm = std::sqrt(sq);
  if (!(norm > max_norm) || max_norm <= 0) return 1.0;
  const double f = max_norm / norm;
  for (float& x : v) x = static_cast<float>(x * f);
  return f;
}

namespace {

// Every rule takes an optional norm clip; `make` builds the rule from its own parameters.
using RuleMaker = std::function<absl::StatusOr<std::unique_ptr<AggregationRule>>(
    const std::string& name, SpecParams& p, double clip)>;

AggregationRuleRegistry::Factory WithClip(std::string name, RuleMaker make) {
  return [name = std::move(name), make = std::move(make)](
             SpecParams& p) -> absl::StatusOr<std::unique_ptr<AggregationRule>> {
    TERN_ASSIGN_OR_RETURN(double clip, p.Double("clip", 0.0, 0.0, 1e30));
    return make(name, p, clip);
  };
}

absl::StatusOr<std::unique_ptr<AggregationRule>> MakeKrum(const std::string& name, SpecParams& p,
                                                          double clip) {
  TERN_ASSIGN_OR_RETURN(int64_t f, p.Int("f", 1, 0, 1 << 20));
  int64_t m = 1;
  if (name == "multi-krum") {
    TERN_ASSIGN_OR_RETURN(m, p.Int("m", 2, 1, 1 << 20));
  }
  return std::make_unique<Krum>(
      name, name == "krum" ? absl::StrCat("f=", f) : absl::StrCat("f=", f, ",m=", m), clip,
      static_cast<int>(f), static_cast<int>(m));
}

}  // namespace

std::unique_ptr<AggregationRuleRegistry> NewBuiltinAggregationRuleRegistry() {
  auto r = std::make_unique<AggregationRuleRegistry>("aggregation rule");
  const std::pair<const char*, RuleMaker> all[] = {
      {"fedavg",
       [](const std::string& name, SpecParams&,
          double clip) -> absl::StatusOr<std::unique_ptr<AggregationRule>> {
         return std::make_unique<FedAvg>(name, "", clip);
       }},
      {"median",
       [](const std::string& name, SpecParams&,
          double clip) -> absl::StatusOr<std::unique_ptr<AggregationRule>> {
         return std::make_unique<CoordinateWise>(name, "", clip, 0.0, true);
       }},
      {"trimmed-mean",
       [](const std::string& name, SpecParams& p,
          double clip) -> absl::StatusOr<std::unique_ptr<AggregationRule>> {
         TERN_ASSIGN_OR_RETURN(double trim, p.Double("trim", 0.1, 0.0, 0.4999));
         return std::make_unique<CoordinateWise>(name, absl::StrFormat("trim=%g", trim), clip, trim,
                                                 false);
       }},
      {"krum", MakeKrum},
      {"multi-krum", MakeKrum},
      {"majority-vote",
       [](const std::string& name, SpecParams&,
          double clip) -> absl::StatusOr<std::unique_ptr<AggregationRule>> {
         return std::make_unique<MajorityVote>(name, "", clip);
       }},
  };
  // Distinct names by construction: Register cannot fail here.
  for (const auto& [name, make] : all) (void)r->Register(name, WithClip(name, make));
  return r;
}

}  // namespace tern
