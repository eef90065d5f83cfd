//! Owns the plugin contract as the host sees it: what a plugin declares about
//! itself ([`PluginInfo`]), the capabilities it may ask for
//! ([`Capability`]), its default admission policy ([`DefaultPolicy`]), and
//! the resource templates (`deploy/{env}`) it acts on, with their
//! validation and filling from a submission's params. These are the Rust
//! side of the types in `wit/`; checking grants against capabilities is the
//! sandbox's business, choosing a slot the caller's.

#![forbid(unsafe_code)]

use std::collections::BTreeSet;

use crate::bindings::taskhost::plugin::types;

/// Longest template or filled slot accepted.
pub const MAX_TEMPLATE_LEN: usize = 512;

/// A validated resource template such as `deploy/{env}`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ResourceTemplate {
    text: String,
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    Param(String),
}

/// Why a template is malformed or cannot be filled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// The template text itself is malformed.
    #[error("invalid resource template `{template}`: {why}")]
    Invalid {
        /// The template text.
        template: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A placeholder has no matching param.
    #[error(
        "the plugin's resource `{template}` needs {}; pass {} (or choose a slot with --slot)",
        list(missing, |m| format!("param `{m}`")),
        list(missing, |m| format!("--param {m}=VALUE"))
    )]
    MissingParams {
        /// The template text.
        template: String,
        /// The placeholders without a param, in template order.
        missing: Vec<String>,
    },
}

fn list(items: &[String], f: impl Fn(&str) -> String) -> String {
    items.iter().map(|i| f(i)).collect::<Vec<_>>().join(" and ")
}

impl ResourceTemplate {
    /// Parses and validates a template: `{name}` placeholders with names of
    /// letters, digits, `-` and `_`; no stray or nested braces.
    pub fn parse(text: &str) -> Result<Self, TemplateError> {
        let invalid = |why| TemplateError::Invalid {
            template: text.chars().take(80).collect(),
            why,
        };
        if text.is_empty() {
            return Err(invalid("it is empty"));
        }
        if text.len() > MAX_TEMPLATE_LEN {
            return Err(invalid("it is longer than 512 bytes"));
        }
        let mut parts = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            match rest.find(['{', '}']) {
                None => {
                    parts.push(Part::Literal(rest.to_owned()));
                    break;
                }
                Some(i) if rest.as_bytes()[i] == b'}' => {
                    return Err(invalid("it has a `}` without `{`"));
                }
                Some(i) => {
                    if i > 0 {
                        parts.push(Part::Literal(rest[..i].to_owned()));
                    }
                    let after = &rest[i + 1..];
                    let end = after
                        .find('}')
                        .ok_or_else(|| invalid("it has a `{` without `}`"))?;
                    let name = &after[..end];
                    if name.is_empty()
                        || !name
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
                    {
                        return Err(invalid(
                            "a placeholder name must be letters, digits, `-` or `_`",
                        ));
                    }
                    parts.push(Part::Param(name.to_owned()));
                    rest = &after[end + 1..];
                }
            }
        }
        Ok(Self {
            text: text.to_owned(),
            parts,
        })
    }

    /// The template as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The distinct placeholder names, sorted.
    pub fn params(&self) -> BTreeSet<&str> {
        self.parts
            .iter()
            .filter_map(|p| match p {
                Part::Param(name) => Some(name.as_str()),
                Part::Literal(_) => None,
            })
            .collect()
    }

    /// Fills every placeholder from `params` (the last value of a repeated
    /// key wins); names every missing param at once.
    pub fn fill(&self, params: &[(String, String)]) -> Result<String, TemplateError> {
        let lookup = |key: &str| {
            params
                .iter()
                .rev()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
        };
        let mut out = String::new();
        let mut missing = Vec::new();
        for part in &self.parts {
            match part {
                Part::Literal(text) => out.push_str(text),
                Part::Param(name) => match lookup(name) {
                    Some(value) => out.push_str(value),
                    None if !missing.contains(name) => missing.push(name.clone()),
                    None => {}
                },
            }
        }
        if missing.is_empty() {
            Ok(out)
        } else {
            Err(TemplateError::MissingParams {
                template: self.text.clone(),
                missing,
            })
        }
    }
}

