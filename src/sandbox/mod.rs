//! Confinement of a worker process: the policy (mode → concrete rules) and one module per
//! layer, each named after what it protects. Knows nothing of tools or gRPC.

pub mod policy;
