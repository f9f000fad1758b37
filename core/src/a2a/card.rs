//! The Agent Card served at `/.well-known/agent-card.json`.

use serde::Serialize;
use serde_json::Value;

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AgentCard {
    pub(crate) capabilities: AgentCapabilities,
    pub(crate) default_input_modes: Vec<String>,
    pub(crate) default_output_modes: Vec<String>,
    pub(crate) description: String,
    /// `agent.documentation_url`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) documentation_url: Option<String>,
    /// `agent.icon_url`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) icon_url: Option<String>,
    pub(crate) name: String,
    /// `[agent.provider]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) provider: Option<AgentProvider>,
    /// The schemes this listener enforces, by name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) security_requirements: Option<Vec<Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) security_schemes: Option<serde_json::Map<String, Value>>,
    pub(crate) skills: Vec<AgentSkill>,
    pub(crate) supported_interfaces: Vec<AgentInterface>,
    pub(crate) version: String,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AgentInterface {
    pub(crate) protocol_binding: String,
    pub(crate) protocol_version: String,
    pub(crate) url: String,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AgentCapabilities {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) extended_agent_card: Option<bool>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) extensions: Vec<AgentExtension>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) push_notifications: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) streaming: Option<bool>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AgentExtension {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub(crate) description: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) params: Option<Value>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) required: bool,
    pub(crate) uri: String,
}

/// The card's `provider`: who runs the agent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AgentProvider {
    /// The provider's organization, by name.
    pub organization: String,
    /// The provider's website or documentation.
    pub url: String,
}

/// One of the card's `skills`: something the agent can do, as a host declares it
/// (`HostCapabilities::skills`).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentSkill {
    /// What the skill does, for a reader choosing an agent.
    pub description: String,
    /// Example prompts that use it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub examples: Vec<String>,
    /// Unique among the card's skills.
    pub id: String,
    /// The media types the skill takes, when they differ from the card's defaults.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub input_modes: Vec<String>,
    /// A short human-readable name.
    pub name: String,
    /// The media types the skill answers with, when they differ from the card's defaults.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub output_modes: Vec<String>,
    /// Keywords for discovery.
    pub tags: Vec<String>,
}
