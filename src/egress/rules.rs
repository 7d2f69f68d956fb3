//! Which host names a sandbox may reach through the proxy: allow and deny lists of domain
//! rules. A rule is `example.com` (that name only) or `*.example.com` (any name below it, not
//! the apex), optionally followed by `:PORT` or `:PORT,PORT,…`; without ports it matches any
//! port (a rule names a service's host, and the address check still refuses every internal
//! address whatever the port). Deny wins; a name no allow rule matches is refused.
//!
//! Names are compared in ASCII lowercase with one trailing dot removed. Internationalized names
//! must be written in their ASCII (punycode, `xn--…`) form: a rule with other characters is
//! refused rather than converted, so what the rule says is what is compared.

use std::fmt;
use std::net::IpAddr;

/// How many allow rules a refusal lists before "and N more".
const LISTED_RULES: usize = 8;

/// One parsed domain rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomainRule {
    /// Lowercase, no trailing dot; for a wildcard rule, the part after `*.`.
    name: String,
    /// `*.name`: names strictly below `name`.
    subdomains: bool,
    /// Empty: any port.
    ports: Vec<u16>,
}

/// What is wrong with a rule's text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuleProblem {
    Empty,
    Whitespace,
    NonAscii,
    Scheme,
    Path,
    IpLiteral,
    /// The offending label, as written.
    BadLabel(String),
    Wildcard,
    TooBroad,
    /// The offending port text.
    BadPort(String),
}

/// A rule that does not parse: which list it was in, its text, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleError {
    pub list: &'static str,
    pub rule: String,
    pub problem: RuleProblem,
}

impl fmt::Display for RuleProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => write!(f, "the rule is empty"),
            Self::Whitespace => write!(f, "a rule has no spaces or other whitespace"),
            Self::NonAscii => write!(
                f,
                "a rule is written in ASCII; write an internationalized name in its punycode \
                 form (xn--…)"
            ),
            Self::Scheme => write!(
                f,
                "a rule is a host name, without a scheme such as https://"
            ),
            Self::Path => write!(f, "a rule is a host name, without a path"),
            Self::IpLiteral => write!(
                f,
                "an IP address is not a domain rule; use an address rule (allowed networks)"
            ),
            Self::BadLabel(label) => write!(
                f,
                "`{label}` is not a DNS label (1 to 63 of a-z, 0-9, '-', '_', not starting or \
                 ending with '-')"
            ),
            Self::Wildcard => write!(
                f,
                "`*` may only be the whole first label, as in *.example.com"
            ),
            Self::TooBroad => write!(
                f,
                "this wildcard would allow everything or a whole top-level domain; name the \
                 domain, as in *.example.com"
            ),
            Self::BadPort(p) => write!(f, "`{p}` is not a port (1 to 65535)"),
        }
    }
}

impl fmt::Display for RuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} rule `{}`: {}", self.list, self.rule, self.problem)
    }
}

impl std::error::Error for RuleError {}

impl fmt::Display for DomainRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.subdomains {
            write!(f, "*.")?;
        }
        write!(f, "{}", self.name)?;
        for (i, p) in self.ports.iter().enumerate() {
            write!(f, "{}{p}", if i == 0 { ":" } else { "," })?;
        }
        Ok(())
    }
}

impl DomainRule {
    /// Parses one rule; `list` ("allow" or "deny") only names it in the error.
    pub fn parse(list: &'static str, text: &str) -> Result<DomainRule, RuleError> {
        let err = |problem| RuleError {
            list,
            rule: text.to_string(),
            problem,
        };
        if text.is_empty() {
            return Err(err(RuleProblem::Empty));
        }
        if text.chars().any(char::is_whitespace) {
            return Err(err(RuleProblem::Whitespace));
        }
        if !text.is_ascii() {
            return Err(err(RuleProblem::NonAscii));
        }
        if text.contains("://") {
            return Err(err(RuleProblem::Scheme));
        }
        if text.contains('/') {
            return Err(err(RuleProblem::Path));
        }
        // `[::1]`, `::1` and `10.0.0.1` before the port split, which would cut a bare IPv6.
        if text.starts_with('[') || text.parse::<IpAddr>().is_ok() {
            return Err(err(RuleProblem::IpLiteral));
        }
        let (host, ports) = match text.rsplit_once(':') {
            Some((host, ports)) => (host, parse_ports(ports).map_err(err)?),
            None => (text, Vec::new()),
        };
        let host = host.to_ascii_lowercase();
        let host = host.strip_suffix('.').unwrap_or(&host);
        let (name, subdomains) = match host.strip_prefix("*.") {
            Some(rest) => (rest, true),
            None if host == "*" => return Err(err(RuleProblem::TooBroad)),
            None => (host, false),
        };
        if name.contains('*') {
            return Err(err(RuleProblem::Wildcard));
        }
        check_name(name).map_err(err)?;
        // `*.com`: one label after the wildcard is a whole top-level domain.
        if subdomains && !name.contains('.') {
            return Err(err(RuleProblem::TooBroad));
        }
        Ok(DomainRule {
            name: name.to_string(),
            subdomains,
            ports,
        })
    }

