//! The server: the daemon's life (start-up, the accept loop, shutdown), one
//! connection at a time, what each request does, and the HTTP listener. It
//! knows frames and requests; what they mean for tasks is the services'.
//!
//! | file | owns |
//! |---|---|
//! | `listener` | start-up, the accept loop, shutdown |
//! | `connection` | one connection: handshake, requests in order, batched replies |
//! | `dispatch` | what each request does |
//! | `bulk` | requests over many tasks: a batch of submissions, cancel and rerun by filter |
//! | `errors` | a service's error as the wire's kind and message, in one place |
//! | `scope` | what a credential allows (its scope, the namespaces it reaches), and what each request needs |
//! | `view` | a reply as a connection's namespace shows it |
//! | `http/` | the optional HTTP listener: metrics, JSON API, dashboard |

pub(crate) mod bulk;
pub(crate) mod connection;
pub(crate) mod dispatch;
pub(crate) mod errors;
pub(crate) mod http;
pub(crate) mod listener;
pub(crate) mod scope;
pub(crate) mod view;
