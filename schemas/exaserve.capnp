@0xaa516dd64b13986f;
# ExaServe public RPC API.
#
# A client connects over TCP (two-party RPC, default port 7000), takes the
# bootstrap `Service`, and asks it for a `Gateway` (generation) or an `Admin`
# (cluster management). The structs mirror runtime/api/gateway.hpp; front doors
# convert them at the edge.
#
# Errors: a request the cluster refuses or fails (unknown model, overloaded,
# bad sampling values, a replica failing mid-stream) is reported as a value in
# `GenerateResult.error`, with the same codes as the HTTP API. RPC exceptions
# are reserved for protocol misuse (a duplicate client request id, too many
# calls in flight) and for Admin calls, whose exception type says what to do:
# OVERLOADED (retry later), UNIMPLEMENTED (not supported), FAILED (the
# description starts with the error code, e.g. "not_found: ...").
#
# Compatibility: never renumber or reuse a field or method ordinal; add new
# ones at the end.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("exa::rpc");

struct Sampling {
  # How the next token is chosen.

  temperature @0 :Float32 = 0.0;
  # Softmax temperature; 0 means greedy (always the most likely token).

  topP @1 :Float32 = 1.0;
  # Nucleus sampling: keep the smallest set of tokens whose probability mass
  # reaches topP. 1 disables it.

  topK @2 :UInt32 = 0;
  # Keep only the K most likely tokens; 0 disables it.

  seed @3 :UInt64 = 0;
  # Seed of the request's random stream: equal seeds give equal samples.
}

struct GenerateRequest {
  # One completion request.

  model @0 :Text;
  # Deployment name, as listed by Admin.models() or GET /v1/models.

  prompt :union {
    # What to continue. Exactly one form.

    text @1 :Text;
    # UTF-8 text, tokenized by the model's tokenizer (BOS added).

    tokenIds @2 :List(Int32);
    # Token ids used as given (no BOS added); must not be empty.
  }

  maxTokens @3 :UInt32 = 16;
  # Most tokens to generate; at least 1, at most the server's limit.

  sampling @4 :Sampling;
  # Sampling parameters; unset means greedy.

  stop @5 :List(Text);
  # Stop sequences (at most 4, each non-empty): generation ends before the
  # first occurrence of any of them, which is not returned.

  ignoreEos @6 :Bool = false;
  # Keep generating past the end-of-sequence token (benchmarks).

  deadlineMs @7 :UInt32 = 0;
  # Deadline for the whole request in milliseconds; 0 uses the server default.

  clientRequestId @8 :Text;
  # Optional tag chosen by the client, unique among its own in-flight calls on
  # this Gateway, so that Gateway.cancel() can name the request. Empty: the
  # request can only be cancelled by cancelling the call itself.

  priority @9 :Priority = interactive;
  # While every replica of the deployment is busy, interactive requests are
  # served before batch ones (and tenants in fair order within each).

  user @10 :Text;
  # The conversation (as OpenAI's `user`): during a rollout, requests of one
  # conversation stay on one version. Empty: each request is drawn alone.
}

enum Priority {
  interactive @0;
  batch @1;
}

struct TokenChunk {
  # Tokens produced since the previous chunk.

  tokens @0 :List(Int32);
  # Token ids, in generation order.

  text @1 :Text;
  # Their text. Always valid UTF-8: bytes of an incomplete character are held
  # back until the next chunk.

  firstIndex @2 :UInt32;
  # Index of tokens[0] among the request's generated tokens (0 for the first).
}

enum FinishReason {
  # Why generation ended.

  stop @0;
  # End-of-sequence token or a stop sequence.

  length @1;
  # maxTokens reached (or the model's context is full).

  cancelled @2;
  # The request was cancelled.

  error @3;
  # It failed or was refused; GenerateResult.error says why.
}

struct Usage {
  # Token counts of one request.

  promptTokens @0 :UInt32;
  # Tokens in the prompt after tokenization.

  completionTokens @1 :UInt32;
  # Tokens generated.

  cachedTokens @2 :UInt32;
  # Prompt tokens whose KV the replica read from its prefix cache instead of
  # computing (at most promptTokens; 0 from servers that predate it). A
  # request resumed on another replica reports the one that finished it.
}

struct Timings {
  # Latencies of one request, measured by the server.

  ttftMs @0 :Float64;
  # Request accepted to first token, in milliseconds.

  tpotMs @1 :Float64;
  # Mean time per output token after the first, in milliseconds.

  e2eMs @2 :Float64;
  # Request accepted to finished, in milliseconds.
}

