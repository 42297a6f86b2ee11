#include "common/bundle_stream.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tern {
namespace {

// Field numbers of proto/tern/v1/tensor.proto that lead to a payload.
constexpr int kBundleTensors = 4;  // TensorBundle.tensors
constexpr int kNamedTensor = 2;    // NamedTensor.tensor
constexpr int kPayload = 7;        // EncodedTensor.payload

constexpr size_t kMaxVarintBytes = 10;   // a field's value
constexpr size_t kMaxVarint32Bytes = 5;  // a tag or a length

}  // namespace

BundleStreamParser::BundleStreamParser(uint64_t total_size, PayloadObserver* observer,
                                       uint64_t in_place_min_bytes)
    : total_(total_size), observer_(observer), in_place_min_(in_place_min_bytes) {
  frames_.push_back({Level::kBundle, total_size});
}

absl::Status BundleStreamParser::Fail(absl::Status s) {
  failed_ = true;
  tensors_.clear();
  bundle_rest_.clear();
  return s;
}

std::string& BundleStreamParser::Rest() {
  switch (frames_.back().level) {
    case Level::kNamed:
      return tensors_.back().named_rest;
    case Level::kEncoded:
      return tensors_.back().encoded_rest;
    case Level::kBundle:
      break;
  }
  return bundle_rest_;
}

void BundleStreamParser::CloseFrames() {
  while (frames_.size() > 1 && offset_ == frames_.back().end) frames_.pop_back();
}

absl::Status BundleStreamParser::Feed(absl::string_view piece,
                                      const std::shared_ptr<const void>& owner) {
  owner_ = owner != nullptr ? &owner : nullptr;
  absl::Cleanup forget = [this] { owner_ = nullptr; };
  if (failed_) return absl::FailedPreconditionError("the bundle's bytes already failed to parse");
  if (piece.size() > total_ - offset_) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("more bytes than the ", total_, " the bundle announced")));
  }
  while (!piece.empty()) {
    if (absl::Status s = Step(&piece); !s.ok()) return Fail(std::move(s));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> BundleStreamParser::VarintByte(absl::string_view* piece, uint64_t* value) {
  if (FrameLeft() == 0) return absl::InvalidArgumentError("a field runs past its message");
  const char c = piece->front();
  piece->remove_prefix(1);
  ++offset_;
  scratch_.push_back(c);
  if ((static_cast<uint8_t>(c) & 0x80) != 0) {
    if (scratch_.size() - varint_start_ >= kMaxVarint32Bytes) {
      return absl::InvalidArgumentError("a tag or length longer than 5 bytes");
    }
    return false;
  }
  uint64_t v = 0;
  for (size_t i = scratch_.size(); i-- > varint_start_;) {
    v = (v << 7) | (static_cast<uint8_t>(scratch_[i]) & 0x7f);
  }
  *value = v;  // a length past 31 bits is refused by OnLength; a tag is cut to 32, as protobuf does
  return true;
}

absl::Status BundleStreamParser::Step(absl::string_view* piece) {
  switch (state_) {
    case State::kTag:
    case State::kLength: {
      uint64_t v;
      absl::StatusOr<bool> done = VarintByte(piece, &v);
      if (!done.ok()) return done.status();
      if (!*done) return absl::OkStatus();
      return state_ == State::kTag ? OnTag(v) : OnLength(v);
    }
    case State::kVarint: {
      if (FrameLeft() == 0) return absl::InvalidArgumentError("a varint runs past its message");
      const char c = piece->front();
      piece->remove_prefix(1);
      ++offset_;
      Rest().push_back(c);
      if ((static_cast<uint8_t>(c) & 0x80) == 0) {
        state_ = State::kTag;
        CloseFrames();
      } else if (++left_ >= kMaxVarintBytes) {
        return absl::InvalidArgumentError("a varint longer than 10 bytes");
      }
      return absl::OkStatus();
    }
    case State::kFixed:
    case State::kCopy:
    case State::kPayload: {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(left_, piece->size()));
      if (state_ == State::kPayload) {
        TakePayload(piece->substr(0, n));
      } else {
        Rest().append(piece->data(), n);
      }
      piece->remove_prefix(n);
      offset_ += n;
      left_ -= n;
      if (left_ == 0) {
        state_ = State::kTag;
        CloseFrames();
      }
      return absl::OkStatus();
    }
  }
  return absl::InternalError("bad parser state");
}

void BundleStreamParser::TakePayload(absl::string_view bytes) {
  Tensor& t = tensors_.back();
  if (t.keep && owner_ == nullptr) {  // fed without an owner from here on: copy after all
    t.payload = t.in_place.Flatten();
    t.in_place = PayloadPieces();
    t.keep = false;
  }
  if (t.keep) {
    t.in_place.Append(bytes, *owner_);
  } else {
    t.payload.append(bytes.data(), bytes.size());
  }
  if (observer_ != nullptr) observer_->Bytes(tensors_.size() - 1, bytes);
}