    /// Whether every host and port this rule lets through, `outer` lets through too: the bound
    /// an operator's permitted domains set on a session's allow rules.
    pub fn within(&self, outer: &DomainRule) -> bool {
        let below = self
            .name
            .strip_suffix(outer.name.as_str())
            .and_then(|head| head.strip_suffix('.'))
            .is_some_and(|head| !head.is_empty());
        let names = match (self.subdomains, outer.subdomains) {
            // A name inside outer's subdomains is strictly below outer's name (a wildcard
            // never covers its apex); subdomains are inside subdomains of the same name too.
            (false, true) => below,
            (true, true) => below || self.name == outer.name,
            (false, false) => self.name == outer.name,
            // Every subdomain is never inside one exact name.
            (true, false) => false,
        };
        let ports = outer.ports.is_empty()
            || (!self.ports.is_empty() && self.ports.iter().all(|p| outer.ports.contains(p)));
        names && ports
    }

    /// `host` must already be lowercase without a trailing dot.
    fn matches(&self, host: &str, port: u16) -> bool {
        let name_ok = if self.subdomains {
            host.strip_suffix(self.name.as_str())
                .and_then(|head| head.strip_suffix('.'))
                .is_some_and(|head| !head.is_empty())
        } else {
            host == self.name
        };
        name_ok && (self.ports.is_empty() || self.ports.contains(&port))
    }
}

fn parse_ports(text: &str) -> Result<Vec<u16>, RuleProblem> {
    text.split(',')
        .map(|p| match p.parse::<u32>() {
            Ok(n @ 1..=65535) => Ok(n as u16),
            _ => Err(RuleProblem::BadPort(p.to_string())),
        })
        .collect()
}

/// Checks a lowercase name without a trailing dot: DNS labels, and not an IP address in
/// disguise (`10.1` and `0x7f.1` are addresses to `inet_aton`).
fn check_name(name: &str) -> Result<(), RuleProblem> {
    if name.is_empty() {
        return Err(RuleProblem::Empty);
    }
    if looks_like_ip(name) {
        return Err(RuleProblem::IpLiteral);
    }
    for label in name.split('.') {
        let ok = (1..=63).contains(&label.len())
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return Err(RuleProblem::BadLabel(label.to_string()));
        }
    }
    if name.len() > 253 {
        return Err(RuleProblem::BadLabel(name.to_string()));
    }
    Ok(())
}

/// Whether a host (lowercase, no trailing dot) is, or would be read by a resolver as, an IP
/// address: bracketed or containing ':', or a last label that is a number (decimal, or
/// hexadecimal with `0x`) — no top-level domain is numeric.
pub fn looks_like_ip(host: &str) -> bool {
    if host.starts_with('[') || host.contains(':') || host.parse::<IpAddr>().is_ok() {
        return true;
    }
    let last = host.rsplit('.').next().unwrap_or(host);
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let hex = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit());
    digits(last) || last.strip_prefix("0x").is_some_and(hex)
}

/// A rule's verdict on one host and port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub allowed: bool,
    /// The rule that decided, as `allow *.pypi.org` or `deny evil.test`, or `no allow rule`.
    pub rule: String,
}

/// The allow and deny lists of one proxy.
#[derive(Clone, Debug, Default)]
pub struct Rules {
    allow: Vec<DomainRule>,
    deny: Vec<DomainRule>,
}

