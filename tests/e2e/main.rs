//! The end-to-end tests: the real `host` binary with the real plugins, real
//! daemons on sockets in temporary directories, and the real components the
//! tests start themselves (a throwaway PostgreSQL, local HTTP servers on
//! 127.0.0.1, headless Chromium, componentize-py and componentize-js,
//! schemathesis, openapi-python-client and openapi-typescript). One
//! test binary, so the suite links wasmtime a few times instead of once per
//! file; `cargo test -p taskhost-tests --test e2e <module>::` runs one
//! file's tests, against the `host` already built (`common::host_bin`).
//!
//! | module | covers |
//! |---|---|
//! | `cli_run` | `host run` and `host inspect`: output and exit codes |
//! | `artifacts` | compiled plugins on disk: reuse, and truncated, corrupt, foreign or unprotected ones compiled again |
//! | `serve` | `host serve` and the client verbs over the socket |
//! | `bad_plugins` | a corpus of bad plugins against one live daemon |
//! | `exhaustion` | parked sleepers by the thousand, a full instance pool |
//! | `soak`, `crashes` | mixed load; random SIGKILLs of a durable daemon |
//! | `faults` | vanishing clients and subscribers, SIGTERM in every state |
//! | `durability` | the SQLite store: kill -9 and recovery, damaged stores |
//! | `regressions` | one test per defect found by review |
//! | `outbound_http` | grants, denials, address checks and redirects of guests' HTTP; its cap |
//! | `guest_limits` | per-attempt caps on files and handles, memory over all memories, the memory ceiling |
//! | `cluster` | cluster mode on a real PostgreSQL |
//! | `cluster_flow` | slot rules across three nodes: capacity, Replace on a full slot, a raised rule, the capacity invariant under SIGKILL and SIGSTOP |
//! | `time` | schedules, delayed submissions and priorities on one host |
//! | `flow` | flow control on slots: rules, capacity against each policy, the capacity invariant across kills |
//! | `namespaces` | namespaces on one host and on a cluster: isolation of every verb, each quota, a team's token, buckets, secrets, spawn trees, a restart |
//! | `remote` | `host --remote`, tokens with scopes, TLS, the JSON API's verbs |
//! | `openapi` | the JSON API's OpenAPI document: schemathesis against the daemon, a generated Python client and TypeScript types driving it (`tests/clients/`) |
//! | `observability` | `--http`: metrics, the JSON API, the dashboard in Chromium |
//! | `traces` | OpenTelemetry traces to a collector in the test |
//! | `trust` | trust boundaries: private files, peers checked, one daemon per store |
//! | `guests` | Python and JavaScript guests |
//! | `deployments` | named deployments on one host and a cluster: deploy, submit by name, versions kept through deploys and rollbacks, schedules following a name, children by name, removal refused while in use, a restart |
//! | `oci` | plugins through a real OCI registry with TLS and basic auth: push a file and a deployment, deploy by tag and digest; a wrong digest, tampered bytes, no credentials, an unknown CA and a registry that is down refused |
//! | `commands` | WASI command components as tasks: programs from crates.io against their native builds, arguments, input, exits, a force-abort |
//! | `record` | the flight recorder: `host run --record` and `host replay` of a non-deterministic guest, of outbound HTTP and of files read through a grant, a planted divergence, a record replayed elsewhere |
//! | `docs` | every shell block of the documents |
//! | `scaffold` | `host new` → build → `host run` |
//!
//! The helpers: `common` (the binary, plugins, line readers), `daemon` (a
//! daemon in a temporary directory), `generated` (the checks of clients
//! generated from the OpenAPI document), `http` (a minimal HTTP client),
//! `postgres` (a throwaway server), `registry` (a throwaway OCI registry), `wire` (the protocol's client).

mod common;
#[path = "common/daemon.rs"]
mod daemon;
#[path = "common/generated.rs"]
mod generated;
#[path = "common/http.rs"]
mod http;
#[path = "../../crates/core/tests/controller/invariants.rs"]
mod invariants;
#[path = "common/partition.rs"]
mod partition;
#[path = "common/postgres.rs"]
mod postgres;
#[path = "common/registry.rs"]
mod registry;
#[path = "common/wire.rs"]
mod wire;

mod artifacts;
mod bad_plugins;
mod batch;
mod children;
mod cli_run;
mod cluster;
mod cluster_flow;
mod commands;
mod crashes;
mod deployments;
mod docs;
mod durability;
mod exhaustion;
mod faults;
mod flow;
mod guest_limits;
mod guests;
mod kv;
mod namespaces;
mod observability;
mod oci;
mod openapi;
mod outbound_http;
mod record;
mod regressions;
mod remote;
mod scaffold;
mod secrets;
mod serve;
mod soak;
mod time;
mod traces;
mod trust;
