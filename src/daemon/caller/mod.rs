//! Who is calling and what they may do: the peer's identity (Unix credentials, or TLS/token on
//! TCP), whether the peer is itself sandboxed, and the operator's rules for that user.

pub mod auth;
pub mod identity;
pub mod peer;
pub mod rules;
