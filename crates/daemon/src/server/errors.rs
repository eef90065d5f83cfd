//! Owns the one place a service's error becomes the wire's: its kind and
//! its message, for the socket's `Error` frame and the HTTP API's status.

use crate::service::error::ServiceError;
use crate::wire::protocol::ErrorKind;

impl From<ServiceError> for (ErrorKind, String) {
    fn from(error: ServiceError) -> Self {
        let kind = match &error {
            ServiceError::Invalid(_) => ErrorKind::Invalid,
            ServiceError::NotFound(_) => ErrorKind::NotFound,
            ServiceError::Conflict(_) => ErrorKind::Conflict,
            ServiceError::Unavailable(_) => ErrorKind::ShuttingDown,
            ServiceError::OverQuota(_) => ErrorKind::OverQuota,
            ServiceError::Store(_) | ServiceError::Internal(_) => ErrorKind::Internal,
        };
        (kind, error.to_string())
    }
}