struct Error {
  # An error value: a code to act on and a message naming the problem.

  code @0 :Text;
  # Stable lower-case code: invalid_argument, not_found, overloaded,
  # unavailable, unsupported, cancelled, deadline_exceeded, internal, ...

  message @1 :Text;
  # Human-readable explanation.
}

struct GenerateResult {
  # How a request ended, sent once after all its chunks.

  finishReason @0 :FinishReason;
  # Why it ended.

  usage @1 :Usage;
  # Token counts.

  timings @2 :Timings;
  # Latencies.

  error @3 :Error;
  # Set (hasError() true) when finishReason is error or the request was
  # refused; unset otherwise.

  replica @4 :Text;
  # Replica that finished the request (diagnostics).

  requestId @5 :Text;
  # Server-assigned request id ("req-..."), as it appears in server logs.
}

interface TokenSink {
  # Implemented by the client: receives a request's tokens as they are made.

  chunk @0 (chunk :TokenChunk) -> stream;
  # One chunk. A streaming method: the server sends the next chunk only when
  # flow control allows, so a slow client slows its own request (and one that
  # falls too far behind has it cancelled with an "overloaded" error).
}

interface Gateway {
  # Text generation.

  generate @0 (request :GenerateRequest, sink :TokenSink) -> (result :GenerateResult);
  # Generates, streaming chunks to `sink` in order, and returns when done.
  # Cancelling the call (dropping its promise) cancels the request.

  cancel @1 (requestId :Text) -> ();
  # Cancels this Gateway's in-flight request tagged clientRequestId ==
  # requestId; its generate() then returns with finishReason cancelled.
  # Unknown ids are ignored.
}

struct ModelInfo {
  # One deployment.

  name @0 :Text;
  # Deployment name (what GenerateRequest.model names).

  modelFile @1 :Text;
  # The GGUF file it serves.

  replicasReady @2 :UInt32;
  # Replicas able to take requests now.

  replicasDesired @3 :UInt32;
  # Replicas asked for.

  contextLength @4 :UInt32;
  # Longest sequence (prompt + generated tokens) in tokens.

  tenant @5 :Text;
  # The tenant that owns it; empty means shared by every tenant.

  version @6 :Text;
  # Its model version: "1" for a plain deployment, what follows '@' for one
  # a rollout brought ("tiny@2" is version "2" of "tiny").

  ttftP50Ms @7 :Float64 = -1;
  ttftP99Ms @8 :Float64 = -1;
  tpotP50Ms @9 :Float64 = -1;
  tpotP99Ms @10 :Float64 = -1;
  # Time to first token and per output token of its requests over the last
  # minute, in ms, as the gateways saw them (the worst gateway's); -1: no
  # request finished in that time.

  architecture @11 :Text;
  # The file's general.architecture ("llama", "qwen2"); "simulated" for a
  # preset; empty when unknown.

  quantization @12 :Text;
  # llama.cpp's name for the file's general.file_type ("Q4_K_M"), or else the
  # ggml type holding most of its weight bytes ("q8_0"); empty when unknown.

  tokenizer @13 :Text;
  # The file's tokenizer.ggml.model ("llama": SentencePiece, "gpt2": byte-level
  # BPE); empty when unknown.

  draftModel @14 :Text;
  # Speculative decoding: the deployment's draft model (a GGUF path on the
  # server); empty when it has none.

  draftTokens @15 :UInt32 = 0;
  # Tokens the draft proposes per step (its default filled in); 0 without a draft.

  routing @16 :Text;
  # Its routing policy ("least_outstanding", "prefix_aware", ...: the
  # cluster's default filled in); empty from a server that does not say.

  prefixSlackTokens @17 :UInt64;
  prefixSlackRatio @18 :Float64;
  prefixSlackS @19 :Float64;
  # prefix_aware's load slack as deployed (DeployRequest's fields of the same
  # names; a rollout's new version inherits them). Kept whatever the policy;
  # only prefix_aware reads them.
}

struct NodeStatus {
  # One host of the cluster.

  id @0 :UInt32;
  # Node id.

  rack @1 :UInt32;
  # Rack (failure domain) of the node.

  state @2 :Text;
  # "healthy", "suspect" or "down".

  address @3 :Text;
  # HOST:PORT the node's process serves its cluster traffic on; empty in the
  # embedded cluster, where nodes are actors of one process.

  clockOffsetMs @4 :Float64;
  # The node's wall clock minus the controller's, estimated from heartbeat
  # round trips (the tightest of the last few); 0 until measured.

