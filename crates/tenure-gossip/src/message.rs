//! What workers and clients say to each other: one JSON object per broker message.

use serde::{Deserialize, Serialize};

/// The protocol version every message carries; messages of other versions are ignored.
/// Version 2: answers name their election by id and digest instead of repeating the
/// request, and outcomes carry the election's topic and digest. Version 3: a joining worker
/// defers an election it cannot stand in yet instead of abstaining (see `Body::Defer`),
/// and heartbeats say whether their sender has joined.
pub(crate) const VERSION: u8 = 3;

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
    /// A member is alive; `joined` says whether it stands in elections (it has joined).
    Heartbeat {
        #[serde(default)]
        joined: bool,
    },
    /// A member leaves the group for good (it has answered every election it saw).
    Leave,
    /// Someone asks the group to elect one worker to run `action` under `topic`.
    Elect(Request),
    /// A worker stands in an election (the "worker-elect" event); its envelope's clock is its
    /// bid. `handles` says whether it has a handler for the topic.
    Candidate { election: Ref, handles: bool },
    /// A worker answers an election without standing (it is leaving, or it heard the
    /// request before its own `hello`).
    Abstain { election: Ref },
    /// A joining worker will stand in this election once it has joined: whoever counts it
    /// as a member keeps waiting for its candidacy. Sent only when no member it knows has
    /// joined, so that an election asked while the whole group (re)joins is decided once it
    /// can be instead of being abstained from by everyone.
    Defer { election: Ref },
    /// What came of an election, from its winner (or, if nobody could run it, from the
    /// worker the rule ranks first).
    Outcome(Outcome),
}

/// An election request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Request {
    /// The election id (an election name: at most one run per id).
    pub id: String,
    /// The topic, which picks the handler.
    pub topic: String,
    /// The action's text, given to the handler.
    pub action: String,
}

impl Body {
    /// Whether only a member sends this (requests and probes may come from clients): a
    /// sign that the sender is alive, to the others and to the sender itself when the
    /// broker delivers it back.
    pub(crate) fn is_sign_of_life(&self) -> bool {
        matches!(
            self,
            Body::Hello
                | Body::Heartbeat { .. }
                | Body::Candidate { .. }
                | Body::Abstain { .. }
                | Body::Defer { .. }
                | Body::Outcome(_)
        )
    }
}

impl Request {
    /// The digest of what this request asks for (its topic and action).
    pub fn digest(&self) -> String {
        digest(&self.topic, &self.action)
    }

    /// How answers name this election.
    pub fn reference(&self) -> Ref {
        Ref { id: self.id.clone(), digest: self.digest() }
    }
}

/// How an answer names its election: the id, and the digest of the request it answers,
/// so that an answer to another request under the same id is never counted for this one.
/// An answer alone never opens an election (a late answer for a forgotten id starts
/// nothing).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Ref {
    /// The election id.
    pub id: String,
    /// [`digest`] of the request's topic and action.
    pub digest: String,
}

/// A digest of a topic and an action (64-bit FNV-1a over both, as 16 hex digits): tells
/// two requests under one id apart. It guards against mistakes, not against someone who
/// can publish on the group (who can run commands anyway).
pub(crate) fn digest(topic: &str, action: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in topic.bytes().chain([0u8]).chain(action.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// What came of an election.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// The election id.
    pub id: String,
    /// The election's topic.
    pub topic: String,
    /// The digest of the election's topic and action: an initiator whose own request
    /// under this id has another digest learns that the id was used for something else.
    pub digest: String,
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
                election: Request { id: "nightly".into(), topic: "command".into(), action: "true".into() }.reference(),
                handles: true,
            },
        };
        let bytes = env.encode();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.contains(r#""type":"candidate""#), "{text}");
        assert_eq!(Envelope::decode(&bytes), Some(env.clone()));
        assert_eq!(Envelope::decode(b"not json"), None);
        let other_version = text.replace(r#""v":3"#, r#""v":2"#);
        assert_eq!(Envelope::decode(other_version.as_bytes()), None);
    }

    #[test]
    fn digests_tell_topics_and_actions_apart_and_are_stable() {
        assert_eq!(digest("command", "true"), digest("command", "true"));
        assert_ne!(digest("command", "true"), digest("command", "false"));
        // The separator keeps "ab"+"c" apart from "a"+"bc".
        assert_ne!(digest("ab", "c"), digest("a", "bc"));
        // Fixed, so that workers of any build agree.
        assert_eq!(digest("", ""), "af63bd4c8601b7df");
    }
}

#[cfg(test)]
mod fuzz {
    //! Fuzz target for the messages workers read off the broker: anything anyone publishes
    //! never panics, and a message as written reads back as it was.
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn messages_never_panic(
            raw in prop::collection::vec(any::<u8>(), 0..300),
            text in "\\{\"v\":3,\"from\":\"[a-z]{0,5}\",\"incarnation\":[0-9]{0,21},\"clock\":[0-9]{0,21},\"type\":\"[a-z]{0,10}\"[ -~]{0,40}\\}",
        ) {
            let _ = super::Envelope::decode(&raw);
            if let Some(env) = super::Envelope::decode(text.as_bytes()) {
                prop_assert_eq!(super::Envelope::decode(&env.encode()), Some(env));
            }
        }
    }
}
