//! Owns the per-attempt caps on what a guest holds in the host process
//! besides its linear memory ([`GuestLimits`]): WASI resource handles, open
//! file and directory descriptors, outbound HTTP requests in flight, and the
//! bytes of one set of header fields; their defaults; the wrapper of
//! `wasi:filesystem/types.[method]descriptor.open-at` that enforces the
//! open-files cap (wasmtime-wasi has no hook for it), and which a recorded
//! or replayed attempt's reads through its grants go through
//! (`record::files`); and the note that names the cap an attempt hit and
//! the flag that raises it.
//!
//! How each cap is enforced and what the guest sees:
//!
//! - handles: the attempt's `ResourceTable` refuses a handle past
//!   `max_handles` (`ResourceTable::set_max_capacity`); wasmtime-wasi turns
//!   that into a trap, so the attempt fails, its reason naming the cap.
//! - open files: every open of a file or directory (`open-at`) past
//!   `max_open_files` fails with the WASI error code `quota` (WASI has no
//!   "too many open files"), and the task's log says which cap refused it.
//!   Each open file is also one handle, so `max_handles` bounds it too.
//! - HTTP requests in flight: `http::HttpHooks` refuses a request past
//!   `max_http_requests` with `connection-limit-reached`.
//! - header bytes: wasmtime-wasi-http's field size limit
//!   (`WasiHttpCtx::set_field_size_limit`), per set of fields; past it the
//!   guest traps. One attempt's header fields therefore hold at most
//!   `max_handles` × `max_header_bytes` of host memory.

#![forbid(unsafe_code)]

use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, Resource, ResourceTable, ResourceTableError};
use wasmtime_wasi::WasiView;
use wasmtime_wasi::filesystem::WasiFilesystemView;
use wasmtime_wasi::p2::bindings::filesystem::types::{
    Descriptor, DescriptorFlags, ErrorCode, HostDescriptor, OpenFlags, PathFlags,
};

use taskhost_core::logline::LogLevel;
use taskhost_core::units::format_size;

/// The default of [`GuestLimits::max_handles`].
pub const DEFAULT_MAX_HANDLES: usize = 4096;
/// The default of [`GuestLimits::max_open_files`].
pub const DEFAULT_MAX_OPEN_FILES: usize = 256;
/// The default of [`GuestLimits::max_http_requests`].
pub const DEFAULT_MAX_HTTP_REQUESTS: usize = 16;
/// The default of [`GuestLimits::max_header_bytes`].
pub const DEFAULT_MAX_HEADER_BYTES: usize = 32 << 10;

/// The interface whose `open-at` the open-files cap wraps, as wasmtime-wasi
/// 48 links it (its WIT is WASI 0.2.12; a guest importing an older 0.2
/// release is served by the same instance).
pub(crate) const FILESYSTEM_TYPES: &str = "wasi:filesystem/types@0.2.12";

/// What one attempt's guest may hold in the host at once, besides its
/// memory (which is [`Sandbox::max_memory`](super::Sandbox::max_memory)).
/// Start from the default and change what you need:
///
/// ```
/// use taskhost_runtime::{GuestLimits, RuntimeConfig};
///
/// let mut limits = GuestLimits::default();
/// limits.max_open_files = 64;
/// let config = RuntimeConfig::default().guest_limits(limits);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct GuestLimits {
    /// WASI resource handles (open files and directories, streams,
    /// pollables, HTTP requests, responses and header sets) alive at once
    /// [default: [`DEFAULT_MAX_HANDLES`]].
    pub max_handles: usize,
    /// Open file and directory descriptors, each a descriptor of the host
    /// process, preopened directories included; at most `max_handles` in
    /// effect [default: [`DEFAULT_MAX_OPEN_FILES`]].
    pub max_open_files: usize,
    /// Outbound HTTP requests in flight (from `handle` until the response,
    /// its body and its connection are gone) [default:
    /// [`DEFAULT_MAX_HTTP_REQUESTS`]].
    pub max_http_requests: usize,
    /// Bytes of one set of header fields as wasmtime-wasi-http counts them
    /// (names and values plus their in-memory size) [default:
    /// [`DEFAULT_MAX_HEADER_BYTES`]].
    pub max_header_bytes: usize,
}