  drained @5 :Text;
  # Empty, or why nothing new is placed on the node: "node" (an operator
  # drained it; it stays drained until undrained, across restarts) or
  # "shutdown" (its process is stopping; a restarted process takes slots).

  region @6 :Text;
  # The region the node joined with (`--region`); empty for none.
}

struct DeviceStatus {
  # One accelerator (or CPU device).

  node @0 :UInt32;
  # Node that owns it.

  device @1 :UInt32;
  # Device index on that node.

  kind @2 :Text;
  # "cpu" or "cuda".

  memoryBytes @3 :UInt64;
  # Device memory managed by ExaServe.

  memoryUsedBytes @4 :UInt64;
  # Of which the memory ledger has handed out.
}

struct ReplicaStatus {
  # One model replica.

  id @0 :Text;
  # Replica id.

  deployment @1 :Text;
  # Deployment it belongs to.

  slot @2 :UInt32;
  # Slot within the deployment.

  epoch @3 :UInt64;
  # Fencing epoch of the slot: only grows.

  state @4 :Text;
  # Lifecycle state: creating, loading, warming, ready, serving, draining,
  # stopped, degraded or failed.

  node @5 :UInt32;
  # Node it runs on.

  device @6 :UInt32;
  # Device it runs on.

  running @7 :UInt32;
  # Requests in its running batch.

  queued @8 :UInt32;
  # Requests waiting for it.

  kvUsedTokens @9 :UInt32;
  # KV cache in use, in tokens.

  kvCapacityTokens @10 :UInt32;
  # KV cache capacity, in tokens.

  devices @11 :List(UInt32);
  # Every device it runs on, ascending: its tensor-parallel group (one device
  # for TP 1); `device` is the first. Empty from older servers.

  prefillTokensPerS @12 :Float64;
  decodeTokensPerS @13 :Float64;
  # Its measured speeds, smoothed over its steps with prefill and its
  # decode-only steps, as it reports them with its load (what the predictive
  # router estimates with, and prefix_aware sizes prefixSlackS by). 0: none yet.
}

struct ClusterStatus {
  # A snapshot of the whole cluster.

  nodes @0 :List(NodeStatus);
  # Every node.

  devices @1 :List(DeviceStatus);
  # Every device.

  replicas @2 :List(ReplicaStatus);
  # Every replica.

  models @3 :List(ModelInfo);
  # Every deployment.

  rollouts @4 :List(RolloutStatus);
  # The latest rollout of each deployment that had one (kept once finished).
}

struct RolloutStatus {
  name @0 :Text;
  # The deployment's plain name.

  status @1 :Text;
  # The line `exaserve-cli rollout status` prints (phase first).
}

struct DeployRequest {
  # Creates (or replaces) a deployment.

  name @0 :Text;
  # Deployment name.

  modelFile @1 :Text;
  # GGUF path on the server; empty means the default model.

  replicas @2 :UInt32 = 1;
  # Replicas wanted.

  kvTokens @3 :UInt32 = 0;
  # KV cache per replica in tokens; 0 means the default.

  routing @4 :Text;
  # Routing policy name; empty means the default.

  modelSha256 @5 :Text;
  # SHA-256 (hex) the model file must have; empty means not pinned. Nodes
  # check it before loading and find the file by it in their model directory.

  tenant @6 :Text;
  # The tenant that owns it: only that tenant's API keys (and admin keys)
  # see and reach it. Empty means shared by every tenant.

  warmPoolPercent @7 :UInt32 = 10;
  # Replicas kept loaded and standing by, taking no traffic, as a percent of
  # `replicas` (floor, at most 50): failures and scale-ups take them first.

  autoscaleMin @8 :UInt32 = 1;
  autoscaleMax @9 :UInt32 = 0;
  # Autoscaling within [min, max]; off while max is 0.

  autoscaleMetric @10 :Text;
  # queue_depth (empty), ttft_p99_ms or kv_utilization.

  autoscaleTarget @11 :Float64 = 0;
  # The metric's target; 0 means its default (4 requests, 1000 ms, 0.8).

  idleToZeroS @12 :UInt32 = 0;
  # With autoscaleMin 0: idle this long, it scales to zero (0: never).

  chatTemplate @13 :Text;
  # The deployment's own chat template, as its Jinja TEXT (exaserve-cli reads
  # a built-in or a file where it runs and sends the text), at most 128 KiB.
  # It wins over the gateway's --chat-template and the model file's
  # template. Empty means none.

