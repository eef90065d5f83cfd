//! Owns how a reply looks to a connection that acts in a namespace: every
//! name, slot, schedule and bucket it carries shown as the connection's
//! [`View`] shows keys (its own objects' names bare, another namespace's
//! as `namespace/name` to an operator's `--all-namespaces`), and the
//! messages likewise. The backend has already left out what the view does
//! not see; this only renames.

use std::sync::Arc;

use taskhost_core::supervisor::{Event, EventKind, TaskReport};

use crate::service::namespace::View;
use crate::wire::protocol::Reply;

/// `reply` as `view` shows it.
pub(crate) fn reply(view: &View, reply: Reply) -> Reply {
    match reply {
        Reply::Submitted(mut submitted) => {
            submitted.name = view.show(&submitted.name);
            submitted.slot = view.show(&submitted.slot);
            Reply::Submitted(submitted)
        }
        Reply::Report(report) => Reply::Report(self::report(view, report)),
        Reply::Canceled { claimed, report } => Reply::Canceled {
            claimed,
            report: report.map(|r| self::report(view, r)),
        },
        Reply::Tasks(mut rows) => {
            for row in &mut rows {
                row.name = view.show(&row.name);
                row.slot = view.show(&row.slot);
            }
            Reply::Tasks(rows)
        }
        Reply::Slots(mut slots) => {
            for slot in &mut slots {
                slot.key = view.show(&slot.key);
            }
            Reply::Slots(slots)
        }
        Reply::Event(event) => Reply::Event(self::event(view, event)),
        Reply::Error { kind, message } => Reply::Error {
            kind,
            message: view.text(&message),
        },
        Reply::Schedules(mut rows) => {
            for row in &mut rows {
                schedule(view, row);
            }
            Reply::Schedules(rows)
        }
        Reply::Schedule(mut row) => {
            schedule(view, &mut row);
            Reply::Schedule(row)
        }
        Reply::KvRows(mut rows) => {
            for row in &mut rows {
                row.name = view.text(&row.name);
            }
            Reply::KvRows(rows)
        }
        Reply::SlotRules(mut rows) => {
            for row in &mut rows {
                row.pattern = view.show(&row.pattern);
            }
            Reply::SlotRules(rows)
        }
        Reply::SlotRule(mut row) => {
            row.pattern = view.show(&row.pattern);
            Reply::SlotRule(row)
        }
        other => other,
    }
}

/// A report as `view` shows it.
pub(crate) fn report(view: &View, mut report: TaskReport) -> TaskReport {
    report.name = Arc::from(view.show(&report.name));
    report.slot = Arc::from(view.show(&report.slot));
    report
}

/// An event as `view` shows it.
pub(crate) fn event(view: &View, mut event: Event) -> Event {
    let show = |key: &Option<Arc<str>>| key.as_deref().map(|k| Arc::from(view.show(k)));
    event.name = show(&event.name);
    event.slot = show(&event.slot);
    event.schedule = show(&event.schedule);
    // A guest's line is its own text.
    if let Some(reason) = &event.reason
        && event.kind != EventKind::GuestLog
    {
        event.reason = Some(view.text(reason));
    }
    if let Some(detail) = &event.detail {
        event.detail = Some(view.text(detail));
    }
    event
}

fn schedule(view: &View, row: &mut crate::wire::protocol::ScheduleRow) {
    row.name = view.show(&row.name);
    if let Some(slot) = &row.slot {
        row.slot = Some(view.show(slot));
    }
}
