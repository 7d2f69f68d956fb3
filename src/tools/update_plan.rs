//! `update_plan` (spec/tools.md §8; `codex-rs/core/src/tools/handlers/plan.rs`): the model
//! records its plan; the tool only checks the arguments' shape and answers `Plan updated`. The
//! plan itself is for the client, which reads it from the call's arguments.

use crate::tools::ToolError;
use serde::Deserialize;

/// The model text of every successful call.
pub const PLAN_UPDATED: &str = "Plan updated";

/// A step's status (`codex-rs/protocol/src/plan_tool.rs`, `StepStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    Pending,
    InProgress,
    Completed,
}

/// One plan item. Codex rejects unknown keys here (`deny_unknown_fields`), unlike the other
/// tools' arguments.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanItem {
    pub step: String,
    pub status: StepStatus,
}

/// The arguments (`UpdatePlanArgs`). "At most one step in_progress" is not enforced, as in Codex.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdatePlanArgs {
    #[serde(default)]
    pub explanation: Option<String>,
    pub plan: Vec<PlanItem>,
}

/// Parses the call's JSON arguments: `failed to parse function arguments: {serde error}`.
pub fn parse(arguments: &str) -> Result<UpdatePlanArgs, ToolError> {
    crate::tools::parse_arguments(arguments)
}

/// Runs the tool: the model text on success.
pub fn update_plan(arguments: &str) -> Result<String, ToolError> {
    parse(arguments)?;
    Ok(PLAN_UPDATED.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_plan_is_updated() {
        let args = r#"{"explanation":"why","plan":[{"step":"a","status":"in_progress"},{"step":"b","status":"pending"},{"step":"c","status":"completed"}]}"#;
        assert_eq!(update_plan(args).unwrap(), "Plan updated");
        let parsed = parse(args).unwrap();
        assert_eq!(parsed.explanation.as_deref(), Some("why"));
        assert_eq!(parsed.plan[0].status, StepStatus::InProgress);
        // Several in_progress steps are accepted, as in Codex.
        let two =
            r#"{"plan":[{"step":"a","status":"in_progress"},{"step":"b","status":"in_progress"}]}"#;
        assert_eq!(update_plan(two).unwrap(), "Plan updated");
        assert_eq!(update_plan(r#"{"plan":[]}"#).unwrap(), "Plan updated");
    }

    #[test]
    fn parse_errors_are_codex_texts() {
        let err = update_plan(r#"{"plan":[{"step":"a","status":"done"}]}"#).unwrap_err();
        assert_eq!(
            err.message,
            "failed to parse function arguments: unknown variant `done`, expected one of \
             `pending`, `in_progress`, `completed` at line 1 column 36"
        );
        let err = update_plan(r#"{"explanation":"x"}"#).unwrap_err();
        assert_eq!(
            err.message,
            "failed to parse function arguments: missing field `plan` at line 1 column 19"
        );
        let err = update_plan(r#"{"plan":[{"step":"a"}]}"#).unwrap_err();
        assert_eq!(
            err.message,
            "failed to parse function arguments: missing field `status` at line 1 column 21"
        );
        let err = update_plan(r#"{"plan":[],"extra":1}"#).unwrap_err();
        assert_eq!(
            err.message,
            "failed to parse function arguments: unknown field `extra`, expected \
             `explanation` or `plan` at line 1 column 18"
        );
        let err = update_plan("not json").unwrap_err();
        assert!(
            err.message
                .starts_with("failed to parse function arguments: expected ident")
        );
    }
}
