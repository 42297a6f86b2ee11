/* libtern_embedded.so: a tern worker inside a trainer's own process (docs/trainer-shm.md,
 * "Embedded worker"). The trainer calls each step on its own thread: no second process, no
 * doorbell, no copy of the gradient or the parameters (the worker writes them into the caller's
 * memory). The worker serves its peers' gossip from gRPC threads of its own meanwhile.
 *
 * One worker per process at a time: it takes `tern worker`'s flags, which are process-wide.
 * Errors: a function returning int returns 0 on success, else an absl::StatusCode (3 invalid
 * argument, 9 failed precondition, 14 unavailable, ...) and writes the message, NUL-terminated
 * and cut to fit, into `error` (error_size bytes; may be NULL).
 *
 * Do not load it into a process that has loaded libtern_c.so: each carries the tern.v1 protocol
 * descriptors, which protobuf lets a process register once.
 *
 * Thread-safety: start and stop from one thread; register and step from one thread at a time.
 */
#ifndef TERN_CLIENTS_EMBEDDED_TERN_EMBEDDED_H_
#define TERN_CLIENTS_EMBEDDED_TERN_EMBEDDED_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this interface; bumped when a signature changes. */
#define TERN_WORKER_API_VERSION 2
int tern_worker_api_version(void);

typedef struct TernWorker TernWorker;

/* Starts a worker: `flags` are `tern worker`'s ("--name=value", or "--name" for a true bool),
 * without the ones about its own trainer (--trainer, --final_model, --snapshot_dir,
 * --exit_after_training) or a scheduler. It serves on --listen and, with --workers > 1, knows
 * its peers (--peers or --peers_file, waited for) before it returns. */
int tern_worker_start(const char* const* flags, int num_flags, TernWorker** out, char* error,
                      size_t error_size);
/* The port it serves its peers on. */
int tern_worker_port(const TernWorker* worker);
/* Declares the model: a serialized tern.v1.TensorBundle of "none.v1" fp32 tensors (names,
 * shapes, initial values, in the order of `params`). The worker then keeps the parameters in
 * `params` (num_params floats the caller owns until stop): written there now (a resumed
 * worker's may differ from the bundle's) and after every step. `step` gets the step to run
 * next. */
int tern_worker_register(TernWorker* worker, const void* bundle, size_t bundle_size, float* params,
                         size_t num_params, uint64_t* step, char* error, size_t error_size);
/* One step: `info` a serialized tern.v1.StepInfo, `grad` num_params floats (read during the
 * call only). On success the new parameters are in `params` and a serialized tern.v1.StepResult
 * of *result_size bytes in `result` (result_capacity bytes; 8 KiB is plenty). 14 (unavailable):
 * not ready yet (peers unknown), nothing done: call again. */
int tern_worker_step(TernWorker* worker, const void* info, size_t info_size, const float* grad,
                     size_t num_params, void* result, size_t result_capacity, size_t* result_size,
                     char* error, size_t error_size);
/* How many buckets the worker cuts the model into (--bucket_mb; 1 without), after register. */
int tern_worker_buckets(const TernWorker* worker);
/* A step in parts, for a backward pass that hands its gradient over as it goes: with buckets,
 * each is gossiped as soon as it is final. tern_worker_begin_step before the backward pass, with
 * the step, its learning rate (0: the worker's schedule; the StepInfo's lr is then not read) and
 * the gradient's buffer (num_params floats, read until the step ends; the same
 * buffer tern_worker_step then gets); tern_worker_grad_ready each time grad[from, num_params)
 * is final and the backward pass no longer reads the parameters there (the worker updates
 * them); tern_worker_step finishes the step. 14 (unavailable) from begin: not ready, nothing
 * begun (tern_worker_step alone still works). An error from grad_ready ends the step. */
int tern_worker_begin_step(TernWorker* worker, uint64_t step, float lr, const float* grad,
                           size_t num_params, char* error, size_t error_size);
int tern_worker_grad_ready(TernWorker* worker, uint64_t from, char* error, size_t error_size);
/* Stops serving (a step in flight returns), gives the parameters back to the worker's own
 * memory, and frees it. */
void tern_worker_stop(TernWorker* worker);

#ifdef __cplusplus
}
#endif

#endif /* TERN_CLIENTS_EMBEDDED_TERN_EMBEDDED_H_ */
