//! The confined processes that run calls: the worker pool, the path resolver helper, the
//! orphans a dead worker leaves, the workers' own log lines, and each user's budget of starts.

pub mod orphans;
pub mod pool;
pub mod resolver;
pub(crate) mod start_rate;
pub(crate) mod worker_log;
