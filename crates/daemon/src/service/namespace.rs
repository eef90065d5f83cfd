//! Owns namespaces: how a namespace's objects are told apart from every
//! other's, what a connection sees ([`View`]), and the daemon's namespaces
//! with their weights and quotas ([`Namespaces`]).
//!
//! A namespaced object's key is its namespace's name, the unit separator
//! (U+001F) and its own name: a task's name and slot, an idempotency key,
//! a schedule's name, a bucket's name. The default namespace's keys are
//! the names themselves, so a daemon without namespaces keeps exactly what
//! it kept before. Names may not hold control characters, so no name of one
//! namespace is a key of another. Every lookup a connection makes goes
//! through its namespace's keys: it cannot name another's objects, and
//! every list it gets is filtered to its own.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Instant;

use crate::service::error::ServiceError;
use crate::wire::protocol::{
    DEFAULT_NAMESPACE, NamespaceChange, NamespaceRow, NamespaceSettings, Quota,
};

/// The character between a namespace's name and an object's name in a key.
pub(crate) const SEP: char = taskhost_core::slot_settings::SCOPE_SEPARATOR;

/// A namespace: the default one, or one by name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Ns(Option<Arc<str>>);

impl Ns {
    /// The namespace named `name` (`default` is the default one).
    pub(crate) fn named(name: Option<&str>) -> Ns {
        match name {
            None | Some(DEFAULT_NAMESPACE) => Ns(None),
            Some(name) => Ns(Some(Arc::from(name))),
        }
    }

    /// The namespace of a key.
    pub(crate) fn of(key: &str) -> Ns {
        match key.split_once(SEP) {
            Some((ns, _)) => Ns(Some(Arc::from(ns))),
            None => Ns(None),
        }
    }

    /// Its name (`default` for the default one).
    pub(crate) fn name(&self) -> &str {
        self.0.as_deref().unwrap_or(DEFAULT_NAMESPACE)
    }

    /// Its name as a request keeps it: `None` for the default one.
    pub(crate) fn as_request(&self) -> Option<String> {
        self.0.as_deref().map(str::to_owned)
    }

    /// Whether it is the default namespace.
    pub(crate) fn is_default(&self) -> bool {
        self.0.is_none()
    }

    /// The key of its object `name`.
    pub(crate) fn key(&self, name: &str) -> String {
        match &self.0 {
            None => name.to_owned(),
            Some(ns) => format!("{ns}{SEP}{name}"),
        }
    }

    /// Whether `key` is one of its objects'.
    pub(crate) fn owns(&self, key: &str) -> bool {
        match (&self.0, key.split_once(SEP)) {
            (None, None) => true,
            (Some(ns), Some((prefix, _))) => **ns == *prefix,
            _ => false,
        }
    }

    /// The share group of its tasks (the supervisor's fair share).
    pub(crate) fn share(&self) -> Option<Arc<str>> {
        self.0.clone()
    }
}

/// The name of the object a key holds, without its namespace.
pub(crate) fn bare(key: &str) -> &str {
    key.split_once(SEP).map_or(key, |(_, name)| name)
}

/// Refuses a name that holds a control character (which would let it pass
/// for another namespace's key).
pub(crate) fn check_printable(what: &str, name: &str) -> Result<(), ServiceError> {
    if name.chars().any(char::is_control) {
        return Err(ServiceError::Invalid(format!(
            "the {what} `{}` holds a control character: names are printable text",
            name.escape_debug()
        )));
    }
    Ok(())
}

/// Which namespaces a credential reaches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reach {
    /// Every one (the socket's owner, an operator's token: `*`).
    Every,
    /// This one only (a team's token).
    One(Ns),
}

impl Reach {
    /// Whether it reaches `ns`.
    pub fn reaches(&self, ns: &Ns) -> bool {
        match self {
            Reach::Every => true,
            Reach::One(own) => own == ns,
        }
    }
}

/// What one connection sees and where what it submits goes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct View {
    /// Where it acts: its submissions, and the names it gives.
    pub acting: Ns,
    /// It sees every namespace (an operator's `--all-namespaces`).
    pub all: bool,
}

impl View {
    /// A view of one namespace.
    pub(crate) fn of(ns: Ns) -> View {
        View {
            acting: ns,
            all: false,
        }
    }

    /// Whether the object of `key` is visible.
    pub(crate) fn sees(&self, key: &str) -> bool {
        self.all || self.acting.owns(key)
    }

    /// The key of a name the client gave.
    pub(crate) fn key(&self, name: &str) -> String {
        self.acting.key(name)
    }

    /// A key as the client is shown it: its name in its own namespace;
    /// seeing them all, `namespace/name` for another namespace's.
    pub(crate) fn show(&self, key: &str) -> String {
        match key.split_once(SEP) {
            None => key.to_owned(),
            Some((_, name)) if !self.all => name.to_owned(),
            Some((ns, name)) if self.acting.0.as_deref() == Some(ns) => name.to_owned(),
            Some((ns, name)) => format!("{ns}/{name}"),
        }
    }

