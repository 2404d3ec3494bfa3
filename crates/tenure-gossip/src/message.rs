//! What workers and clients say to each other: one JSON object per broker message.

use serde::{Deserialize, Serialize};

/// The protocol version every message carries; messages of other versions are ignored.
pub(crate) const VERSION: u8 = 1;

/// One message on the group's channel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Envelope {
    /// Protocol version ([`VERSION`]).
    pub v: u8,
    /// The sender's id (`hostname.pid` by default).
    pub from: String,
    /// A number drawn at random when the sender started: tells apart two processes that
    /// claim the same id, and a restarted process from its former self.
    pub incarnation: u64,
    /// The sender's Lamport clock when it sent this message.
    pub clock: u64,
    /// What the message says.
    #[serde(flatten)]
    pub body: Body,
}

/// The kinds of message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub(crate) enum Body {
    /// A worker joins: every member answers with a heartbeat, so the newcomer can move its
    /// clock past theirs.
    Hello,
    /// A client (not a member) asks every member for a heartbeat.
    Probe,
    /// A member is alive.
    Heartbeat,
    /// A member leaves the group for good (it has answered every election it saw).
    Leave,
    /// Someone asks the group to elect one worker to run `action` under `topic`.
    Elect(Request),
    /// A worker stands in an election (the "worker-elect" event); its envelope's clock is its
    /// bid. `handles` says whether it has a handler for the topic.
    Candidate { request: Request, handles: bool },
    /// A worker answers an election without standing (it is joining or leaving).
    Abstain { request: Request },
    /// What came of an election, from its winner (or, if nobody could run it, from the
    /// worker the rule ranks first).
    Outcome(Outcome),
}

/// An election request, repeated in every answer so that a worker that hears an answer
/// before the request itself still knows the whole election.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Request {
    /// The election id (an election name: at most one run per id).
    pub id: String,
    /// The topic, which picks the handler.
    pub topic: String,
    /// The action's text, given to the handler.
    pub action: String,
}

/// What came of an election.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// The election id.
    pub id: String,
    /// The worker that won, if any worker could run the topic.
    pub winner: Option<String>,
    /// Whether the winner started the action.
    pub started: bool,
    /// Why the action was not started.
    pub error: Option<String>,
    /// This election id had already been decided: the outcome is the earlier one's.
    #[serde(default)]
    pub repeat: bool,
}

impl Envelope {
    pub(crate) fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("messages always serialize")
    }

    /// Parses a message; `None` for anything that is not a message of this version.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Self> {
        let env: Envelope = serde_json::from_slice(bytes).ok()?;
        (env.v == VERSION).then_some(env)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_foreign_ones_are_ignored() {
        let env = Envelope {
            v: VERSION,
            from: "web-1.42".into(),
            incarnation: 7,
            clock: 12,
            body: Body::Candidate {
                request: Request { id: "nightly".into(), topic: "command".into(), action: "true".into() },
                handles: true,
            },
        };
        let bytes = env.encode();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.contains(r#""type":"candidate""#), "{text}");
        assert_eq!(Envelope::decode(&bytes), Some(env.clone()));
        assert_eq!(Envelope::decode(b"not json"), None);
        let other_version = text.replace(r#""v":1"#, r#""v":2"#);
        assert_eq!(Envelope::decode(other_version.as_bytes()), None);
    }
}
