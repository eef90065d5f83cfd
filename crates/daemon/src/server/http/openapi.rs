//! Owns `GET /api/openapi.json`: an OpenAPI 3.1 document of the JSON API,
//! built from [`ROUTES`], the table `mod.rs` guards its routes by (each
//! route's scope comes from here, so the document cannot say another scope
//! than the one enforced). Every body, query and answer is described by
//! the schema `schemars` derives from the Rust type the handler reads or
//! serializes; the statuses a route can answer follow from what it takes
//! and what it calls (`failed` maps every error kind). Tests hold it to the
//! handlers the other way: every route answers with the scope it names,
//! and schemathesis (`tests/e2e/openapi.rs`) checks the answers against it.

use schemars::generate::{SchemaGenerator, SchemaSettings};
use schemars::{JsonSchema, Schema};
use serde_json::{Map, Value, json};

use super::answers::{
    ErrorJson, MatchedJson, PendingJson, StoredJson, TaskDetailJson, VersionJson,
};
use super::{api, bulk, deployments, namespaces, slot_rules, verbs};
use crate::server::scope::Scope;
use crate::service::json::{
    BatchJson, CanceledJson, DeploymentJson, JsonResult, NamespaceJson, PluginRowJson,
    ScheduleJson, ShutdownJson, SlotJson, SlotRuleJson, SubmittedJson, TaskRowJson,
};
use crate::wire::protocol::SubmitJson;
use taskhost_core::logline::LogLine;

/// A schema, made by the generator (a `$ref` to `components/schemas`).
type SchemaFn = fn(&mut SchemaGenerator) -> Schema;

/// The schema of `T`.
fn of<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    generator.subschema_for::<T>()
}

/// The schema of this document's own top level.
fn document_schema(_: &mut SchemaGenerator) -> Schema {
    let object = json!({ "type": "object", "additionalProperties": true });
    schemars::json_schema!({
        "type": "object",
        "required": ["openapi", "info", "paths", "components"],
        "properties": {
            "openapi": { "type": "string", "description": "the OpenAPI version, 3.1.0" },
            "info": {
                "type": "object",
                "required": ["title", "version"],
                "properties": {
                    "title": { "type": "string" },
                    "version": { "type": "string", "description": "the daemon's build" },
                    "description": { "type": "string" },
                },
            },
            "paths": { "type": "object", "additionalProperties": object.clone() },
            "components": { "type": "object", "additionalProperties": object },
        },
    })
}

/// What a route takes in its body.
#[derive(Clone, Copy)]
pub(super) enum Takes {
    /// Nothing (a POST without a body is taken).
    Nothing,
    /// JSON of this schema; `true`: the body may be left out.
    Json(SchemaFn, bool),
    /// The bytes of a plugin.
    Bytes,
}

/// What an answer's body is.
#[derive(Clone, Copy)]
pub(super) enum Body {
    Json(SchemaFn),
    /// Prometheus' text exposition.
    Metrics,
    /// Server-sent events.
    Events,
    /// No body (a protocol switch).
    Upgrade,
    /// Bytes (a record file).
    Binary,
}

/// One answer of a route beside the errors.
pub(super) struct Answer {
    pub status: u16,
    pub what: &'static str,
    pub body: Body,
}

const fn ok(what: &'static str, body: SchemaFn) -> Answer {
    Answer {
        status: 200,
        what,
        body: Body::Json(body),
    }
}

/// One route of the API.
pub(super) struct Route {
    pub method: &'static str,
    pub path: &'static str,
    pub scope: Scope,
    /// Its `operationId` (what generated clients name it).
    pub id: &'static str,
    pub summary: &'static str,
    pub takes: Takes,
    /// Its query parameters: an object schema, a parameter per property.
    pub query: Option<SchemaFn>,
    pub answers: &'static [Answer],
    /// Whether it only reads the daemon's build (no store, no tasks).
    pub fixed: bool,
}

const fn route(
    method: &'static str,
    path: &'static str,
    scope: Scope,
    id: &'static str,
    summary: &'static str,
    answers: &'static [Answer],
) -> Route {
    Route {
        method,
        path,
        scope,
        id,
        summary,
        takes: Takes::Nothing,
        query: None,
        answers,
        fixed: false,
    }
}

