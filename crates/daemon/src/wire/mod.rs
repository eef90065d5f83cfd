//! The wire: what a client and the daemon say to each other, and where the
//! socket is. Nothing here knows the daemon's state.
//!
//! | file | owns |
//! |---|---|
//! | `protocol/` | message types grouped by verb, version handshake, framing and its limits |
//! | `client` | the client: pipelined requests, replies routed by id |
//! | `remote` | the client's transport to a daemon's HTTP listener: TLS, token, upgrade |
//! | `socket` | socket paths and owner-only permissions, the client's checks |
//! | `tls` | the remote client's TLS: the CAs or pinned certificate of `--ca-file`, the fix a refusal names |
//! | `token_file` | a token in a file: one word, a file only its owner may read |

pub(crate) mod client;
pub mod protocol;
pub mod remote;
pub mod socket;
mod tls;
pub(crate) mod token_file;
