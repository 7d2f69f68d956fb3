//! The daemon's side of a proxied session's network (NETWORK_MODE_PROXY): the operator's
//! `[egress]` settings, each session's proxy (its rules, its decisions into the audit log), and
//! the proxy's listener, placed on the loopback of the session's sandbox — in the worker's own
//! network namespace — every time a worker for the session starts. The proxy itself is
//! `crate::egress`; it runs here, outside the sandbox.

use crate::daemon::error::CallError;
use crate::egress::addresses::{Addresses, Net};
use crate::egress::proxy::{Limits, Proxy};
use crate::egress::resolve::{OverrideResolver, Resolver, SystemResolver};
use crate::egress::rules::{DomainRule, Rules};
use crate::sync::LockExt;
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

/// The port of the proxy's listener on a proxied sandbox's loopback (the one TCP connect its
/// Landlock ruleset allows). The namespace is the sandbox's own, so no host port is taken.
pub const PROXY_PORT: u16 = 3128;

/// The operator's `[egress]` table.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressConfig {
    /// Private ranges (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7) may be reached.
    #[serde(default)]
    pub allow_private: bool,
    /// Networks that may be reached although they are otherwise never (a LAN registry, a
    /// loopback test server), in CIDR notation. corral's own listeners stay unreachable.
    #[serde(default)]
    pub allowed_networks: Vec<String>,
    /// Names the proxy answers without DNS (pinned internal names; tests).
    #[serde(default)]
    pub hosts: BTreeMap<String, Vec<IpAddr>>,
    /// The most a session may allow: when set, each of a session's allow rules must let
    /// through nothing these do not (`*.pypi.org` permits `files.pypi.org`, not `pypi.org`;
    /// a permitted rule with ports permits only rules with some of those ports).
    #[serde(default)]
    pub permitted_domains: Vec<String>,
}

/// What every session's proxy shares: the operator's address rules, corral's own listeners
/// (never reachable) and the resolver.
#[derive(Clone)]
pub struct EgressSettings {
    allow_private: bool,
    allowed_networks: Vec<Net>,
    /// The operator's bound on sessions' allow rules (`None`: no bound).
    permitted: Option<Arc<Vec<DomainRule>>>,
    listeners: Arc<Mutex<Vec<SocketAddr>>>,
    resolver: Arc<dyn Resolver>,
}

