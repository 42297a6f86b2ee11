/* tern's C API: an aggregator client's copy of the global model and its update codecs
 * (core/federated/client_model.h) for clients written in other languages. The Python package
 * loads it with ctypes (tern.federated), so a Python client catches up from the server's deltas
 * and encodes its updates with the run's codec, error feedback and memory exactly as `tern
 * client` does. Messages cross as serialized tern.v1 protobufs (proto/tern/v1), values as fp32
 * arrays; the calls to the server stay with the caller.
 *
 * Errors: a function returning int returns 0 on success, else an absl::StatusCode (3 invalid
 * argument, 15 data loss, ...), and writes the message, NUL-terminated and cut to fit, into
 * `error` (`error_size` bytes; may be NULL when 0).
 *
 * Thread-safety: a TernClientModel belongs to one thread at a time; separate ones are
 * independent. docs/python.md says how the Python package finds this library. */
#ifndef TERN_CLIENTS_C_TERN_C_H_
#define TERN_CLIENTS_C_TERN_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this interface; bumped when a signature changes. */
#define TERN_C_API_VERSION 1
int tern_c_api_version(void);

typedef struct TernClientModel TernClientModel;

/* A model copy starting from the participant's initial model: `bundle` is a serialized
 * tern.v1.TensorBundle whose tensors (names, shapes, values in any codec) are the model, in the
 * order the run keeps them. */
int tern_client_model_new(const void* bundle, size_t bundle_size, TernClientModel** out,
                          char* error, size_t error_size);
void tern_client_model_free(TernClientModel* model);

/* What a FetchRequest says the client has (have_round, have_crc32, have_optimizer_state). */
int64_t tern_client_model_have_round(const TernClientModel* model);
uint32_t tern_client_model_have_crc32(const TernClientModel* model);
int tern_client_model_have_optimizer_state(const TernClientModel* model);

/* The model's values (tern_client_model_size floats, in bundle order), valid until the next
 * call on `model`. */
size_t tern_client_model_size(const TernClientModel* model);
const float* tern_client_model_values(const TernClientModel* model);

/* Brings the copy to the round of `task` (a serialized tern.v1.Task of kind TRAIN) from its
 * payload (the serialized TensorBundle the Fetch stream's chunks assemble to). *usable = 1, or 0
 * when the copy cannot be trusted (the round is skipped and the model asked for next time;
 * tern_client_model_why_not says why). */
int tern_client_model_update(TernClientModel* model, const void* task, size_t task_size,
                             const void* payload, size_t payload_size, int* usable, char* error,
                             size_t error_size);
const char* tern_client_model_why_not(const TernClientModel* model);

/* `update` (n == tern_client_model_size floats: the change local training made, or a
 * gradient) encoded as `task` says, with the memory kept from earlier rounds: *out (free with
 * tern_free) is a serialized tern.v1.TensorBundle of *out_size bytes, without run_id, round or
 * sender. `num_examples`: the client's examples (DGC's warm-up epoch). */
int tern_client_model_encode(TernClientModel* model, const void* task, size_t task_size,
                             int64_t client_id, uint64_t num_examples, const float* update,
                             size_t n, void** out, size_t* out_size, char* error,
                             size_t error_size);

/* Marks tensors (one flag per tensor of the initial bundle, nonzero: exact) that every update
 * sends as fp32 outside error feedback and DGC memory whatever the task's codec: state training
 * sets rather than descends, such as BatchNorm's running statistics. n == 0 clears the marks. */
int tern_client_model_set_exact(TernClientModel* model, const uint8_t* flags, size_t n, char* error,
                                size_t error_size);

/* Secure aggregation (tern server --secagg, docs/server.md): one client's side of one round,
 * core/federated/secagg.h's SecAggClient. `task` is the round's serialized tern.v1.Task (TRAIN,
 * with secagg set). Each stage's message crosses as a serialized tern.v1 message; *out is freed
 * with tern_free. The calls to the server (Aggregator.SecAgg, Push) stay with the caller. */
typedef struct TernSecAgg TernSecAgg;
int tern_secagg_new(const void* task, size_t task_size, int64_t client_id, TernSecAgg** out,
                    char* error, size_t error_size);
void tern_secagg_free(TernSecAgg* secagg);
/* Stage 1: the round's public keys (SecAggKeys). */
int tern_secagg_keys(TernSecAgg* secagg, void** out, size_t* out_size, char* error,
                     size_t error_size);
/* Stage 2: from the server's answer (SecAggKeysReply), the shares for the neighbours
 * (SecAggShares). */
int tern_secagg_share(TernSecAgg* secagg, const void* neighbours, size_t neighbours_size,
                      void** out, size_t* out_size, char* error, size_t error_size);
/* Stage 3: `update` (n floats, the model's change) clipped to the task's dp_clip when it has one,
 * then masked with the shares of the server's answer (SecAggSharesReply): *out is the masked
 * vector, the payload of the update's one tensor ("secagg", codec "secagg", numel n). */
int tern_secagg_mask(TernSecAgg* secagg, const void* shares, size_t shares_size,
                     const float* update, size_t n, void** out, size_t* out_size, char* error,
                     size_t error_size);
/* Stage 4: the shares the server asks for (SecAggUnmaskRequest -> SecAggReveal). */
int tern_secagg_reveal(TernSecAgg* secagg, const void* unmask, size_t unmask_size, void** out,
                       size_t* out_size, char* error, size_t error_size);

void tern_free(void* p);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TERN_CLIENTS_C_TERN_C_H_ */
