//! What the daemon is and offers: `corral health`, `corral capabilities`, `corral tools`.
//! Readable text by default, JSON under `--json`.

use super::cli::{Common, Failure, FormatArg, ShellToolArg};
use super::connect::Connection;
use crate::api::{self, bridge_client::BridgeClient, sessions_client::SessionsClient};
use serde_json::json;

/// `corral health`: the health service's status; layers not in force on stderr.
pub(super) async fn health(common: &Common, channel: Connection) -> Result<i32, Failure> {
    let mut client = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let resp = client
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await?
        .into_inner();
    let status = tonic_health::pb::health_check_response::ServingStatus::try_from(resp.status)
        .map(|s| s.as_str_name().to_string())
        .unwrap_or_else(|_| resp.status.to_string());
    // grpc.health.v1 carries no reason: the layers that are not in force say what is missing
    // and how to fix the host.
    let problems = match capabilities_of(&channel).await {
        Ok(caps) => layer_problems(&caps),
        Err(_) => Vec::new(),
    };
    if common.json {
        println!("{}", json!({ "status": status, "problems": problems }));
    } else {
        println!("{status}");
        for problem in &problems {
            eprintln!("{problem}");
        }
    }
    Ok(if status == "SERVING" { 0 } else { 1 })
}

async fn capabilities_of(channel: &Connection) -> Result<api::GetCapabilitiesResponse, Failure> {
    Ok(SessionsClient::new(channel.clone())
        .get_capabilities(api::GetCapabilitiesRequest {})
        .await?
        .into_inner())
}

/// `{layer} (unavailable|degraded): {detail}` for each sandbox layer the daemon does not
/// enforce.
fn layer_problems(caps: &api::GetCapabilitiesResponse) -> Vec<String> {
    caps.layers
        .iter()
        .filter_map(|l| {
            let state = match api::LayerStatus::try_from(l.status) {
                Ok(api::LayerStatus::Unavailable) => "unavailable",
                Ok(api::LayerStatus::Degraded) => "degraded",
                _ => return None,
            };
            Some(format!("{} ({state}): {}", l.name, l.detail))
        })
        .collect()
}

/// A layer status as people read it: `enforced`, `not applicable`, …
fn status_words(status: i32) -> &'static str {
    match api::LayerStatus::try_from(status) {
        Ok(api::LayerStatus::Enforced) => "enforced",
        Ok(api::LayerStatus::Degraded) => "DEGRADED",
        Ok(api::LayerStatus::Unavailable) => "UNAVAILABLE",
        Ok(api::LayerStatus::NotApplicable) => "not applicable",
        _ => "unknown",
    }
}

/// `corral capabilities`: every field the daemon sends, as a summary or as JSON.
pub(super) async fn capabilities(common: &Common, channel: Connection) -> Result<i32, Failure> {
    let caps = capabilities_of(&channel).await?;
    if common.json {
        let layers: Vec<_> = caps
            .layers
            .iter()
            .map(|l| {
                json!({
                    "name": l.name,
                    "status": api::LayerStatus::try_from(l.status).map(|s| s.as_str_name()).unwrap_or("?"),
                    "detail": l.detail,
                })
            })
            .collect();
        let value = json!({
            "api_version": caps.api_version,
            "server_version": caps.server_version,
            "tools": caps.tools,
            "default_session_tools": caps.default_session_tools,
            "landlock_abi": caps.landlock_abi,
            "layers": layers,
            "profiles": caps.profiles,
            "session_idle_timeout_seconds": caps.session_idle_timeout_seconds,
            "max_sessions": caps.max_sessions,
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&value).unwrap_or_default()
        );
        return Ok(0);
    }
    let mut text = format!("corral {} ({})\n", caps.server_version, caps.api_version);
    text.push_str(&format!(
        "  tools:     a new session offers {}\n",
        caps.default_session_tools.join(", ")
    ));
    text.push_str(
        "             (its shell tool may be shell_command, shell or none instead: OpenSession's \
         shell_tool)\n",
    );
    text.push_str(&format!("  profiles:  {}\n", caps.profiles.join(", ")));
    text.push_str(&format!(
        "  sessions:  at most {} open; idle ones close after {} s\n",
        caps.max_sessions, caps.session_idle_timeout_seconds
    ));
    text.push_str(&format!(
        "  landlock:  {}\n",
        match caps.landlock_abi {
            0 => "unavailable".to_string(),
            abi => format!("ABI {abi}"),
        }
    ));
    text.push_str("  layers:\n");
    let width = caps.layers.iter().map(|l| l.name.len()).max().unwrap_or(0);
    for l in &caps.layers {
        text.push_str(&format!(
            "    {:<width$}  {:<14}  {}\n",
            l.name,
            status_words(l.status),
            l.detail
        ));
    }
    print!("{text}");
    Ok(0)
}

/// `corral tools`: the model-facing definitions a new session (or the given one) offers.
pub(super) async fn tools(
    common: &Common,
    channel: Connection,
    format: FormatArg,
    session: Option<String>,
    shell_tool: ShellToolArg,
) -> Result<i32, Failure> {
    let shell_tool = match shell_tool {
        ShellToolArg::UnifiedExec => api::ShellTool::UnifiedExec,
        ShellToolArg::ShellCommand => api::ShellTool::ShellCommand,
        ShellToolArg::Shell => api::ShellTool::Shell,
        ShellToolArg::None => api::ShellTool::None,
    };
    let format = match format {
        FormatArg::Responses => api::ToolFormat::Responses,
        FormatArg::Chat => api::ToolFormat::ChatCompletions,
    };
    let resp = BridgeClient::new(channel)
        .max_decoding_message_size(super::MAX_MESSAGE_BYTES)
        .list_tools(api::ListToolsRequest {
            format: format as i32,
            session_id: session.unwrap_or_default(),
            shell_tool: shell_tool as i32,
            ..Default::default()
        })
        .await?
        .into_inner();
    if common.json {
        println!("{}", resp.tools_json);
    } else {
        let value: serde_json::Value =
            serde_json::from_str(&resp.tools_json).map_err(|e| e.to_string())?;
        println!(
            "{}",
            serde_json::to_string_pretty(&value).unwrap_or_default()
        );
    }
    Ok(0)
}
