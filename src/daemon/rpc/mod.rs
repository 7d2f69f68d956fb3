//! The gRPC faces of the daemon's services, and the one place domain errors become statuses.
//! Each face takes a request through the pipeline (`daemon::pipeline`) and answers.

mod bridge;
pub mod files;
mod processes;
mod sessions;
pub mod status;
mod tools;
