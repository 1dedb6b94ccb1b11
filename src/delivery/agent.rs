//! The in-sandbox agents the gateway ships (`agent/`, DESIGN §6): loaded
//! once from the agent directory, one static binary per architecture, each
//! known by its sha256, and the transport setting that decides whether
//! deliveries try them.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use bytes::Bytes;
use sha2::{Digest, Sha256};

/// The architectures agents are built for, as `uname -m` names them after
/// the launcher's mapping (`amd64` → `x86_64`, `arm64` → `aarch64`).
pub const AGENT_ARCHES: &[&str] = &["x86_64", "aarch64"];

/// The file name of the agent for `arch` in the agent directory.
pub fn agent_file_name(arch: &str) -> String {
    format!("context-agent-{arch}")
}

/// Largest agent accepted (they are about 1 MiB).
const MAX_AGENT_BYTES: u64 = 64 << 20;

/// How deliveries reach a sandbox.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Transport {
    /// The agent where one is available for the sandbox's architecture
    /// and can run there; the script otherwise.
    #[default]
    Auto,
    /// Like `auto`, but the gateway refuses to start without an agent.
    Exec,
    /// Always the script.
    Script,
}

impl FromStr for Transport {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Transport::Auto),
            "exec" => Ok(Transport::Exec),
            "script" => Ok(Transport::Script),
            other => Err(format!(
                "delivery transport {other:?}: use auto, exec or script"
            )),
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Transport::Auto => "auto",
            Transport::Exec => "exec",
            Transport::Script => "script",
        })
    }
}

/// One agent binary.
#[derive(Clone)]
pub struct Agent {
    /// `x86_64` or `aarch64`.
    pub arch: String,
    /// sha256 of the binary, lowercase hex.
    pub sha256: String,
    /// The binary.
    pub bytes: Bytes,
}

impl fmt::Debug for Agent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Agent")
            .field("arch", &self.arch)
            .field("sha256", &self.sha256)
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

/// The agents found in the agent directory (possibly none).
#[derive(Debug, Clone, Default)]
pub struct AgentSet {
    agents: Vec<Agent>,
}

/// Why the agent directory could not be used.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// An agent file exists but cannot be read.
    #[error("reading the delivery agent {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// An agent file is empty or implausibly large.
    #[error("the delivery agent {path} has {bytes} bytes; expected 1 byte to 64 MiB")]
    Size {
        /// The file.
        path: PathBuf,
        /// Its size.
        bytes: u64,
    },
}

impl AgentSet {
    /// Loads `context-agent-<arch>` for every known arch that exists in
    /// `dir` (a missing file is no error: that arch falls back to the
    /// script; a missing directory holds none).
    pub fn load(dir: &Path) -> Result<Self, AgentError> {
        let mut agents = Vec::new();
        for arch in AGENT_ARCHES {
            let path = dir.join(agent_file_name(arch));
            let bytes = match std::fs::read(&path) {
                Ok(b) => b,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(source) => return Err(AgentError::Read { path, source }),
            };
            let len = bytes.len() as u64;
            if len == 0 || len > MAX_AGENT_BYTES {
                return Err(AgentError::Size { path, bytes: len });
            }
            agents.push(Agent {
                arch: (*arch).to_owned(),
                sha256: hex::encode(Sha256::digest(&bytes)),
                bytes: Bytes::from(bytes),
            });
        }
        Ok(Self { agents })
    }

    /// The agent for `arch`, if any.
    pub fn get(&self, arch: &str) -> Option<&Agent> {
        self.agents.iter().find(|a| a.arch == arch)
    }

    /// Whether there is no agent at all.
    pub fn is_empty(&self) -> bool {
        self.agents.is_empty()
    }

    /// Every agent, in [`AGENT_ARCHES`] order.
    pub fn agents(&self) -> &[Agent] {
        &self.agents
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_what_exists_and_names_it_by_its_digest() {
        let dir = tempfile::tempdir().unwrap();
        assert!(AgentSet::load(dir.path()).unwrap().is_empty());
        assert!(AgentSet::load(&dir.path().join("missing"))
            .unwrap()
            .is_empty());
        std::fs::write(dir.path().join("context-agent-aarch64"), b"arm").unwrap();
        let set = AgentSet::load(dir.path()).unwrap();
        assert!(set.get("x86_64").is_none());
        let a = set.get("aarch64").unwrap();
        assert_eq!(a.sha256, hex::encode(Sha256::digest(b"arm")));
        std::fs::write(dir.path().join("context-agent-x86_64"), b"").unwrap();
        assert!(matches!(
            AgentSet::load(dir.path()),
            Err(AgentError::Size { bytes: 0, .. })
        ));
    }

    #[test]
    fn transport_words() {
        for t in [Transport::Auto, Transport::Exec, Transport::Script] {
            assert_eq!(t.to_string().parse::<Transport>(), Ok(t));
        }
        assert!("pull".parse::<Transport>().is_err());
    }
}
