//! What a plugin says about itself: [`PluginInfo`], [`Policy`] and [`Capability`].

/// What the host's admission controller does when a new submission targets a
/// slot that another task already owns.
///
/// A submission can override it with `--policy`; this is the default the plugin
/// suggests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Policy {
    /// Wait in the slot's FIFO queue behind the current owner (the default).
    #[default]
    Queue,
    /// Ask the current owner to stop and run next.
    Replace,
    /// Reject the new submission; the current owner and the queue are unchanged.
    DropIfRunning,
}

/// A capability the plugin needs in order to work.
///
/// The host refuses a submission whose grants do not cover every declared
/// capability, with a message that names the missing grant, and
/// `host inspect` lists them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Capability {
    /// Read access to a preopened directory at this guest path
    /// (granted with `--dir HOST::GUEST:ro` or `--dir HOST::GUEST`).
    ReadDir(String),
    /// Read and write access to a preopened directory at this guest path
    /// (granted with `--dir HOST::GUEST`).
    WriteDir(String),
    /// The named environment variable (granted with `--env NAME=VALUE`).
    Env(String),
    /// Outbound HTTP (the `http` feature's requests), granted per host with
    /// `--allow-http HOST[:PORT]`; a submission without any `--allow-http`
    /// is refused, naming the flag.
    Network,
}

/// What a plugin says about itself; returned by [`Task::describe`](crate::Task::describe).
///
/// Build one with [`PluginInfo::new`] and the chaining setters:
///
/// ```
/// use taskhost_guest::{Capability, PluginInfo, Policy};
///
/// let info = PluginInfo::new("deploy", "1.0.0")
///     .description("Deploys the current build to an environment")
///     .resource("deploy/{env}")
///     .default_policy(Policy::Replace)
///     .capability(Capability::Env("DEPLOY_TOKEN".into()));
/// assert_eq!(info.resource.as_deref(), Some("deploy/{env}"));
/// ```
///
/// `describe` must answer quickly and without side effects: the host calls it
/// at load time under a small time and memory limit, and never with a
/// [`Context`](crate::Context).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PluginInfo {
    /// Short machine-friendly name, such as `deploy`. Task names default to
    /// `<name>-<task id>`.
    pub name: String,
    /// The plugin's own version, free-form (semver recommended).
    pub version: String,
    /// One line for humans.
    pub description: String,
    /// The resource the plugin acts on, as a template with `{param}`
    /// placeholders filled from the submission's params, such as
    /// `deploy/{env}`. Two tasks whose resources are equal take turns.
    /// `None`: the task name is the slot.
    pub resource: Option<String>,
    /// The admission policy used when the submission does not choose one.
    pub default_policy: Policy,
    /// Everything the plugin needs granted to work.
    pub capabilities: Vec<Capability>,
    /// How many of its tasks may own one slot at once (`None`: 1); an
    /// operator's `host slot set --capacity` wins. Declared through
    /// `taskhost:plugin/slots` (WIT 0.1.2): a plugin that sets it needs a
    /// host of that version or later.
    pub capacity: Option<u32>,
}

impl PluginInfo {
    /// Starts a description with a name and a version; everything else is
    /// empty: no description, no resource, [`Policy::Queue`], no capabilities.
    pub fn new(name: impl Into<String>, version: impl Into<String>) -> Self {
        PluginInfo {
            name: name.into(),
            version: version.into(),
            description: String::new(),
            resource: None,
            default_policy: Policy::Queue,
            capabilities: Vec::new(),
            capacity: None,
        }
    }

    /// Sets the one-line human description.
    #[must_use]
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.description = description.into();
        self
    }

    /// Sets the resource template, such as `deploy/{env}`.
    #[must_use]
    pub fn resource(mut self, template: impl Into<String>) -> Self {
        self.resource = Some(template.into());
        self
    }

    /// Sets the default admission policy.
    #[must_use]
    pub fn default_policy(mut self, policy: Policy) -> Self {
        self.default_policy = policy;
        self
    }

    /// Lets up to `capacity` of its tasks own one slot at once (1 to
    /// 100,000), unless an operator's rule sets the slot's capacity.
    #[must_use]
    pub fn capacity(mut self, capacity: u32) -> Self {
        self.capacity = Some(capacity);
        self
    }

    /// Adds one required capability.
    #[must_use]
    pub fn capability(mut self, capability: Capability) -> Self {
        self.capabilities.push(capability);
        self
    }

    /// Adds several required capabilities.
    #[must_use]
    pub fn capabilities(mut self, capabilities: impl IntoIterator<Item = Capability>) -> Self {
        self.capabilities.extend(capabilities);
        self
    }
}
