//! The permissions a token can carry.

use std::fmt;

/// A permission a token can carry in its `scope` claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Read sandbox pools.
    PoolsRead,
    /// Create and delete sandbox pools.
    PoolsWrite,
    /// Read named contexts.
    ContextsRead,
    /// Create and delete named contexts.
    ContextsWrite,
    /// Read workloads and download frozen revisions.
    WorkloadsRead,
    /// Create, upload, activate and delete workloads.
    WorkloadsWrite,
    /// Deliver frozen revisions into sandboxes.
    WorkloadsDeliver,
    /// Act for a user through `X-Context-Subject`.
    Delegate,
}

impl Scope {
    /// Every scope, in the order the docs list them.
    pub const ALL: [Scope; 8] = [
        Scope::PoolsRead,
        Scope::PoolsWrite,
        Scope::ContextsRead,
        Scope::ContextsWrite,
        Scope::WorkloadsRead,
        Scope::WorkloadsWrite,
        Scope::WorkloadsDeliver,
        Scope::Delegate,
    ];

    /// The scope's name in a token.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::PoolsRead => "pools:read",
            Scope::PoolsWrite => "pools:write",
            Scope::ContextsRead => "contexts:read",
            Scope::ContextsWrite => "contexts:write",
            Scope::WorkloadsRead => "workloads:read",
            Scope::WorkloadsWrite => "workloads:write",
            Scope::WorkloadsDeliver => "workloads:deliver",
            Scope::Delegate => "delegate",
        }
    }

    /// Every scope a user needs (all but `delegate`), space-separated.
    pub fn user_scopes() -> String {
        Self::ALL
            .iter()
            .filter(|s| **s != Scope::Delegate)
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
