//! A submission as JSON: the body of `POST /api/tasks`, each item of
//! `POST /api/tasks/batch` and each line of `host submit --batch`, read
//! into a [`SubmitRequest`] with the CLI's wording for every mistake.

use std::time::Duration;

use base64::Engine as _;
use serde::Deserialize;
use serde_json::Value;

use taskhost_core::admission::AdmissionPolicy;
use taskhost_core::supervisor::{BackoffPolicy, RestartPolicy};
use taskhost_core::units::{parse_duration, parse_size};
use taskhost_runtime::{Digest, DirGrant, HttpAllow};

use super::{NotBefore, SubmitRequest};

/// The JSON of `POST /api/tasks`: the flags of `host submit`, with the
/// plugin named by its digest (upload it first).
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("dependentSchemas" = {
    "input": { "not": { "required": ["input_base64"] } },
    "delay": { "not": { "required": ["at"] } },
    "every": { "properties": { "restart": { "enum": ["always", null] } } },
    "max_retries": { "properties": { "restart": { "enum": ["on-failure", "always", null] } } },
}))]
pub struct SubmitJson {
    /// The plugin's SHA-256 (hex, optionally `sha256:`; upload it first),
    /// or a deployment `host deploy` made: `NAME`, `NAME@VERSION` or
    /// `NAME@sha256:HEX` (a name of 64 hex digits reads as a digest; the
    /// pattern covers versions of letters, digits and `._+-`, and any
    /// printable version without spaces or `@` is taken). (A line of
    /// `host submit --batch` may leave it out: its PLUGIN.)
    #[schemars(
        with = "String",
        regex(
            pattern = r"^((sha256:)?[0-9a-f]{64}|[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}(@(sha256:[0-9a-f]{64}|[A-Za-z0-9_.+-]{1,128}))?)$"
        )
    )]
    plugin: Option<String>,
    /// The task's name.
    name: Option<String>,
    /// Its slot (default: the plugin's resource, else the name).
    slot: Option<String>,
    /// `queue`, `replace` or `drop-if-running`.
    #[schemars(extend("enum" = ["queue", "replace", "drop-if-running", null]))]
    policy: Option<String>,
    /// Template and guest parameters.
    #[serde(default)]
    params: std::collections::BTreeMap<String, String>,
    /// The input as text.
    input: Option<String>,
    /// The input as base64 (for bytes that are not UTF-8).
    #[schemars(regex(pattern = r"^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"))]
    input_base64: Option<String>,
    /// `never`, `on-failure` or `always`.
    #[schemars(extend("enum" = ["never", "on-failure", "always", null]))]
    restart: Option<String>,
    /// Run it again this long after a success (a duration such as `30s`).
    #[schemars(regex(pattern = DURATION))]
    every: Option<String>,
    /// Give up after this many retries (implies restart on-failure; not
    /// with never).
    max_retries: Option<u32>,
    /// FIRST,MAX,FACTOR,JITTER, such as `100ms,10s,2,equal` (the pattern
    /// covers a first delay under a second and a longest of seconds).
    #[schemars(regex(
        pattern = r"^[1-9][0-9]{0,2}ms,[1-9][0-9]{0,2}s,[1-9],(none|full|equal|decorrelated)$"
    ))]
    backoff: Option<String>,
    /// Per attempt (a duration such as `30s`).
    #[schemars(regex(pattern = DURATION))]
    timeout: Option<String>,
    /// Bytes, or a size like `64MiB`.
    #[schemars(with = "Option<Size>")]
    max_memory: Option<Value>,
    /// HOST::GUEST[:ro] grants, on the daemon's machine.
    #[serde(default)]
    #[schemars(inner(regex(pattern = r"^[^:]+::[^:]+(:ro|:rw)?$")))]
    dirs: Vec<String>,
    /// Environment variables for the guest.
    #[serde(default)]
    env: std::collections::BTreeMap<String, String>,
    /// Variable → the daemon's secret whose value it gets.
    #[serde(default)]
    #[schemars(extend("additionalProperties" = {
        "type": "string",
        "pattern": "^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}$",
    }))]
    secrets: std::collections::BTreeMap<String, String>,
    /// What `wasi:config/store` answers the guest.
    #[serde(default)]
    config: std::collections::BTreeMap<String, String>,
    /// Shared key-value buckets the guest may open.
    #[serde(default)]
    #[schemars(inner(regex(pattern = r"^[A-Za-z0-9_./-]{1,128}$")))]
    kv: Vec<String>,
    /// `[http://]HOST[:PORT]` the guest may call (the pattern covers
    /// lowercase names; addresses and `*.DOMAIN` are taken too).
    #[serde(default)]
    #[schemars(inner(regex(
        pattern = r"^(https?://)?[a-z][a-z0-9]{0,30}(\.[a-z][a-z0-9]{0,30}){0,3}(:[1-9][0-9]{0,3})?$"
    )))]
    allow_http: Vec<String>,
    /// The same key with the same request answers the task it made (over
    /// HTTP, the `Idempotency-Key` header may carry it instead): 1 to 256
    /// characters of printable text.
    #[schemars(
        length(min = 1, max = 256),
        regex(pattern = r"^[^\x00-\x1f\x7f-\x9f]*$")
    )]
    idempotency_key: Option<String>,
    /// `false`: keep no record of its attempts for `host replay` (default:
    /// recorded, unless the daemon records nothing).
    record: Option<bool>,
    /// Hold it this long after it is accepted (a duration), as `--delay`.
    #[schemars(regex(pattern = DURATION))]
    delay: Option<String>,
    /// Hold it until this time (RFC 3339, at most ten years ahead), as
    /// `--at`. The pattern covers times until 2035 with a `Z` or an offset.
    #[schemars(regex(
        pattern = r"^20([0-2][0-9]|3[0-5])-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,3})?(Z|[+-](0[0-9]|1[0-3]):[0-5][0-9])$"
    ))]
    at: Option<String>,
    /// Its attempts' priority for permits, as `--priority`.
    priority: Option<i32>,
    /// A WASI command's arguments after its name, in order, as `--arg`
    /// (a task plugin takes none: it reads `params`).
    #[serde(default)]
    #[schemars(length(max = 4096))]
    args: Vec<String>,
}

