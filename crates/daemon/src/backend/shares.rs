//! Owns a cluster node's fair share of its claims between namespaces:
//! each one's pass, stride scheduling over the tasks this node claimed of
//! it.

use crate::backend::daemon::Daemon;
use crate::store::postgres::{ClaimShare, Claimed};
use crate::wire::protocol::Quota;

/// How many claims a namespace with no ready work may bank, in its own
/// strides: one that comes back takes at most about this many before the
/// others' turn.
const BANK: f64 = 8.0;

/// This node's fair share of its claims between namespaces: each one's
/// pass (stride scheduling over the tasks this node claimed of it), so
/// that a claim takes from the namespaces with ready work in proportion
/// to their weights. Each node keeps its own: each is fair, so their sum
/// is.
#[derive(Default)]
pub(super) struct ClaimShares {
    passes: std::collections::HashMap<String, f64>,
    /// The highest pass a claim reached.
    top: f64,
}

impl ClaimShares {
    /// Every namespace the node knows, with its pass, stride and cap of
    /// claimed tasks (the default one's name is '').
    pub(super) fn order(&mut self, daemon: &Daemon) -> Vec<ClaimShare> {
        let all = daemon.namespaces.all();
        let key =
            |ns: &crate::service::namespace::Ns| ns.share().as_deref().unwrap_or("").to_owned();
        self.passes
            .retain(|name, _| all.iter().any(|(ns, _)| key(ns) == *name));
        all.iter()
            .map(|(ns, settings)| {
                let stride = 1.0 / f64::from(settings.weight.max(1));
                let floor = (self.top - BANK * stride).max(0.0);
                let pass = *self.passes.entry(key(ns)).or_insert(floor);
                ClaimShare {
                    ns: key(ns),
                    pass,
                    stride,
                    max_running: settings.limit(Quota::Running),
                }
            })
            .collect()
    }

    /// Counts what a claim took of each namespace.
    pub(super) fn took(&mut self, order: &[ClaimShare], claimed: &[Claimed]) {
        for task in claimed {
            let name = task.request.namespace.as_deref().unwrap_or("");
            if let Some(share) = order.iter().find(|o| o.ns == name) {
                let pass = self.passes.entry(name.to_owned()).or_insert(0.0);
                *pass += share.stride;
                self.top = self.top.max(*pass);
            }
        }
        // Time without ready work earns no burst later.
        for share in order {
            if let Some(pass) = self.passes.get_mut(&share.ns) {
                *pass = pass.max(self.top - BANK * share.stride);
            }
        }
    }
}