absl::Status BundleStreamParser::OnTag(uint64_t tag) {
  tag &= UINT32_MAX;
  const uint64_t field = tag >> 3;
  if (field == 0) {
    return absl::InvalidArgumentError(absl::StrCat("bad field number ", field));
  }
  field_ = static_cast<int>(field);
  switch (tag & 7) {
    case 0:  // varint: its bytes follow the tag's in the message's rest
      Rest().append(scratch_);
      scratch_.clear();
      state_ = State::kVarint;
      left_ = 0;
      return absl::OkStatus();
    case 1:
    case 5:
      left_ = (tag & 7) == 1 ? 8 : 4;
      if (left_ > FrameLeft()) {
        return absl::InvalidArgumentError("a fixed-size field runs past its message");
      }
      Rest().append(scratch_);
      scratch_.clear();
      state_ = State::kFixed;
      return absl::OkStatus();
    case 2:  // the length follows; where the value goes depends on the field
      varint_start_ = scratch_.size();
      state_ = State::kLength;
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("wire type ", tag & 7, " of field ", field, " (groups are not accepted)"));
  }
}

absl::Status BundleStreamParser::OnLength(uint64_t length) {
  if (length > INT32_MAX || length > FrameLeft()) {
    return absl::InvalidArgumentError(
        absl::StrCat("field ", field_, " of ", length, " bytes runs past its message"));
  }
  const Level level = frames_.back().level;
  std::string tag_and_length = std::move(scratch_);
  scratch_.clear();
  varint_start_ = 0;
  state_ = State::kTag;
  if (level == Level::kBundle && field_ == kBundleTensors) {
    tensors_.emplace_back();
    frames_.push_back({Level::kNamed, offset_ + length});
  } else if (level == Level::kNamed && field_ == kNamedTensor) {
    if (tensors_.back().has_encoded) {
      return absl::InvalidArgumentError("a NamedTensor with two tensors");
    }
    tensors_.back().has_encoded = true;
    frames_.push_back({Level::kEncoded, offset_ + length});
  } else if (level == Level::kEncoded && field_ == kPayload) {
    Tensor& t = tensors_.back();
    if (t.has_payload) return absl::InvalidArgumentError("a tensor with two payloads");
    t.has_payload = true;
    if (observer_ != nullptr) observer_->Begin(tensors_.size() - 1, t.encoded_rest, length);
    t.keep = owner_ != nullptr && length >= in_place_min_ && observer_ != nullptr &&
             observer_->InPlace(tensors_.size() - 1);
    if (!t.keep) t.payload.reserve(length);  // bounded by the bundle's size; filled as bytes come
    left_ = length;
    if (length > 0) state_ = State::kPayload;
  } else {
    Rest().append(tag_and_length);
    left_ = length;
    if (length > 0) state_ = State::kCopy;
  }
  if (state_ == State::kTag) CloseFrames();
  return absl::OkStatus();
}

absl::StatusOr<v1::TensorBundle> BundleStreamParser::Finish() {
  TERN_ASSIGN_OR_RETURN(ReceivedBundle got, FinishInPlace());
  for (size_t i = 0; i < got.in_place.size(); ++i) {
    if (got.in_place[i].empty()) continue;
    *got.bundle.mutable_tensors(static_cast<int>(i))->mutable_tensor()->mutable_payload() =
        got.in_place[i].Flatten();
  }
  return std::move(got.bundle);
}

absl::StatusOr<ReceivedBundle> BundleStreamParser::FinishInPlace() {
  if (failed_) return absl::FailedPreconditionError("the bundle's bytes already failed to parse");
  if (offset_ != total_ || state_ != State::kTag || !scratch_.empty() || frames_.size() != 1) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("the bundle's bytes end inside a field (", offset_, " of ", total_, ")")));
  }
  ReceivedBundle got;
  v1::TensorBundle& bundle = got.bundle;
  got.in_place.resize(tensors_.size());
  if (!bundle.ParseFromString(bundle_rest_)) {
    return Fail(absl::InvalidArgumentError("reassembled bytes are not a TensorBundle"));
  }
  for (size_t i = 0; i < tensors_.size(); ++i) {
    Tensor& t = tensors_[i];
    v1::NamedTensor* nt = bundle.add_tensors();
    if (!nt->ParseFromString(t.named_rest)) {
      return Fail(absl::InvalidArgumentError("reassembled bytes are not a TensorBundle"));
    }
    if (!t.has_encoded) continue;
    v1::EncodedTensor* et = nt->mutable_tensor();
    if (!et->ParseFromString(t.encoded_rest)) {
      return Fail(absl::InvalidArgumentError("reassembled bytes are not a TensorBundle"));
    }
    if (t.has_payload) et->mutable_payload()->swap(t.payload);
    got.in_place[i] = std::move(t.in_place);
  }
  failed_ = true;  // finished: its tensors moved out
  tensors_.clear();
  return got;
}

}  // namespace tern
