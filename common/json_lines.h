// One protobuf message per line of JSON (protobuf's JSON mapping, proto field names), for the
// record files of proto/tern/v1/records.proto. No hand-written JSON anywhere else.
//
// Thread-safety: plain functions.
#ifndef TERN_COMMON_JSON_LINES_H_
#define TERN_COMMON_JSON_LINES_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace tern {

// `m` as one line of JSON, with its trailing newline.
std::string ToJsonLine(const google::protobuf::Message& m);
// Parses one JSON object into `m` (cleared first). Unknown fields are ignored, so a newer
// writer's files still load; anything that is not such an object is InvalidArgument.
absl::Status FromJson(absl::string_view json, google::protobuf::Message* m);

}  // namespace tern

#endif  // TERN_COMMON_JSON_LINES_H_
