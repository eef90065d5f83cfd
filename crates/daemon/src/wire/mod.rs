//! The wire: what a client and the daemon say to each other, and where the
//! socket is. Nothing here knows the daemon's state.
//!
//! | file | owns |
//! |---|---|
//! | `protocol` | message types, version handshake, framing limits |
//! | `client` | the client: pipelined requests, replies routed by id |
//! | `socket` | socket paths and owner-only permissions, the client's checks |

pub(crate) mod client;
pub mod protocol;
pub mod socket;
