//! Owns plugin uploads on one connection: chunks arrive in order (the
//! connection handles its requests in the order they were sent), are
//! appended to the upload of their digest, and the whole plugin is checked
//! against its digest when it is stored (off the async workers: hashing a
//! large plugin takes milliseconds). At most [`MAX_UPLOADS`]
//! uploads per connection are open at once, and none grows past the plugin
//! size limit.

use std::collections::HashMap;

use taskhost_runtime::{Digest, MAX_PLUGIN_BYTES};

/// Plugin uploads one connection may have open at once.
pub const MAX_UPLOADS: usize = 2;

/// The open uploads of one connection.
#[derive(Debug, Default)]
pub(crate) struct Uploads {
    open: HashMap<Digest, Vec<u8>>,
}

impl Uploads {
    /// Adds a chunk to the upload of `digest`; returns the whole plugin once
    /// `last` arrives (not yet checked against the digest).
    pub(crate) fn take(
        &mut self,
        digest: Digest,
        offset: u64,
        data: Vec<u8>,
        last: bool,
    ) -> Result<Option<Vec<u8>>, String> {
        if !self.open.contains_key(&digest) && self.open.len() >= MAX_UPLOADS {
            return Err(format!(
                "too many uploads in flight on this connection (at most {MAX_UPLOADS})"
            ));
        }
        let buf = self.open.entry(digest).or_default();
        if offset != buf.len() as u64 {
            let had = buf.len();
            self.open.remove(&digest);
            return Err(format!(
                "upload chunk at offset {offset} does not continue the {had} bytes received; start the upload again"
            ));
        }
        if buf.len() + data.len() > MAX_PLUGIN_BYTES {
            self.open.remove(&digest);
            return Err(format!(
                "the plugin is over the limit of {}",
                taskhost_core::units::format_size(MAX_PLUGIN_BYTES as u64)
            ));
        }
        buf.extend_from_slice(&data);
        if !last {
            return Ok(None);
        }
        Ok(self.open.remove(&digest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_in_order_make_the_plugin_and_a_gap_restarts() {
        let plugin = b"\0asm\x0d\0\x01\0 and more".to_vec();
        let digest = Digest::of(&plugin);
        let mut uploads = Uploads::default();
        assert_eq!(
            uploads.take(digest, 0, plugin[..5].to_vec(), false),
            Ok(None)
        );
        assert!(uploads.take(digest, 9, plugin[9..].to_vec(), true).is_err());
        assert_eq!(
            uploads.take(digest, 0, plugin[..5].to_vec(), false),
            Ok(None)
        );
        assert_eq!(
            uploads.take(digest, 5, plugin[5..].to_vec(), true),
            Ok(Some(plugin))
        );
    }
}
