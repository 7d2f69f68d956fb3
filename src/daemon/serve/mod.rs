//! The assembly: configuration, the listening socket, the server and its start-up report.

pub mod config;
pub mod listener;
pub mod server;
pub mod startup;
