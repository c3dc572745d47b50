//! What the hook asks of Envoy and of Istio's agent, each one POST: before the wait, failing
//! Envoy's health checks and draining; after it, with --then-quit, stopping the proxy.

/// One request, and where it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Request {
    /// Envoy's `/ready` and health-check filter answer 503 from then on (Envoy's admin
    /// documentation, "POST /healthcheck/fail").
    FailHealthcheck,
    /// Envoy drains its inbound listeners, or all of them, with `skip_exit` (its listeners keep
    /// accepting past its own drain time, for clients that learn late the pod is going) and
    /// always `graceful` (docs/how-it-works.md).
    DrainListeners { all: bool },
    /// pilot-agent's `/drain`: it drains inbound with `skip_exit` and stops the proxy at once on
    /// SIGTERM (istio/istio pkg/envoy/agent.go, DrainNow).
    AgentDrain,
    /// pilot-agent's `/quitquitquit`: it stops Envoy and itself at once.
    Quit,
}

impl Request {
    pub(crate) fn path(self) -> &'static str {
        match self {
            Request::FailHealthcheck => "/healthcheck/fail",
            Request::DrainListeners { all: false } => {
                "/drain_listeners?inboundonly&graceful&skip_exit"
            }
            Request::DrainListeners { all: true } => "/drain_listeners?graceful&skip_exit",
            Request::AgentDrain => "/drain",
            Request::Quit => "/quitquitquit",
        }
    }

    /// Whether it drains listeners, itself or through the agent.
    pub(crate) fn drains(self) -> bool {
        matches!(self, Request::DrainListeners { .. } | Request::AgentDrain)
    }

    /// Whether it goes to Istio's agent rather than to Envoy's admin API.
    pub(crate) fn to_agent(self) -> bool {
        matches!(self, Request::AgentDrain | Request::Quit)
    }
}