impl Rules {
    pub fn new(allow: &[String], deny: &[String]) -> Result<Rules, RuleError> {
        let parse = |list, texts: &[String]| {
            texts
                .iter()
                .map(|t| DomainRule::parse(list, t))
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(Rules {
            allow: parse("allow", allow)?,
            deny: parse("deny", deny)?,
        })
    }

    /// The first allow rule (its index and text) that lets through a host or port none of
    /// `permitted` does: what an operator's bound refuses.
    pub fn first_outside(&self, permitted: &[DomainRule]) -> Option<(usize, String)> {
        self.allow
            .iter()
            .enumerate()
            .find(|(_, r)| !permitted.iter().any(|p| r.within(p)))
            .map(|(i, r)| (i, r.to_string()))
    }

    /// Deny rules first: any match refuses. Then the first allow rule that matches.
    pub fn decide(&self, host: &str, port: u16) -> Verdict {
        let host = host.to_ascii_lowercase();
        let host = host.strip_suffix('.').unwrap_or(&host);
        if let Some(rule) = self.deny.iter().find(|r| r.matches(host, port)) {
            return Verdict {
                allowed: false,
                rule: format!("deny {rule}"),
            };
        }
        match self.allow.iter().find(|r| r.matches(host, port)) {
            Some(rule) => Verdict {
                allowed: true,
                rule: format!("allow {rule}"),
            },
            None => Verdict {
                allowed: false,
                rule: "no allow rule".to_string(),
            },
        }
    }

    /// The allow rules, for a refusal's text: `*.pythonhosted.org, pypi.org`, or `none`.
    pub fn allowed_summary(&self) -> String {
        if self.allow.is_empty() {
            return "none".to_string();
        }
        let mut listed: Vec<String> = self
            .allow
            .iter()
            .take(LISTED_RULES)
            .map(ToString::to_string)
            .collect();
        if self.allow.len() > LISTED_RULES {
            listed.push(format!("and {} more", self.allow.len() - LISTED_RULES));
        }
        listed.join(", ")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_rule_is_within_an_operators_bound_only_when_it_lets_nothing_more_through() {
        let r = |t: &str| DomainRule::parse("allow", t).unwrap();
        assert!(r("pypi.org").within(&r("pypi.org")));
        assert!(r("files.pythonhosted.org").within(&r("*.pythonhosted.org")));
        assert!(r("*.a.pythonhosted.org").within(&r("*.pythonhosted.org")));
        assert!(r("*.pythonhosted.org").within(&r("*.pythonhosted.org")));
        assert!(
            !r("pythonhosted.org").within(&r("*.pythonhosted.org")),
            "the apex"
        );
        assert!(!r("*.pythonhosted.org").within(&r("files.pythonhosted.org")));
        assert!(!r("evilpythonhosted.org").within(&r("*.pythonhosted.org")));
        assert!(
            !r("pypi.org").within(&r("pypi.org:443")),
            "any port is wider than 443"
        );
        assert!(r("pypi.org:443").within(&r("pypi.org:443,80")));
        assert!(!r("pypi.org:443,22").within(&r("pypi.org:443,80")));
        assert!(r("pypi.org:443").within(&r("pypi.org")));
    }

    use super::*;

    fn rules(allow: &[&str], deny: &[&str]) -> Rules {
        let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Rules::new(&own(allow), &own(deny)).expect("valid rules")
    }

    fn problem(text: &str) -> RuleProblem {
        DomainRule::parse("allow", text).expect_err(text).problem
    }

    #[test]
    fn good_rules_parse_to_their_normal_form() {
        for (text, shown) in [
            ("example.com", "example.com"),
            ("Example.COM.", "example.com"),
            ("*.pypi.org", "*.pypi.org"),
            (
                "*.files.pythonhosted.org:443",
                "*.files.pythonhosted.org:443",
            ),
            ("api.example.com:80,8080", "api.example.com:80,8080"),
            ("xn--bcher-kva.example", "xn--bcher-kva.example"),
            ("_acme.example.com", "_acme.example.com"),
            ("localhost", "localhost"),
            ("a-b.c1.io:65535", "a-b.c1.io:65535"),
        ] {
            let rule = DomainRule::parse("allow", text).expect(text);
            assert_eq!(rule.to_string(), shown, "{text}");
        }
    }

    #[test]
    fn every_bad_form_is_refused_with_its_reason() {
        use RuleProblem::*;
        for (text, want) in [
            ("", Empty),
            (":443", Empty),
            (" example.com", Whitespace),
            ("exa mple.com", Whitespace),
            ("example.com\t", Whitespace),
            ("bücher.de", NonAscii),
            ("https://example.com", Scheme),
            ("example.com/simple", Path),
            ("10.0.0.1", IpLiteral),
            ("10.0.0.1:80", IpLiteral),
            ("::1", IpLiteral),
            ("[::1]:443", IpLiteral),
            ("10.1", IpLiteral),
            ("host.0x7f", IpLiteral),
            ("exa$mple.com", BadLabel("exa$mple".into())),
            ("-bad.com", BadLabel("-bad".into())),
            ("a..b", BadLabel(String::new())),
            ("user@example.com", BadLabel("user@example".into())),
            (&format!("{}.com", "a".repeat(64)), BadLabel("a".repeat(64))),
            ("*", TooBroad),
            ("*.", TooBroad),
            ("*.com", TooBroad),
            ("*.com:443", TooBroad),
            ("**.x", Wildcard),
            ("x.*", Wildcard),
            ("a.*.example.com", Wildcard),
            ("*example.com", Wildcard),
            ("example.com:0", BadPort("0".into())),
            ("example.com:65536", BadPort("65536".into())),
            ("example.com:", BadPort(String::new())),
            ("example.com:80,", BadPort(String::new())),
            ("example.com:http", BadPort("http".into())),
        ] {
            assert_eq!(problem(text), want, "{text:?}");
        }
    }

    #[test]
    fn errors_name_the_list_the_rule_and_the_fix() {
        let err = Rules::new(&["ok.com".into()], &["1.2.3.4".into()]).expect_err("IP");
        let text = err.to_string();
        assert!(text.starts_with("deny rule `1.2.3.4`:"), "{text}");
        assert!(text.contains("use an address rule"), "{text}");
        let text = problem("bücher.de").to_string();
        assert!(text.contains("punycode"), "{text}");
    }

    #[test]
    fn a_wildcard_matches_subdomains_but_not_the_apex() {
        let r = rules(&["*.pypi.org"], &[]);
        assert!(r.decide("files.pypi.org", 443).allowed);
        assert!(r.decide("a.b.pypi.org", 443).allowed);
        assert!(!r.decide("pypi.org", 443).allowed);
        assert!(!r.decide("evilpypi.org", 443).allowed);
        assert!(!r.decide("pypi.org.evil.test", 443).allowed);
        assert!(!r.decide(".pypi.org", 443).allowed);
        assert_eq!(r.decide("x.pypi.org", 1).rule, "allow *.pypi.org");
    }

    #[test]
    fn an_exact_rule_matches_only_its_name_in_any_case_and_with_a_trailing_dot() {
        let r = rules(&["PyPI.org"], &[]);
        for host in ["pypi.org", "PYPI.ORG", "pypi.org."] {
            assert!(r.decide(host, 443).allowed, "{host}");
        }
        assert!(!r.decide("www.pypi.org", 443).allowed);
        assert!(!r.decide("pypi.org..", 443).allowed);
    }

    #[test]
    fn ports_limit_a_rule_and_no_port_means_any() {
        let r = rules(&["a.test:443,8443", "b.test"], &[]);
        assert!(r.decide("a.test", 443).allowed);
        assert!(r.decide("a.test", 8443).allowed);
        assert!(!r.decide("a.test", 80).allowed);
        assert!(r.decide("b.test", 22).allowed);
    }

    #[test]
    fn deny_wins_and_nothing_matching_is_denied() {
        let r = rules(
            &["*.example.com"],
            &["secret.example.com", "*.example.com:22"],
        );
        assert_eq!(
            r.decide("www.example.com", 443),
            Verdict {
                allowed: true,
                rule: "allow *.example.com".into()
            }
        );
        assert_eq!(
            r.decide("Secret.example.com", 443),
            Verdict {
                allowed: false,
                rule: "deny secret.example.com".into()
            }
        );
        assert_eq!(
            r.decide("git.example.com", 22).rule,
            "deny *.example.com:22"
        );
        assert_eq!(
            r.decide("other.test", 443),
            Verdict {
                allowed: false,
                rule: "no allow rule".into()
            }
        );
        assert!(!Rules::default().decide("example.com", 443).allowed);
    }

    #[test]
    fn the_summary_lists_allow_rules_and_stops() {
        assert_eq!(Rules::default().allowed_summary(), "none");
        assert_eq!(
            rules(&["*.pythonhosted.org", "pypi.org"], &[]).allowed_summary(),
            "*.pythonhosted.org, pypi.org"
        );
        let many: Vec<String> = (0..10).map(|i| format!("h{i}.test")).collect();
        let summary = Rules::new(&many, &[]).expect("valid").allowed_summary();
        assert!(summary.ends_with("h7.test, and 2 more"), "{summary}");
    }

    #[test]
    fn ip_lookalikes_are_recognised() {
        for host in [
            "1.2.3.4",
            "2130706433",
            "0x7f000001",
            "10.1",
            "[::1]",
            "::1",
            "a.0x1",
        ] {
            assert!(looks_like_ip(host), "{host}");
        }
        for host in ["example.com", "1.2.3.4.example", "0xdead.beef", "x"] {
            assert!(!looks_like_ip(host), "{host}");
        }
    }
}
