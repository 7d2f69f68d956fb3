//! What a session owns: its entry in the session table, its long-lived processes, the
//! environment its commands start from, and the running-command slots of its owner.

pub mod environment;
pub mod processes;
pub mod sessions;
pub mod slots;