  draftModel @14 :Text;
  # Speculative decoding: a draft model's GGUF path on the server, with the
  # model's vocabulary and at least its context. It proposes tokens the model
  # verifies (greedy outputs stay the model's own); nodes load it like the
  # model, and it counts in each replica's memory. Empty means none.

  draftSha256 @15 :Text;
  # SHA-256 (hex) the draft file must have; empty means not pinned.

  draftTokens @16 :UInt32 = 0;
  # Tokens the draft proposes per step (1 to 8); 0 means the default (4).

  tensorParallel @17 :UInt32 = 0;
  # Each replica runs tensor-parallel over this many devices of one node (1,
  # 2, 4 or 8; the model's heads and FFN must split evenly); 0 means 1.

  prefixSlackTokens @18 :UInt64 = 2048;
  # prefix_aware routing's load bound: a replica holding a longer cached
  # prefix is preferred while its queue is at most the least loaded one's
  # plus max(slack, prefixSlackRatio x that queue), slack being
  # prefixSlackTokens lowered by prefixSlackS (below). 0 to 2^32.

  prefixSlackRatio @19 :Float64 = 0.25;
  # The relative part of that bound, 0 to 100. All three are read only by prefix_aware.

  prefixSlackS @20 :Float64 = 0.2;
  # The same bound in time, 0 to 3600 seconds: a replica's prefixSlackTokens
  # is lowered to what it prefills in this long (its measured prefill speed),
  # so slow replicas get a smaller slack. 0 means tokens alone.
}

interface Admin {
  # Cluster management. Failures are RPC exceptions (see the top of this file).

  status @0 () -> (status :ClusterStatus);
  # A snapshot of nodes, devices, replicas and deployments.

  models @1 () -> (models :List(ModelInfo));
  # The deployments that can be named in GenerateRequest.model.

  deploy @2 (request :DeployRequest) -> ();
  # Creates a deployment; returns once the cluster accepted it (replicas then
  # start in the background: watch status()).

  undeploy @3 (name :Text) -> ();
  # Removes a deployment; its replicas drain and stop.

  scale @4 (name :Text, replicas :UInt32) -> ();
  # Changes a deployment's replica count.

  drain @5 (target :DrainTarget, id :UInt64, deadlineMs :UInt32, undrain :Bool)
      -> (replicas :UInt32, deadlineMs :UInt32);
  # Drains a node (every replica on it, and nothing new is placed there until
  # undrained) or one replica: no new requests; in-flight ones finish or,
  # past the deadline (0: the controller's default), resume elsewhere from
  # their tokens; each slot is placed elsewhere. undrain lifts a node's drain
  # (a draining replica cannot return: it is replaced). Returns how many
  # replicas began draining and the deadline they have.

  rollout @6 (request :RolloutRequest) -> (status :Text);
  # Starts a rollout of a new model version, or asks about or steers the one
  # in progress. status: one line starting with the phase (in_progress,
  # paused, complete, rolled_back, aborted), the step, the traffic split and
  # the last verdict with its numbers.
}

struct RolloutRequest {
  op @0 :RolloutOp;
  name @1 :Text;
  # The deployment, by its plain name.

  modelFile @2 :Text;
  modelSha256 @3 :Text;
  version @4 :Text;
  # start only: the new version's file, its digest (empty: not pinned) and
  # label (empty: the next number).

  steps @5 :Text;
  # start only: traffic percentages ("1,10,100", the default when empty).

  bakeS @6 :UInt32;
  # start only: seconds each step runs before it may advance (0: default).

  maxUnavailable @7 :UInt32 = 1;
  surge @8 :UInt32 = 1;
  # start only: replicas replaced at once; extra replicas started first
  # (0: replace in place, no extra devices).

  minSamples @9 :UInt32;
  # start only: requests of each version per step before a verdict (0: default).
}

enum RolloutOp {
  start @0;
  status @1;
  pause @2;
  resume @3;
  abort @4;
  promote @5;
}

enum DrainTarget {
  node @0;
  replica @1;
}

interface Service {
  # The bootstrap capability of an ExaServe server.

  gateway @0 (apiKey :Text) -> (gateway :Gateway);
  # Generation. Each call returns a fresh Gateway whose cancel() sees only the
  # requests made through it. A server started with a keys file wants a valid
  # API key (else: "unauthenticated: ..."); one without ignores it.

  admin @1 (apiKey :Text) -> (admin :Admin);
  # Cluster management. With a keys file, the key must be an admin key (else
  # "unauthenticated: ..." or "permission_denied: ...").
}
