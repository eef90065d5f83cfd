//! Owns what a credential allows: the three scopes a token of the HTTP
//! listener carries, and the scope each request of the protocol needs. The
//! owner-only Unix socket is `Admin`; a connection upgraded from HTTP has
//! its token's scope, checked for every request it sends.

use crate::wire::protocol::{KvVerb, Request, ScheduleVerb, SlotRuleVerb};

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
            | Request::List { .. }
            | Request::Slots
            | Request::Events { .. }
            | Request::Logs { .. }
            | Request::Plugins => Scope::Read,
            Request::Upload { .. } | Request::Submit(_) | Request::Wait(_) | Request::Rerun(_) => {
                Scope::Submit
            }
            Request::Schedule(ScheduleVerb::List) | Request::SlotRule(SlotRuleVerb::List) => {
                Scope::Read
            }
            Request::Kv(KvVerb::List(_) | KvVerb::Get(..)) => Scope::Read,
            Request::Kv(KvVerb::Remove(..)) => Scope::Admin,
            Request::Schedule(ScheduleVerb::Add(_) | ScheduleVerb::Run(_)) => Scope::Submit,
            Request::Cancel { .. }
            | Request::Shutdown { .. }
            | Request::RemovePlugins { .. }
            | Request::SlotRule(SlotRuleVerb::Set(_) | SlotRuleVerb::Unset(_))
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