    /// A message as the client is shown it: the keys it names shown as
    /// [`View::show`] does.
    pub(crate) fn text(&self, message: &str) -> String {
        let mut sep = [0u8; 4];
        self.text_with(message, SEP.encode_utf8(&mut sep))
    }

    /// [`View::text`] for a text whose separator is written as `sep` (JSON
    /// writes it `\u001f`).
    pub(crate) fn text_with(&self, message: &str, sep: &str) -> String {
        if !message.contains(sep) {
            return message.to_owned();
        }
        let mut out = String::with_capacity(message.len());
        let mut rest = message;
        while let Some(at) = rest.find(sep) {
            let before = &rest[..at];
            // The namespace's name is the run of name characters just
            // before the separator.
            let start = before
                .char_indices()
                .rev()
                .find(|(_, c)| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
                .map_or(0, |(i, c)| i + c.len_utf8());
            out.push_str(&before[..start]);
            let ns = &before[start..];
            let own = self.acting.0.as_deref() == Some(ns);
            if self.all && !own {
                out.push_str(ns);
                out.push('/');
            }
            rest = &rest[at + sep.len()..];
        }
        out.push_str(rest);
        out
    }
}

/// The daemon's namespaces, their settings and the state of their
/// submission rates. The default namespace is always there.
#[derive(Debug)]
pub(crate) struct Namespaces {
    inner: RwLock<BTreeMap<Ns, Arc<Entry>>>,
    /// Each namespace's `max-kv-bytes`, as its guests' buckets hold it.
    kv: Arc<taskhost_runtime::ScopeQuotas>,
}

impl Default for Namespaces {
    fn default() -> Self {
        Self::new(Vec::new())
    }
}

#[derive(Debug)]
struct Entry {
    settings: NamespaceSettings,
    /// The submission rate's bucket: (tokens, when last filled).
    bucket: Mutex<(f64, Instant)>,
}

impl Entry {
    fn new(settings: NamespaceSettings) -> Arc<Entry> {
        let burst = settings.limit(Quota::SubmitRate).unwrap_or(0) as f64;
        Arc::new(Entry {
            settings,
            bucket: Mutex::new((burst, Instant::now())),
        })
    }
}

impl Namespaces {
    /// These namespaces (the default one added if missing).
    pub(crate) fn new(rows: Vec<(String, NamespaceSettings)>) -> Namespaces {
        let mut map = BTreeMap::new();
        map.insert(Ns::default(), Entry::new(NamespaceSettings::default()));
        for (name, settings) in rows {
            map.insert(Ns::named(Some(&name)), Entry::new(settings));
        }
        Namespaces {
            inner: RwLock::new(map),
            kv: Arc::default(),
        }
    }