impl TryFrom<String> for ResourceTemplate {
    type Error = TemplateError;
    fn try_from(text: String) -> Result<Self, Self::Error> {
        Self::parse(&text)
    }
}

impl From<ResourceTemplate> for String {
    fn from(template: ResourceTemplate) -> Self {
        template.text
    }
}

impl std::fmt::Display for ResourceTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// The admission policy a plugin suggests for its submissions (the WIT's
/// `policy`); the controller's `AdmissionPolicy` is built from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DefaultPolicy {
    /// Wait in the slot's FIFO queue.
    #[default]
    Queue,
    /// Stop the current owner and go next.
    Replace,
    /// Give up when the slot is busy.
    DropIfRunning,
}

impl std::fmt::Display for DefaultPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Queue => "queue",
            Self::Replace => "replace",
            Self::DropIfRunning => "drop-if-running",
        })
    }
}

/// A capability a plugin declares it needs.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Capability {
    /// Read access to this guest directory.
    ReadDir(String),
    /// Read/write access to this guest directory.
    WriteDir(String),
    /// This environment variable.
    Env(String),
    /// Outbound HTTP, covered by any `--allow-http` grant ([`Sandbox::http`](super::Sandbox::http)).
    Network,
}

impl std::fmt::Display for Capability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::ReadDir(p) => write!(f, "read-dir {p}"),
            Self::WriteDir(p) => write!(f, "write-dir {p}"),
            Self::Env(n) => write!(f, "env {n}"),
            Self::Network => f.write_str("network"),
        }
    }
}

/// What a plugin says about itself, validated.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PluginInfo {
    /// Short name.
    pub name: String,
    /// The plugin's version.
    pub version: String,
    /// One line for people.
    pub description: String,
    /// The resource template it acts on, if any.
    pub resource: Option<ResourceTemplate>,
    /// Its default admission policy.
    pub default_policy: DefaultPolicy,
    /// What it needs granted.
    pub capabilities: Vec<Capability>,
    /// How many of its tasks may own one slot at once, if it declared it
    /// (`taskhost:plugin/slots`, since WIT 0.1.2); an operator's rule wins.
    #[serde(default)]
    pub capacity: Option<u32>,
    /// Which kind of component it is: a task plugin of our world, or a
    /// WASI command run as a task.
    #[serde(default)]
    pub kind: ComponentKind,
}

/// Which kind of component a plugin is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ComponentKind {
    /// A task plugin: exports `describe` and `run` of our WIT package.
    #[default]
    Plugin,
    /// A WASI command (exports `wasi:cli/run`): arguments from the
    /// submission, standard input from its input, standard output as the
    /// task's output, standard error as its log, exit code 0 completed.
    Command,
}

impl std::fmt::Display for ComponentKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Plugin => "task plugin",
            Self::Command => "WASI command",
        })
    }
}

impl From<types::Policy> for DefaultPolicy {
    fn from(policy: types::Policy) -> Self {
        match policy {
            types::Policy::Queue => Self::Queue,
            types::Policy::Replace => Self::Replace,
            types::Policy::DropIfRunning => Self::DropIfRunning,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn fills_placeholders() {
        let t = ResourceTemplate::parse("deploy/{env}/{region}").unwrap();
        assert_eq!(
            t.params().into_iter().collect::<Vec<_>>(),
            ["env", "region"]
        );
        let slot = t.fill(&params(&[
            ("env", "prod"),
            ("region", "eu"),
            ("env", "dev"),
        ]));
        assert_eq!(slot.unwrap(), "deploy/dev/eu");
    }

    #[test]
    fn names_every_missing_param() {
        let t = ResourceTemplate::parse("{a}-{b}-{a}").unwrap();
        let err = t.fill(&[]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the plugin's resource `{a}-{b}-{a}` needs param `a` and param `b`; \
             pass --param a=VALUE and --param b=VALUE (or choose a slot with --slot)"
        );
    }

    #[test]
    fn rejects_malformed_templates() {
        for bad in ["", "a}", "{a", "{}", "{a b}", "{{a}}"] {
            assert!(ResourceTemplate::parse(bad).is_err(), "{bad:?}");
        }
        assert!(ResourceTemplate::parse("plain").is_ok());
    }
}