impl Default for GuestLimits {
    fn default() -> Self {
        Self {
            max_handles: DEFAULT_MAX_HANDLES,
            max_open_files: DEFAULT_MAX_OPEN_FILES,
            max_http_requests: DEFAULT_MAX_HTTP_REQUESTS,
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
        }
    }
}

/// A [`GuestLimits`] value that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// A cap of zero would fail every guest at its start.
    #[error("{setting} must be at least 1")]
    Zero {
        /// The setting, as its TOML key.
        setting: &'static str,
    },
}

impl GuestLimits {
    /// Refuses a cap of zero, naming it.
    pub fn check(&self) -> Result<(), LimitError> {
        for (setting, value) in [
            ("max_handles", self.max_handles),
            ("max_open_files", self.max_open_files),
            ("max_http_requests", self.max_http_requests),
            ("max_header_bytes", self.max_header_bytes),
        ] {
            if value == 0 {
                return Err(LimitError::Zero { setting });
            }
        }
        Ok(())
    }
}

/// Which caps one attempt has hit, for its failure reason.
#[derive(Debug)]
pub(crate) struct LimitHits {
    limits: GuestLimits,
    /// An `open-at` was refused by the open-files cap.
    open_files: bool,
}

impl LimitHits {
    pub(crate) fn new(limits: GuestLimits) -> Self {
        Self {
            limits,
            open_files: false,
        }
    }

    /// The note naming every cap this attempt hit and the flag raising it:
    /// `table` (at or over its capacity, or `err` saying it was full),
    /// the open-files cap, the HTTP cap (`http_refused`) and the header
    /// cap (`err` saying a set of fields grew past it).
    pub(crate) fn note(
        &self,
        table: &mut ResourceTable,
        http_refused: bool,
        err: Option<&wasmtime::Error>,
    ) -> Option<String> {
        let limits = &self.limits;
        let mut notes = Vec::new();
        let table_full = err.is_some_and(|e| {
            e.downcast_ref::<ResourceTableError>()
                .is_some_and(|e| matches!(e, ResourceTableError::Full))
        }) || table.iter_mut().count() >= limits.max_handles;
        if table_full {
            notes.push(format!(
                "the guest hit its limit of {} WASI handles per attempt (open files, streams, \
                 pollables, HTTP requests and header sets; raise it with --max-handles)",
                limits.max_handles
            ));
        }
        if self.open_files {
            notes.push(open_files_note(limits.max_open_files));
        }
        if http_refused {
            notes.push(format!(
                "the guest hit its limit of {} outbound HTTP requests in flight per attempt \
                 (raise it with --max-http-requests)",
                limits.max_http_requests
            ));
        }
        let fields_full = err.is_some_and(|e| {
            e.downcast_ref::<wasmtime_wasi_http::FieldMapError>()
                .is_some_and(|e| {
                    matches!(
                        e,
                        wasmtime_wasi_http::FieldMapError::TotalSizeTooBig
                            | wasmtime_wasi_http::FieldMapError::TooManyFields
                    )
                })
        });
        if fields_full {
            notes.push(format!(
                "the guest hit its limit of {} per set of HTTP header fields \
                 (raise it with --max-header-bytes)",
                format_size(limits.max_header_bytes as u64)
            ));
        }
        (!notes.is_empty()).then(|| notes.join("; "))
    }
}

fn open_files_note(max: usize) -> String {
    format!(
        "the guest hit its limit of {max} open files per attempt (raise it with --max-open-files)"
    )
}

/// Open file and directory descriptors in `table`.
fn open_descriptors(table: &mut ResourceTable) -> usize {
    table
        .iter_mut()
        .filter(|entry| entry.downcast_ref::<Descriptor>().is_some())
        .count()
}

/// The store data the open-files cap works on (an attempt's,
/// `attempt::AttemptState`): its WASI context and resource table, the caps
/// it has hit, and its task's log.
pub(crate) trait Limited: WasiView + 'static {
    /// The caps this attempt runs under and which it has hit.
    fn limit_hits(&mut self) -> &mut LimitHits;
    /// A line in the task's log, as if the guest had logged it.
    fn log(&self, level: LogLevel, message: &str);
    /// The tape of reads through the directory grants, if the attempt is
    /// recorded or replayed (`record::files`).
    fn file_tape(&self) -> Option<std::sync::Arc<crate::record::files::FileTape>>;
}

