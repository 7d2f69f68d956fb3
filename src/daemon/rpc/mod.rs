//! The gRPC faces of the daemon's services, and the one place domain errors become statuses.

pub mod files;
pub mod service;
pub mod status;