impl Route {
    const fn taking(mut self, takes: Takes) -> Self {
        self.takes = takes;
        self
    }

    const fn query(mut self, query: SchemaFn) -> Self {
        self.query = Some(query);
        self
    }

    const fn fixed(mut self) -> Self {
        self.fixed = true;
        self
    }
}

/// The answer of a submission: 201 accepted, 200 the task an idempotency
/// key made before.
const SUBMITTED: &[Answer] = &[
    Answer {
        status: 201,
        what: "accepted (durably, with a durable store), as `host submit --json`; a submission rejected at intake has its `outcome`",
        body: Body::Json(of::<SubmittedJson<'static>>),
    },
    ok(
        "the task the idempotency key made before (`existing`: true)",
        of::<SubmittedJson<'static>>,
    ),
];

/// Every route of the JSON API (the dashboard page `/` aside).
pub(super) const ROUTES: &[Route] = &[
    route(
        "get",
        "/metrics",
        Scope::Read,
        "metrics",
        "Prometheus metrics",
        &[Answer {
            status: 200,
            what: "the text exposition",
            body: Body::Metrics,
        }],
    ),
    route(
        "get",
        "/api/openapi.json",
        Scope::Read,
        "openapi",
        "This document",
        &[ok("the document", document_schema)],
    )
    .fixed(),
    route(
        "get",
        "/api/tasks",
        Scope::Read,
        "listTasks",
        "The rows of `host ps --json` (`all`: with finished ones; `state`, `slot`, `name`, `plugin`, `outcome`, `since`, `until`, `limit`, `before`: a page of those that match, newest first; the last id of a page is the next page's `before`)",
        &[ok("the rows", of::<Vec<TaskRowJson>>)],
    )
    .query(of::<api::TasksQuery>),
    route(
        "get",
        "/api/tasks/{task}",
        Scope::Read,
        "getTask",
        "A task's page: its row, outcome, attempts and log",
        &[ok("its page", of::<TaskDetailJson<'static>>)],
    ),
    route(
        "get",
        "/api/tasks/{task}/logs",
        Scope::Read,
        "getTaskLogs",
        "Its log lines as `host logs --json` (`follow`: server-sent events of them until it ends, then an `end` event)",
        &[
            ok("its lines", of::<Vec<LogLine>>),
            Answer {
                status: 200,
                what: "with `follow`: a stream",
                body: Body::Events,
            },
        ],
    )
    .query(of::<verbs::LogsQuery>),
    route(
        "get",
        "/api/tasks/{task}/record",
        Scope::Read,
        "getTaskRecord",
        "The record of one of its attempts (`attempt`; default the last recorded), a record file as `host record export` writes it, for `host replay FILE`",
        &[Answer {
            status: 200,
            what: "the record file",
            body: Body::Binary,
        }],
    )
    .query(of::<verbs::RecordQuery>),
    route(
        "get",
        "/api/slots",
        Scope::Read,
        "listSlots",
        "The rows of `host slots --json`",
        &[ok("the slots", of::<Vec<SlotJson>>)],
    ),
    route(
        "get",
        "/api/namespaces",
        Scope::Read,
        "listNamespaces",
        "The namespaces the token reaches, as `host ns ls --json` (its quotas and use)",
        &[ok("the namespaces", of::<Vec<NamespaceJson>>)],
    ),
    route(
        "put",
        "/api/namespaces/{name}",
        Scope::Admin,
        "putNamespace",
        "Adds or changes a namespace, as `host ns add|set --json` (a token of every namespace)",
        &[ok("the namespace", of::<NamespaceJson>)],
    )
    .taking(Takes::Json(of::<namespaces::NamespaceBody>, true)),
    route(
        "delete",
        "/api/namespaces/{name}",
        Scope::Admin,
        "deleteNamespace",
        "Removes an empty namespace, as `host ns rm --json` (a token of every namespace)",
        &[ok("the namespace as it was", of::<NamespaceJson>)],
    ),
    route(
        "get",
        "/api/slot-rules",
        Scope::Read,
        "listSlotRules",
        "The rows of `host slot ls --json`",
        &[ok("the rules", of::<Vec<SlotRuleJson>>)],
    ),
    route(
        "put",
        "/api/slot-rules",
        Scope::Admin,
        "setSlotRule",
        "Set a slot rule, as `host slot set --json`",
        &[ok("the rule", of::<SlotRuleJson>)],
    )
    .taking(Takes::Json(of::<slot_rules::SlotRuleBody>, false)),
    route(
        "delete",
        "/api/slot-rules",
        Scope::Admin,
        "unsetSlotRule",
        "Remove a slot rule, as `host slot unset --json`",
        &[ok("the rule removed", of::<SlotRuleJson>)],
    )
    .query(of::<slot_rules::PatternQuery>),
    route(
        "get",
        "/api/events",
        Scope::Read,
        "events",
        "Server-sent events, as `host events --follow --json` (`task`: one task's)",
        &[Answer {
            status: 200,
            what: "a stream: each event's data is the JSON of `host events --json`, its id the event's seq; `dropped` events say how many a slow reader missed",
            body: Body::Events,
        }],
    )
    .query(of::<api::EventsQuery>),
    route(
        "get",
        "/api/plugins",
        Scope::Read,
        "listPlugins",
        "The rows of `host plugins ls --json`",
        &[ok("the plugins", of::<Vec<PluginRowJson>>)],
    ),
    route(
        "get",
        "/api/version",
        Scope::Read,
        "version",
        "The daemon's build and protocol versions",
        &[ok("the versions", of::<VersionJson>)],
    )
    .fixed(),
    route(
        "get",
        "/api/wire",
        Scope::Read,
        "wire",
        "Upgrade to the daemon's own protocol (`Upgrade: taskhost-wire`), as `host --remote` does",
        &[
            Answer {
                status: 101,
                what: "the connection now speaks the daemon's protocol",
                body: Body::Upgrade,
            },
            Answer {
                status: 426,
                what: "no `Upgrade: taskhost-wire`",
                body: Body::Json(of::<ErrorJson>),
            },
        ],
    ),
    route(
        "put",
        "/api/plugins/{digest}",
        Scope::Submit,
        "uploadPlugin",
        "Store a plugin by its SHA-256 (the body: its bytes); a no-op when present",
        &[ok("stored, or already there", of::<StoredJson>)],
    )
    .taking(Takes::Bytes),
    route(
        "post",
        "/api/tasks",
        Scope::Submit,
        "submitTask",
        "Submit a task (`idempotency_key`, or an `Idempotency-Key` header, makes it idempotent)",
        SUBMITTED,
    )
    .taking(Takes::Json(of::<SubmitJson>, false)),
    route(
        "post",
        "/api/tasks/batch",
        Scope::Submit,
        "submitBatch",
        "Submit up to 1,000 tasks, each as POST /api/tasks would take it alone: one answer per task, in order",
        &[ok(
            "one item per task: where it went, or why it was refused",
            of::<BatchJson>,
        )],
    )
    .taking(Takes::Json(of::<verbs::BatchBody>, false)),
    route(
        "post",
        "/api/tasks/cancel",
        Scope::Admin,
        "cancelMatching",
        "Stop every live task that matches, as `host cancel --filter --json` (`dry_run`: only count them)",
        &[ok("what matched", of::<MatchedJson>)],
    )
    .taking(Takes::Json(of::<bulk::FilterBody>, false)),
    route(
        "post",
        "/api/tasks/rerun",
        Scope::Submit,
        "rerunMatching",
        "Submit again every finished task that matches, as `host rerun --filter --json` (`dry_run`: only count them)",
        &[ok("what matched", of::<MatchedJson>)],
    )
    .taking(Takes::Json(of::<bulk::FilterBody>, false)),
    route(
        "get",
        "/api/tasks/{task}/outcome",
        Scope::Submit,
        "getOutcome",
        "Its result as `host wait --json`; `wait` long-polls",
        &[
            ok("its result", of::<JsonResult<'static>>),
            Answer {
                status: 202,
                what: "no result yet",
                body: Body::Json(of::<PendingJson>),
            },
        ],
    )
    .query(of::<verbs::WaitQuery>),
    route(
        "post",
        "/api/tasks/{task}/rerun",
        Scope::Submit,
        "rerunTask",
        "Submit a new task with this task's request",
        SUBMITTED,
    ),
    route(
        "post",
        "/api/tasks/{task}/cancel",
        Scope::Admin,
        "cancelTask",
        "Stop it and answer once it has ended, as `host cancel --json`",
        &[ok("whether this request stopped it, and its report", of::<CanceledJson>)],
    ),
    route(
        "post",
        "/api/tasks/{task}/remove",
        Scope::Admin,
        "removeTask",
        "Ask it to stop and answer at once, as `host remove --json`",
        &[ok("whether this request stopped it", of::<CanceledJson>)],
    ),
    route(
        "delete",
        "/api/plugins/{digest}",
        Scope::Admin,
        "removePlugin",
        "Remove the stored plugins whose digest starts so that no unfinished task uses (a token of every namespace)",
        &[ok("the plugins removed", of::<Vec<PluginRowJson>>)],
    ),
    route(
        "post",
        "/api/shutdown",
        Scope::Admin,
        "shutdown",
        "Shut the daemon down, as `host shutdown --json` (a token of every namespace)",
        &[ok("once its tasks have stopped", of::<ShutdownJson>)],
    )
    .taking(Takes::Json(of::<verbs::ShutdownBody>, true)),
    route(
        "get",
        "/api/schedules",
        Scope::Read,
        "listSchedules",
        "The rows of `host schedule ls --json`",
        &[ok("the schedules", of::<Vec<ScheduleJson>>)],
    ),
    route(
        "post",
        "/api/schedules",
        Scope::Submit,
        "addSchedule",
        "Add a schedule: what each firing submits is `task`, the body of POST /api/tasks",
        &[Answer {
            status: 201,
            what: "added, as `host schedule add --json`",
            body: Body::Json(of::<ScheduleJson>),
        }],
    )
    .taking(Takes::Json(of::<verbs::ScheduleBody>, false)),
    route(
        "delete",
        "/api/schedules/{schedule}",
        Scope::Admin,
        "removeSchedule",
        "Delete a schedule, as `host schedule rm --json`",
        &[ok("the schedule as it was", of::<ScheduleJson>)],
    ),
    route(
        "post",
        "/api/schedules/{schedule}/pause",
        Scope::Admin,
        "pauseSchedule",
        "Pause a schedule, as `host schedule pause --json`",
        &[ok("the schedule", of::<ScheduleJson>)],
    ),
    route(
        "post",
        "/api/schedules/{schedule}/resume",
        Scope::Admin,
        "resumeSchedule",
        "Resume a schedule, as `host schedule resume --json`",
        &[ok("the schedule", of::<ScheduleJson>)],
    ),
    route(
        "post",
        "/api/schedules/{schedule}/run",
        Scope::Submit,
        "runSchedule",
        "Fire a schedule once now; answered as POST /api/tasks",
        SUBMITTED,
    ),
    route(
        "get",
        "/api/deployments",
        Scope::Read,
        "listDeployments",
        "Each deployment's current version, as `host deployments ls --json`",
        &[ok("the deployments", of::<Vec<DeploymentJson>>)],
    ),
    route(
        "post",
        "/api/deployments",
        Scope::Admin,
        "deploy",
        "Deploy a stored plugin by name and version, as `host deploy --json`",
        &[ok("the version now current", of::<Vec<DeploymentJson>>)],
    )
    .taking(Takes::Json(of::<deployments::DeployBody>, false)),
    route(
        "get",
        "/api/deployments/{deployment}",
        Scope::Read,
        "deploymentHistory",
        "A deployment's deploys, rollbacks and removals, newest first, as `host deployments history --json`",
        &[ok("its events", of::<Vec<DeploymentJson>>)],
    ),
    route(
        "delete",
        "/api/deployments/{deployment}",
        Scope::Admin,
        "removeDeploymentVersion",
        "Remove a version, as `host deployments rm --json`: refused for the current one and while a task or schedule uses it",
        &[ok("the removal", of::<Vec<DeploymentJson>>)],
    )
    .query(of::<deployments::VersionQuery>),
    route(
        "post",
        "/api/deployments/{deployment}/rollback",
        Scope::Admin,
        "rollback",
        "Make an earlier version current again, as `host rollback --json`",
        &[ok("the version now current", of::<Vec<DeploymentJson>>)],
    )
    .taking(Takes::Json(of::<deployments::RollbackBody>, true)),
];

/// The scope a route needs, by method and path as [`ROUTES`] writes them.
pub(super) fn scope(method: &str, path: &str) -> Scope {
    ROUTES
        .iter()
        .find(|r| r.method == method && r.path == path)
        .map_or(Scope::Admin, |r| r.scope)
}

/// Each path parameter's schema.
fn path_parameter(name: &str, method: &str) -> Value {
    let (schema, what) = match (name, method) {
        ("digest", "put") => (
            json!({ "type": "string", "pattern": "^(sha256:)?[0-9a-f]{64}$" }),
            "the plugin's SHA-256, hex",
        ),
        ("digest", _) => (
            json!({ "type": "string", "pattern": "^(sha256:)?[0-9a-f]{1,64}$" }),
            "the start of a stored plugin's SHA-256, hex",
        ),
        ("name", _) => (
            json!({ "type": "string", "pattern": "^[a-z0-9][a-z0-9-]{0,62}$" }),
            "a namespace's name",
        ),
        ("deployment", _) => (
            json!({ "type": "string", "pattern": deployments::DEPLOYMENT_NAME }),
            "a deployment's name",
        ),
        ("schedule", _) => (
            json!({
                "type": "string",
                "pattern": verbs::SCHEDULE_NAME,
                "maxLength": crate::schedule::MAX_NAME,
            }),
            "a schedule's name",
        ),
        _ => (
            json!({ "type": "string", "minLength": 1 }),
            "a task's id, or its name",
        ),
    };
    json!({ "name": name, "in": "path", "required": true, "description": what, "schema": schema })
}

/// The parameters of a query type: one per property of its object schema.
fn query_parameters(query: SchemaFn, generator: &mut SchemaGenerator) -> Vec<Value> {
    let mut schema = query(generator);
    schemars::transform::Transform::transform(
        &mut schemars::transform::RecursiveTransform(bounded),
        &mut schema,
    );
    let schema = schema.to_value();
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let Some(properties) = schema["properties"].as_object() else {
        return Vec::new();
    };
    properties
        .iter()
        .map(|(name, property)| {
            let mut property = property.clone();
            let description = property
                .as_object_mut()
                .and_then(|p| p.remove("description"))
                .unwrap_or(Value::Null);
            json!({
                "name": name,
                "in": "query",
                "required": required.contains(&name.as_str()),
                "description": description,
                "schema": property,
            })
        })
        .collect()
}

/// The error statuses a route can answer, and why.
fn errors(r: &Route) -> Vec<(u16, String)> {
    let mut out = vec![
        (401, "no token, or one the daemon does not hold".to_owned()),
        (
            403,
            format!(
                "a token whose scope is below {}, or of another namespace for the operator's routes, or a page of another origin",
                r.scope.name()
            ),
        ),
        (
            404,
            "not found: the task, plugin, schedule or namespace, or the X-Taskhost-Namespace named"
                .to_owned(),
        ),
        (421, "a Host this listener does not answer to".to_owned()),
    ];
    if !r.fixed {
        out.push((
            400,
            "the request is not one the daemon takes: the error says what and how to fix it".into(),
        ));
        out.push((409, "a conflict: an idempotency key given with another request, a plugin or namespace still in use".into()));
        out.push((429, "over a namespace's quota".into()));
        out.push((
            503,
            "the daemon is shutting down, or at its cap of open streams".into(),
        ));
    }
    if matches!(r.method, "post" | "put") {
        out.push((413, "the body is over this route's limit".into()));
    }
    if r.method == "post" {
        out.push((
            415,
            "a body without `Content-Type: application/json`".into(),
        ));
    }
    out.sort();
    out
}

/// Bounds every integer by its Rust type (`format`), which JSON Schema
/// validators and generators otherwise ignore: a number out of the type's
/// range is refused.
fn bounded(schema: &mut Schema) {
    let range: Option<(i128, i128)> = match schema.get("format").and_then(Value::as_str) {
        Some("uint32") => Some((0, u32::MAX.into())),
        Some("uint64" | "uint") => Some((0, u64::MAX.into())),
        Some("int32") => Some((i32::MIN.into(), i32::MAX.into())),
        Some("int64") => Some((i64::MIN.into(), i64::MAX.into())),
        _ => None,
    };
    if let Some((low, high)) = range {
        if schema.get("minimum").is_none() {
            schema.insert("minimum".into(), json!(low as f64 as i64));
        }
        if schema.get("maximum").is_none() {
            // As JSON writes the bound (u64::MAX is past i64).
            let high = u64::try_from(high).map_or(json!(high as i64), |h| json!(h));
            schema.insert("maximum".into(), high);
        }
    }
}

fn settings() -> SchemaSettings {
    SchemaSettings::draft2020_12()
        .with(|s| s.definitions_path = "/components/schemas".into())
        .with_transform(schemars::transform::RecursiveTransform(bounded))
}

/// The document.
pub(super) fn document() -> Value {
    let mut requests = settings().for_deserialize().into_generator();
    let mut answers = settings().for_serialize().into_generator();
    let mut queries = settings()
        .with(|s| s.inline_subschemas = true)
        .for_deserialize()
        .into_generator();
    let error = answers.subschema_for::<ErrorJson>().to_value();
    let mut paths = Map::new();
    for r in ROUTES {
        let mut responses = Map::new();
        for answer in r.answers {
            let content = match answer.body {
                Body::Json(schema) => {
                    json!({ "application/json": { "schema": schema(&mut answers) } })
                }
                Body::Metrics => json!({
                    "application/openmetrics-text": { "schema": { "type": "string" } }
                }),
                Body::Events => {
                    json!({ "text/event-stream": { "schema": { "type": "string" } } })
                }
                Body::Binary => json!({
                    "application/octet-stream": {
                        "schema": { "type": "string", "format": "binary" }
                    }
                }),
                Body::Upgrade => Value::Null,
            };
            let entry = responses
                .entry(answer.status.to_string())
                .or_insert_with(|| json!({ "description": answer.what }));
            if !content.is_null() {
                let merged = entry
                    .as_object_mut()
                    .map(|e| e.entry("content").or_insert_with(|| json!({})));
                if let (Some(Value::Object(merged)), Value::Object(content)) = (merged, content) {
                    merged.extend(content);
                }
            }
        }
        for (status, what) in errors(r) {
            responses.insert(
                status.to_string(),
                json!({ "description": what, "content": { "application/json": { "schema": error } } }),
            );
        }
        let mut parameters: Vec<Value> = ["task", "digest", "schedule", "name", "deployment"]
            .iter()
            .filter(|p| r.path.contains(&format!("{{{p}}}")))
            .map(|p| path_parameter(p, r.method))
            .collect();
        if let Some(query) = r.query {
            parameters.extend(query_parameters(query, &mut queries));
        }
        parameters.push(json!({
            "name": "X-Taskhost-Namespace",
            "in": "header",
            "required": false,
            "description": "with a token of every namespace: act in this namespace (`*`: every one)",
            "schema": { "type": "string", "pattern": "^([a-z0-9][a-z0-9-]{0,62}|\\*)?$" },
        }));
        let mut operation = json!({
            "operationId": r.id,
            "summary": r.summary,
            "x-taskhost-scope": r.scope.name(),
            "security": [{ "bearer": [] }],
            "parameters": parameters,
            "responses": responses,
        });
        match r.takes {
            Takes::Nothing => {}
            Takes::Json(schema, optional) => {
                operation["requestBody"] = json!({
                    "required": !optional,
                    "content": { "application/json": { "schema": schema(&mut requests) } },
                });
            }
            Takes::Bytes => {
                operation["requestBody"] = json!({
                    "required": true,
                    "content": { "application/octet-stream": {
                        "schema": { "type": "string", "format": "binary" }
                    } },
                });
            }
        }
        let entry = paths
            .entry(r.path.to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
        entry[r.method] = operation;
    }
    let mut schemas = requests.take_definitions(true);
    for (name, schema) in answers.take_definitions(true) {
        let earlier = schemas.insert(name.clone(), schema.clone());
        debug_assert!(
            earlier.is_none_or(|e| e == schema),
            "two types are named {name}"
        );
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "taskhost daemon",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Every verb of the daemon's socket, over HTTP. Errors are {\"error\": message} with the CLI's wording.",
        },
        "components": {
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } },
            "schemas": schemas,
        },
        "paths": paths,
    })
}