/// Replaces wasmtime-wasi's `open-at` (linked by `add_to_linker_async`
/// before this) with one that first counts the attempt's open descriptors:
/// at the cap it returns `quota` and says so in the task's log (once per
/// attempt); below it, it calls wasmtime-wasi's own implementation.
pub(crate) fn wrap_open_at<T: Limited>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let mut types = linker.instance(FILESYSTEM_TYPES)?;
    types.func_wrap_async(
        "[method]descriptor.open-at",
        |mut store: StoreContextMut<'_, T>,
         (dir, path_flags, path, open_flags, flags): (
            Resource<Descriptor>,
            PathFlags,
            String,
            OpenFlags,
            DescriptorFlags,
        )| {
            Box::new(async move {
                let state = store.data_mut();
                let max = state.limit_hits().limits.max_open_files;
                if open_descriptors(state.ctx().table) >= max {
                    if !std::mem::replace(&mut state.limit_hits().open_files, true) {
                        state.log(
                            LogLevel::Warn,
                            &format!(
                                "opening `{path}` refused: {}",
                                open_files_note(max).replacen(
                                    "the guest hit",
                                    "the guest is at",
                                    1
                                )
                            ),
                        );
                    }
                    return Ok((Err(ErrorCode::Quota),));
                }
                // Recorded or replayed: where the open lies, if it reads.
                let taped = state.file_tape().and_then(|tape| {
                    let table = state.ctx().table;
                    let base = table.get(&dir).ok()?;
                    let at = tape.locate(base, &path, open_flags, flags)?;
                    Some((tape, at))
                });
                if let Some((tape, at)) = &taped
                    && let Err(code) = tape.before(at)
                {
                    return Ok((Err(code),));
                }
                let mut view = state.filesystem();
                let opened = match HostDescriptor::open_at(
                    &mut view, dir, path_flags, path, open_flags, flags,
                )
                .await
                {
                    Ok(opened) => Ok(opened),
                    Err(err) => Err(err.downcast()?),
                };
                if let Some((tape, at)) = &taped {
                    let table = state.ctx().table;
                    match &opened {
                        Ok(fd) => {
                            if let Ok(descriptor) = table.get(fd) {
                                tape.after(at, Ok(descriptor));
                            }
                        }
                        Err(code) => tape.after(at, Err(code)),
                    }
                }
                Ok((opened,))
            })
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_sane_and_zero_is_refused() {
        let limits = GuestLimits::default();
        assert!(limits.check().is_ok());
        assert!(limits.max_open_files <= limits.max_handles);
        let mut zero = limits;
        zero.max_http_requests = 0;
        assert_eq!(
            zero.check().unwrap_err().to_string(),
            "max_http_requests must be at least 1"
        );
    }

    #[test]
    fn the_note_names_each_cap_hit_and_its_flag() {
        let limits = GuestLimits {
            max_handles: 2,
            ..GuestLimits::default()
        };
        let mut hits = LimitHits::new(limits);
        let mut table = ResourceTable::new();
        assert_eq!(hits.note(&mut table, false, None), None);
        hits.open_files = true;
        let note = hits.note(&mut table, true, None).unwrap();
        assert!(note.contains("limit of 256 open files"), "{note}");
        assert!(note.contains("--max-open-files"), "{note}");
        assert!(
            note.contains("16 outbound HTTP requests in flight"),
            "{note}"
        );
        let full = wasmtime::Error::from(ResourceTableError::Full);
        let note = LimitHits::new(limits)
            .note(&mut table, false, Some(&full))
            .unwrap();
        assert!(
            note.starts_with("the guest hit its limit of 2 WASI handles per attempt"),
            "{note}"
        );
        assert!(note.ends_with("raise it with --max-handles)"), "{note}");
        let fields = wasmtime::Error::from(wasmtime_wasi_http::FieldMapError::TotalSizeTooBig)
            .context("appending a header");
        let note = LimitHits::new(limits)
            .note(&mut table, false, Some(&fields))
            .unwrap();
        assert!(
            note.contains("32KiB per set of HTTP header fields"),
            "{note}"
        );
        assert!(note.contains("--max-header-bytes"), "{note}");
    }
}