/// Standard base64 that takes a last symbol with bits to spare (`QR==`
/// for `QQ==`), as most decoders do.
const LENIENT: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new().with_decode_allow_trailing_bits(true),
);

/// A duration as the CLI takes it: a number and a unit.
pub const DURATION: &str = r"^[0-9]{1,4}(ms|s|m|h)$";

/// A size: bytes, or a number and a unit.
#[derive(schemars::JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)]
enum Size {
    /// Bytes, at least 64KiB.
    Bytes(#[schemars(range(min = 65_536))] u64),
    /// A size like `64MiB`.
    Text(#[schemars(regex(pattern = r"^[1-9][0-9]{0,4}(MiB|GiB)$"))] String),
}

impl SubmitJson {
    /// The request it stands for, or what is wrong (the CLI's wording);
    /// without a `plugin` of its own, `plugin` names its plugin.
    pub fn request(self, plugin: Option<Digest>) -> Result<SubmitRequest, String> {
        let mut deployment = None;
        let digest: Digest = match (&self.plugin, plugin) {
            (Some(text), _) => match text.parse() {
                Ok(digest) => digest,
                Err(e) => match super::Reference::parse(text) {
                    // The daemon sets the digest from the deployment.
                    Ok(_) if !text.starts_with("sha256:") => {
                        deployment = Some(text.clone());
                        Digest([0; 32])
                    }
                    _ => {
                        return Err(format!(
                            "plugin: `{text}` is neither a plugin digest ({e}) nor a \
                             deployment (NAME, NAME@VERSION, NAME@sha256:HEX)"
                        ));
                    }
                },
            },
            (None, Some(digest)) => digest,
            (None, None) => {
                return Err(
                    "plugin: missing: give the SHA-256 of an uploaded plugin, in hex".into(),
                );
            }
        };
        let mut request = SubmitRequest::new(digest);
        request.name = self.name;
        request.slot = self.slot;
        request.policy = self
            .policy
            .map(|p| {
                p.parse::<AdmissionPolicy>()
                    .map_err(|e| format!("policy: {e}"))
            })
            .transpose()?;
        request.params = self.params.into_iter().collect();
        request.input = match (self.input, self.input_base64) {
            (Some(_), Some(_)) => return Err("give input or input_base64, not both".into()),
            (Some(text), None) => text.into_bytes(),
            (None, Some(b64)) => LENIENT
                .decode(b64.as_bytes())
                .map_err(|e| format!("input_base64: not base64 ({e})"))?,
            (None, None) => Vec::new(),
        };
        let duration = |what: &str, text: Option<String>| {
            text.map(|t| parse_duration(&t).map_err(|e| format!("{what}: {e}")))
                .transpose()
        };
        let every = duration("every", self.every)?;
        // As `host submit`'s flags: `every` implies always, `max_retries`
        // on-failure.
        let retries = self.max_retries.is_some();
        request.restart = Some(match (self.restart.as_deref(), every) {
            (Some("never" | "on-failure"), Some(_)) => {
                return Err(
                    "every reruns after success; it needs restart always (or no restart)".into(),
                );
            }
            (Some("never"), None) if retries => {
                return Err(
                    "max_retries retries failed attempts, which restart never forbids: \
                            drop restart (max_retries implies on-failure) or give on-failure or \
                            always"
                        .into(),
                );
            }
            (Some("always") | None, Some(interval)) => RestartPolicy::Always { interval },
            (Some("always"), None) => RestartPolicy::Always {
                interval: Duration::ZERO,
            },
            (Some("on-failure"), None) => RestartPolicy::OnFailure,
            (None, None) if retries => RestartPolicy::OnFailure,
            (Some("never") | None, None) => RestartPolicy::Never,
            (Some(other), _) => {
                return Err(format!(
                    "restart: `{other}` is not one of never, on-failure, always"
                ));
            }
        });
        request.max_retries = self.max_retries;
        request.backoff = self
            .backoff
            .map(|b| {
                b.parse::<BackoffPolicy>()
                    .map_err(|e| format!("backoff: {e}"))
            })
            .transpose()?;
        request.timeout = duration("timeout", self.timeout)?;
        request.max_memory = match self.max_memory {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) => {
                Some(n.as_u64().ok_or("max_memory: a whole number of bytes")?)
            }
            Some(Value::String(s)) => Some(parse_size(&s).map_err(|e| format!("max_memory: {e}"))?),
            Some(_) => return Err("max_memory: bytes, or a size like \"64MiB\"".into()),
        };
        request.dirs = self
            .dirs
            .iter()
            .map(|d| DirGrant::parse(d).map_err(|e| format!("dirs: {e}")))
            .collect::<Result<_, _>>()?;
        request.env = self.env.into_iter().collect();
        request.config = self.config.into_iter().collect();
        for bucket in &self.kv {
            taskhost_runtime::kv::check_bucket_name(bucket).map_err(|e| format!("kv: {e}"))?;
        }
        request.kv = self.kv;
        request.secrets = self
            .secrets
            .into_iter()
            .map(|(var, name)| {
                taskhost_runtime::check_secret_name(&name)
                    .map(|()| taskhost_runtime::SecretRef { var, name })
                    .map_err(|e| format!("secrets: {e}"))
            })
            .collect::<Result<_, _>>()?;
        request.allow_http = self
            .allow_http
            .iter()
            .map(|h| HttpAllow::parse(h).map_err(|e| format!("allow_http: {e}")))
            .collect::<Result<_, _>>()?;
        request.args = self.args;
        request.deployment = deployment;
        request.idempotency_key = self.idempotency_key;
        request.no_record = self.record == Some(false);
        request.not_before = match (self.delay, self.at) {
            (Some(_), Some(_)) => return Err("give delay or at, not both".into()),
            (Some(delay), None) => Some(NotBefore::After(
                parse_duration(&delay).map_err(|e| format!("delay: {e}"))?,
            )),
            (None, Some(at)) => Some(NotBefore::At(
                crate::schedule::parse_rfc3339(&at).map_err(|e| format!("at: {e}"))?,
            )),
            (None, None) => None,
        };
        request.priority = self.priority.unwrap_or(0);
        Ok(request)
    }
}
