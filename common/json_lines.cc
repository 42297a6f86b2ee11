#include "common/json_lines.h"

#include "google/protobuf/util/json_util.h"

namespace tern {

std::string ToJsonLine(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  std::string out;
  // Printing a message that is already built cannot fail (no Any with unknown types here).
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  out += '\n';
  return out;
}

absl::Status FromJson(absl::string_view json, google::protobuf::Message* m) {
  m->Clear();
  google::protobuf::util::JsonParseOptions o;
  o.ignore_unknown_fields = true;
  const auto s = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), m, o);
  if (!s.ok()) return absl::InvalidArgumentError(std::string(s.message()));
  return absl::OkStatus();
}

}  // namespace tern
