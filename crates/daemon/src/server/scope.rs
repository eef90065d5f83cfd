//! Owns what a credential allows: the three scopes a token of the HTTP
//! listener carries, the namespaces it reaches, and the scope each request
//! of the protocol needs. The owner-only Unix socket is `Admin` of every
//! namespace; a connection upgraded from HTTP has its token's scope and
//! namespace, checked for every request it sends.

use crate::service::namespace::Ns;
pub use crate::service::namespace::Reach;
use crate::wire::protocol::{
    DeploymentVerb, KvVerb, NamespaceVerb, Request, ScheduleVerb, SlotRuleVerb,
};

/// What a connection or an HTTP request may do: its scope, in the
/// namespaces it reaches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    /// What it may do.
    pub scope: Scope,
    /// Where.
    pub reach: Reach,
}

impl Credential {
    /// The socket owner's: everything, everywhere.
    pub fn operator() -> Credential {
        Credential {
            scope: Scope::Admin,
            reach: Reach::Every,
        }
    }

    /// Whether it reaches `ns`.
    pub fn reaches(&self, ns: &Ns) -> bool {
        self.reach.reaches(ns)
    }

    /// The namespace it acts in unless told otherwise.
    pub fn home(&self) -> Ns {
        match &self.reach {
            Reach::Every => Ns::default(),
            Reach::One(own) => own.clone(),
        }
    }

    /// Why it may not send `request`, if it may not: its scope is too
    /// small, or the request is the operator's (it changes what every
    /// namespace shares) and the credential reaches only one namespace.
    pub fn refusal(&self, request: &Request) -> Option<String> {
        let needed = Scope::needed(request);
        if needed > self.scope {
            return Some(self.scope.refusal(needed));
        }
        let operators = matches!(
            request,
            Request::Shutdown { .. }
                | Request::RemovePlugins { .. }
                | Request::Namespace(
                    NamespaceVerb::Add(..) | NamespaceVerb::Set(..) | NamespaceVerb::Remove(_)
                )
        );
        if operators && self.reach != Reach::Every {
            return Some(
                "this is the operator's: it needs a token of every namespace (a `admin TOKEN *` \
                 line in the daemon's --http-token-file) or the daemon's socket"
                    .to_owned(),
            );
        }
        None
    }
}

/// What a token lets its bearer do; each scope includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// Lists, task pages, logs, events, plugins, slots, metrics, version.
    Read,
    /// `Read`, and upload, submit, wait and rerun.
    Submit,
    /// Everything: cancel, remove, plugin removal and shutdown too.
    Admin,
}

impl Scope {
    /// Its name in a token file.
    pub fn name(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Submit => "submit",
            Scope::Admin => "admin",
        }
    }

    /// The scope a token file names.
    pub fn parse(word: &str) -> Option<Scope> {
        match word {
            "read" => Some(Scope::Read),
            "submit" => Some(Scope::Submit),
            "admin" => Some(Scope::Admin),
            _ => None,
        }
    }

    /// The scope `request` needs.
    pub fn needed(request: &Request) -> Scope {
        match request {
            Request::HasPlugin(_)
            | Request::Download { .. }
            | Request::List { .. }
            | Request::Page(_)
            | Request::Slots
            | Request::Events { .. }
            | Request::Logs { .. }
            | Request::Record { .. }
            | Request::Plugins
            | Request::Enter(_)
            | Request::Namespace(NamespaceVerb::List)
            | Request::Deployment(DeploymentVerb::List | DeploymentVerb::History(_)) => Scope::Read,
            Request::Upload { .. }
            | Request::Submit(_)
            | Request::SubmitBatch(_)
            | Request::RerunMatching { .. }
            | Request::Wait(_)
            | Request::Rerun(_) => Scope::Submit,
            Request::Schedule(ScheduleVerb::List) | Request::SlotRule(SlotRuleVerb::List) => {
                Scope::Read
            }
            Request::Kv(KvVerb::List(_) | KvVerb::Get(..)) => Scope::Read,
            Request::Kv(KvVerb::Remove(..)) => Scope::Admin,
            Request::Schedule(ScheduleVerb::Add(_) | ScheduleVerb::Run(_)) => Scope::Submit,
            Request::Cancel { .. }
            | Request::CancelMatching { .. }
            | Request::Shutdown { .. }
            | Request::RemovePlugins { .. }
            | Request::SlotRule(SlotRuleVerb::Set(_) | SlotRuleVerb::Unset(_))
            | Request::Namespace(_)
            | Request::Deployment(_)
            | Request::Schedule(
                ScheduleVerb::Remove(_) | ScheduleVerb::Pause(_) | ScheduleVerb::Resume(_),
            ) => Scope::Admin,
        }
    }

    /// The refusal of a request that needs `needed`, naming the fix.
    pub fn refusal(self, needed: Scope) -> String {
        format!(
            "this token's scope is {}, and this needs {}: use a token with scope {} \
             (a `{} TOKEN` line in the daemon's --http-token-file)",
            self.name(),
            needed.name(),
            needed.name(),
            needed.name()
        )
    }
}