    /// No namespace but the default one; their `max-kv-bytes` set in `kv`,
    /// the quotas the guests' buckets hold.
    pub(crate) fn with_kv_quotas(kv: Arc<taskhost_runtime::ScopeQuotas>) -> Namespaces {
        Namespaces {
            kv,
            ..Namespaces::default()
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<Ns, Arc<Entry>>> {
        self.inner.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `ns` exists.
    pub(crate) fn exists(&self, ns: &Ns) -> bool {
        self.read().contains_key(ns)
    }

    /// The settings of `ns` (the defaults if it does not exist).
    pub(crate) fn settings(&self, ns: &Ns) -> NamespaceSettings {
        self.read()
            .get(ns)
            .map(|e| e.settings.clone())
            .unwrap_or_default()
    }

    /// Every namespace and its settings.
    pub(crate) fn all(&self) -> Vec<(Ns, NamespaceSettings)> {
        self.read()
            .iter()
            .map(|(ns, e)| (ns.clone(), e.settings.clone()))
            .collect()
    }

    /// The settings `change` makes of `ns`'s (added: of the defaults);
    /// not applied yet (the store keeps them first).
    pub(crate) fn changed(
        &self,
        ns: &Ns,
        change: &NamespaceChange,
        add: bool,
    ) -> Result<NamespaceSettings, ServiceError> {
        let current = self.read().get(ns).map(|e| e.settings.clone());
        let mut settings = match (current, add) {
            (Some(_), true) => {
                return Err(ServiceError::Conflict(format!(
                    "namespace `{}` exists: change it with `host ns set {}`",
                    ns.name(),
                    ns.name()
                )));
            }
            (None, false) => return Err(unknown(ns.name())),
            (Some(settings), false) => settings,
            (None, true) => NamespaceSettings::default(),
        };
        settings.apply(change);
        Ok(settings)
    }

    /// Sets (`Some`) or removes `ns`.
    pub(crate) fn put(&self, ns: Ns, settings: Option<NamespaceSettings>) {
        let scope = ns.share().unwrap_or_default();
        let kv = settings.as_ref().and_then(|s| s.limit(Quota::KvBytes));
        self.kv.set(
            &scope,
            kv.map(|bytes| taskhost_runtime::ScopeQuota {
                bytes,
                refusal: format!(
                    "over namespace `{}`'s quota {} = {bytes}; its operator can raise it \
                     with `host ns set {} --{} SIZE`",
                    ns.name(),
                    Quota::KvBytes.key(),
                    ns.name(),
                    Quota::KvBytes.key()
                ),
            }),
        );
        let mut map = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        match settings {
            Some(settings) => {
                map.insert(ns, Entry::new(settings));
            }
            None => {
                map.remove(&ns);
            }
        }
    }

    /// Takes one submission of `ns` from its rate; refused over its
    /// `max-submit-rate`.
    pub(crate) fn take_submission(&self, ns: &Ns) -> Result<(), ServiceError> {
        let Some(entry) = self.read().get(ns).cloned() else {
            return Err(unknown(ns.name()));
        };
        let Some(rate) = entry.settings.limit(Quota::SubmitRate) else {
            return Ok(());
        };
        let mut bucket = entry.bucket.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        let (tokens, at) = *bucket;
        let filled =
            (tokens + now.duration_since(at).as_secs_f64() * rate as f64).min(rate.max(1) as f64);
        if filled < 1.0 {
            *bucket = (filled, now);
            return Err(over_quota(
                ns,
                Quota::SubmitRate,
                rate,
                "submissions per second",
            ));
        }
        *bucket = (filled - 1.0, now);
        Ok(())
    }

    /// The row `host ns ls` shows of `ns`, with its use.
    pub(crate) fn row(
        ns: &Ns,
        settings: NamespaceSettings,
        usage: Vec<(Quota, u64)>,
    ) -> NamespaceRow {
        NamespaceRow {
            name: ns.name().to_owned(),
            settings,
            usage,
        }
    }
}

/// The answer about a namespace that does not exist, or that the
/// connection's credential does not reach (the same words).
pub(crate) fn unknown(name: &str) -> ServiceError {
    ServiceError::NotFound(format!("no namespace `{name}` (see `host ns ls`)"))
}

/// The refusal of something over a namespace's quota, naming it and the
/// fix.
pub(crate) fn over_quota(ns: &Ns, quota: Quota, limit: u64, what: &str) -> ServiceError {
    ServiceError::OverQuota(format!(
        "namespace `{}` is at its quota {} = {limit} ({what}); wait, or its operator can \
         raise it with `host ns set {} --{} N`",
        ns.name(),
        quota.key(),
        ns.name(),
        quota.key()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_separate_namespaces_and_the_default_keeps_names() {
        let (alpha, default) = (Ns::named(Some("alpha")), Ns::named(None));
        assert_eq!(default.key("db"), "db");
        assert_eq!(Ns::named(Some("default")), default);
        let key = alpha.key("db");
        assert!(alpha.owns(&key) && !default.owns(&key));
        assert!(default.owns("db") && !alpha.owns("db"));
        assert!(!Ns::named(Some("alph")).owns(&key));
        assert_eq!(Ns::of(&key), alpha);
        assert_eq!(bare(&key), "db");
    }

    #[test]
    fn a_separator_after_a_wide_character_is_shown_without_a_panic() {
        // Found by schemathesis: a task name of the client's own with the
        // separator after a two-byte character.
        let all = View {
            acting: Ns::default(),
            all: true,
        };
        let text = "no task with `\u{c2}\u{ec}\u{b0}.\u{8e}\u{83}\u{1f}x`";
        assert_eq!(
            all.text(text),
            "no task with `\u{c2}\u{ec}\u{b0}.\u{8e}\u{83}/x`"
        );
        assert_eq!(all.text_with("\u{e9}\\u001fx", "\\u001f"), "\u{e9}/x");
    }

    #[test]
    fn a_view_shows_its_own_names_bare_and_others_with_their_namespace() {
        let alpha = View::of(Ns::named(Some("alpha")));
        let key = Ns::named(Some("alpha")).key("db");
        assert_eq!(alpha.show(&key), "db");
        assert_eq!(
            alpha.text(&format!("slot `{key}` is busy")),
            "slot `db` is busy"
        );
        let all = View {
            acting: Ns::default(),
            all: true,
        };
        assert_eq!(all.show(&key), "alpha/db");
        assert_eq!(all.show("db"), "db");
        assert_eq!(
            all.text(&format!("name {key} taken")),
            "name alpha/db taken"
        );
    }

    #[test]
    fn the_submission_rate_is_a_refusal_naming_the_quota() {
        let namespaces = Namespaces::new(vec![(
            "alpha".into(),
            NamespaceSettings {
                weight: 1,
                quotas: vec![(Quota::SubmitRate, 2)],
                secrets: Vec::new(),
            },
        )]);
        let alpha = Ns::named(Some("alpha"));
        assert!(namespaces.take_submission(&alpha).is_ok());
        assert!(namespaces.take_submission(&alpha).is_ok());
        let refused = namespaces.take_submission(&alpha).unwrap_err().to_string();
        assert!(refused.contains("max-submit-rate = 2"), "{refused}");
        assert!(namespaces.take_submission(&Ns::default()).is_ok());
    }
}