impl EgressConfig {
    /// Checks the table (at start-up, naming the key) and builds the shared settings.
    pub fn settings(&self) -> Result<EgressSettings, String> {
        let nets = self
            .allowed_networks
            .iter()
            .map(|n| {
                n.parse()
                    .map_err(|e| format!("egress.allowed_networks: {e}"))
            })
            .collect::<Result<Vec<_>, String>>()?;
        let resolver: Arc<dyn Resolver> = if self.hosts.is_empty() {
            Arc::new(SystemResolver)
        } else {
            let map: HashMap<String, Vec<IpAddr>> = self.hosts.clone().into_iter().collect();
            Arc::new(OverrideResolver::new(map, Some(SystemResolver)))
        };
        let permitted = self
            .permitted_domains
            .iter()
            .map(|d| {
                DomainRule::parse("permitted", d)
                    .map_err(|e| format!("egress.permitted_domains: {e}"))
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(EgressSettings {
            allow_private: self.allow_private,
            allowed_networks: nets,
            permitted: (!permitted.is_empty()).then(|| Arc::new(permitted)),
            listeners: Arc::default(),
            resolver,
        })
    }
}

/// Every proxied session's proxy, by session id: a worker started for the session (its first,
/// or one replacing a worker that died) finds its proxy here.
static PROXIES: Mutex<BTreeMap<String, Arc<Proxy>>> = Mutex::new(BTreeMap::new());

/// A session's proxy, registered until this is dropped (the session closed, or failed to open).
pub struct Registration {
    session: String,
    proxy: Arc<Proxy>,
    /// The rules in force, as the client wrote them (for the prompt context's `<network>`).
    written: Mutex<crate::wire::NetworkRules>,
    /// The latest decisions, for GetEgressLog.
    log: Arc<Mutex<Log>>,
}

/// How many decisions a session keeps for GetEgressLog.
const LOG_KEPT: usize = 1000;

#[derive(Default)]
struct Log {
    decisions: std::collections::VecDeque<crate::api::EgressDecision>,
    dropped: u64,
}

impl Registration {
    /// New rules for the proxy's next connections.
    pub fn replace(&self, rules: Rules, allowed: &[String], denied: &[String]) {
        // One lock over both: a reader never sees the lists of one change with the rules of
        // another.
        let mut written = self.written.locked();
        self.proxy.set_rules(rules);
        *written = crate::wire::NetworkRules {
            allowed: allowed.to_vec(),
            denied: denied.to_vec(),
        };
    }

    /// The rules in force, as written.
    pub fn written(&self) -> crate::wire::NetworkRules {
        self.written.locked().clone()
    }

    /// The latest decisions, oldest first, and how many older ones were let go.
    pub fn log(&self) -> crate::api::GetEgressLogResponse {
        let log = self.log.locked();
        crate::api::GetEgressLogResponse {
            decisions: log.decisions.iter().cloned().collect(),
            dropped: log.dropped,
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        PROXIES.locked().remove(&self.session);
    }
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Registration({})", self.session)
    }
}

impl EgressSettings {
    /// Refuses rules that allow more than the operator permits, naming the first such allow
    /// rule (its index in the session's list).
    pub fn check_bound(&self, rules: &Rules) -> Result<(), CallError> {
        let Some(permitted) = &self.permitted else {
            return Ok(());
        };
        match rules.first_outside(permitted) {
            None => Ok(()),
            Some((at, rule)) => Err(CallError::InvalidField {
                field: format!("allow_domains[{at}]"),
                message: format!(
                    "allow rule `{rule}` lets through more than this daemon's operator permits \
                     (egress.permitted_domains: {}); narrow it to one of those",
                    permitted
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }),
        }
    }

    /// One of corral's own listeners (gRPC over TCP, health, metrics): no proxy connects to it,
    /// whatever a name resolves to or the operator's networks allow.
    pub fn add_listener(&self, addr: SocketAddr) {
        self.listeners.locked().push(addr);
    }

    /// A proxy for session `session` with `rules` (written as `allowed` and `denied`); its
    /// decisions go to `on_decision`.
    pub fn register(
        &self,
        session: &str,
        (rules, allowed, denied): (Rules, &[String], &[String]),
        on_decision: crate::egress::DecisionSink,
    ) -> Registration {
        // The host's own addresses are read now: an interface that came up since start-up is
        // covered too.
        let addresses = Addresses::new(
            self.allow_private,
            &self.allowed_networks,
            self.listeners.locked().clone(),
        );
        let log: Arc<Mutex<Log>> = Arc::default();
        let kept = log.clone();
        let record: crate::egress::DecisionSink = Arc::new(move |d: crate::egress::Decision| {
            {
                let mut log = kept.locked();
                if log.decisions.len() == LOG_KEPT {
                    log.decisions.pop_front();
                    log.dropped += 1;
                }
                log.decisions.push_back(entry_of(&d));
            }
            on_decision(d);
        });
        let proxy = Arc::new(Proxy::new(
            rules,
            addresses,
            self.resolver.clone(),
            Limits::default(),
            record,
        ));
        PROXIES.locked().insert(session.to_string(), proxy.clone());
        Registration {
            session: session.to_string(),
            proxy,
            written: Mutex::new(crate::wire::NetworkRules {
                allowed: allowed.to_vec(),
                denied: denied.to_vec(),
            }),
            log,
        }
    }
}

/// A decision as GetEgressLog gives it.
fn entry_of(d: &crate::egress::Decision) -> crate::api::EgressDecision {
    crate::api::EgressDecision {
        time_unix_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
        host: d.host.clone(),
        port: u32::from(d.port),
        allowed: d.allowed,
        rule: d.rule.clone(),
        reason: d.reason.clone(),
        address: d.address.map(|a| a.to_string()).unwrap_or_default(),
        bytes_up: d.bytes_up,
        bytes_down: d.bytes_down,
        duration_ms: u64::try_from(d.duration.as_millis()).unwrap_or(u64::MAX),
        method: d.method.to_string(),
    }
}

/// What a proxied session's commands get in their environment: the proxy, for every tool that
/// reads the usual variables (both cases), and loopback left direct (the sandbox's own
/// servers). All name it as an HTTP proxy (`http://`; CONNECT for https). The same port also
/// speaks SOCKS5 for other TCP, to a client pointed at it (`socks5h://127.0.0.1:PORT`, names
/// resolved by the proxy) — but `ALL_PROXY` does not say so: httpx (the OpenAI and Anthropic
/// SDKs) refuses to start with a SOCKS `ALL_PROXY` unless `socksio` is installed.
pub fn proxy_env(port: u16) -> Vec<(String, String)> {
    let url = format!("http://127.0.0.1:{port}");
    let mut env = Vec::new();
    for name in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
        env.push((name.to_string(), url.clone()));
        env.push((name.to_ascii_lowercase(), url.clone()));
    }
    for name in ["NO_PROXY", "no_proxy"] {
        env.push((name.to_string(), "localhost,127.0.0.1,::1".to_string()));
    }
    env
}

/// Places the session's proxy listener on the loopback of worker `pid`'s network namespace and
/// serves it until `ended` (the worker was reaped). Fails closed: without its proxy a proxied
/// sandbox has no network, and the worker is not used.
pub async fn attach(
    pid: u32,
    egress: &crate::sandbox::policy::Egress,
    ended: tokio_util::sync::CancellationToken,
) -> Result<(), CallError> {
    let proxy = PROXIES
        .locked()
        .get(&egress.session)
        .cloned()
        .ok_or_else(|| {
            CallError::Unmet(
                "the session's egress proxy is gone (the session closed); open a new session"
                    .into(),
            )
        })?;
    let port = egress.port;
    let listener =
        tokio::task::spawn_blocking(move || crate::sandbox::namespaces::listen_in_netns(pid, port))
            .await
            .map_err(|e| CallError::Internal(format!("the egress listener task failed: {e}")))?
            .map_err(|e| {
                CallError::Unmet(format!(
                    "the egress proxy could not be placed in the sandbox: {e}; the network stays \
                 off and the session cannot run commands (NETWORK_MODE_PROXY needs corral to run \
                 as root)"
                ))
            })?;
    let listener = tokio::net::TcpListener::from_std(listener)
        .map_err(|e| CallError::Internal(format!("the egress listener: {e}")))?;
    tokio::spawn(proxy.serve(listener, ended));
    Ok(())
}
