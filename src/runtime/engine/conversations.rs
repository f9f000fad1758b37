//! The conversations the runtime keeps: what each principal said under each contextId and
//! what the agent answered, bounded in count and bytes, and the table that finds a turn's
//! conversation and drops the least recently active past the bound.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, VecDeque};

use agentd_core::a2a::piecewise::json_len;
use agentd_core::auth::Principal;
use serde_json::{json, Value};

/// What a conversation is kept under: its owner's id and its internal key.
pub(super) type ConversationKey = (String, String);

/// The conversations the runtime keeps, and the order they leave in. A hash map finds a
/// turn's conversation in one lookup (a turn looks twice: at its start and at its answer);
/// the activity order is a map from a counter to the key, and each conversation holds its
/// own place in it, so a turn moves its conversation to the newest end without a search,
/// and two turns in the same millisecond keep their order.
#[derive(Default)]
pub(super) struct Conversations {
    by_key: HashMap<ConversationKey, Conversation>,
    /// Activity stamp → key, least recently active first.
    by_activity: BTreeMap<u64, ConversationKey>,
    /// The last stamp given.
    stamps: u64,
}

impl Conversations {
    pub(super) fn len(&self) -> usize {
        self.by_key.len()
    }

    pub(super) fn contains(&self, key: &ConversationKey) -> bool {
        self.by_key.contains_key(key)
    }

    pub(super) fn get(&self, key: &ConversationKey) -> Option<&Conversation> {
        self.by_key.get(key)
    }

    /// Every conversation kept, in no particular order.
    pub(super) fn values(&self) -> impl Iterator<Item = &Conversation> {
        self.by_key.values()
    }

    /// The key of the first conversation `pred` accepts: a search of them all.
    pub(super) fn find_key(&self, pred: impl Fn(&Conversation) -> bool) -> Option<ConversationKey> {
        self.by_key
            .iter()
            .find(|(_, c)| pred(c))
            .map(|(k, _)| k.clone())
    }

    /// `key`'s conversation, made by `make` if there is none, now the most recently active.
    pub(super) fn touch_or_insert_with(
        &mut self,
        key: ConversationKey,
        make: impl FnOnce() -> Conversation,
    ) -> &mut Conversation {
        self.stamps += 1;
        let stamp = self.stamps;
        let c = match self.by_key.entry(key) {
            Entry::Occupied(o) => {
                let c = o.into_mut();
                if let Some(k) = self.by_activity.remove(&c.stamp) {
                    self.by_activity.insert(stamp, k);
                }
                c
            }
            Entry::Vacant(v) => {
                self.by_activity.insert(stamp, v.key().clone());
                v.insert(make())
            }
        };
        c.stamp = stamp;
        c
    }

    /// `key`'s conversation, if kept, now the most recently active.
    pub(super) fn touch(&mut self, key: &ConversationKey) -> Option<&mut Conversation> {
        let c = self.by_key.get_mut(key)?;
        self.stamps += 1;
        if let Some(k) = self.by_activity.remove(&c.stamp) {
            self.by_activity.insert(self.stamps, k);
        }
        c.stamp = self.stamps;
        Some(c)
    }

    /// Takes out the least recently active conversation.
    pub(super) fn pop_oldest(&mut self) -> Option<Conversation> {
        let (_, key) = self.by_activity.pop_first()?;
        self.by_key.remove(&key)
    }
}

/// A conversation: the turns one principal sent under one contextId.
pub(super) struct Conversation {
    /// The internal key (§7.6 "contextId namespace"): what the agent is told and what
    /// operators address the conversation by.
    pub(super) context_id: String,
    /// The owner's own name for it (its `contextId`).
    pub(super) name: String,
    pub(super) owner: Principal,
    pub(super) messages: VecDeque<Said>,
    /// The serialized size of each of `messages`, in the same order.
    pub(super) sizes: VecDeque<usize>,
    /// Serialized bytes of `messages`.
    pub(super) bytes: usize,
    pub(super) total_messages: u64,
    pub(super) turns: u64,
    pub(super) version: u64,
    pub(super) task: Option<String>,
    /// When it was last active (epoch ms), as its doc shows.
    pub(super) updated: u64,
    /// Its place in [`Conversations`]' activity order.
    stamp: u64,
}

/// One message a conversation keeps, as `conversation.get` shows it: its fields in the
/// order a JSON object of them is written. A struct rather than a JSON tree: a turn keeps
/// two, in every conversation held (a tree costs an ordered map's node and a string per key).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(super) struct Said {
    pub(super) role: Speaker,
    /// Cut at [`CONVERSATION_STRING_BYTES`], as `text` is.
    pub(super) task: String,
    /// Cut at [`CONVERSATION_STRING_BYTES`].
    pub(super) text: String,
    pub(super) ts: u64,
}

/// Who said a kept message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum Speaker {
    User,
    Agent,
}

impl Said {
    pub(super) fn new(role: Speaker, task: &str, mut text: String, ts: u64) -> Said {
        let mut task = task.to_owned();
        cut_string(&mut task, CONVERSATION_STRING_BYTES);
        cut_string(&mut text, CONVERSATION_STRING_BYTES);
        Said {
            role,
            task,
            text,
            ts,
        }
    }
}

/// Messages a conversation keeps (the most `conversation.get` returns); older ones drop.
const CONVERSATION_MESSAGES_KEPT: usize = 1000;
/// Strings of a kept message are cut here: `conversation.get` shows no more of them.
const CONVERSATION_STRING_BYTES: usize = 4096;

impl Conversation {
    /// A conversation with nothing in it yet.
    pub(super) fn new(
        context_id: &str,
        name: &str,
        owner: &Principal,
        updated: u64,
    ) -> Conversation {
        Conversation {
            context_id: context_id.to_owned(),
            name: name.to_owned(),
            owner: owner.clone(),
            messages: VecDeque::new(),
            sizes: VecDeque::new(),
            bytes: 0,
            total_messages: 0,
            turns: 0,
            version: 0,
            task: None,
            updated,
            stamp: 0,
        }
    }

    /// Keeps a message, dropping the oldest past the count bound or past `max_bytes` (the
    /// task history bound: a conversation keeps no more than one task may).
    pub(super) fn keep(&mut self, message: Said, max_bytes: usize) {
        // Counted as it serializes: no string of it is made.
        let size = json_len(&message);
        self.bytes += size;
        self.messages.push_back(message);
        self.sizes.push_back(size);
        self.total_messages += 1;
        while self.messages.len() > CONVERSATION_MESSAGES_KEPT
            || (self.bytes > max_bytes && self.messages.len() > 1)
        {
            self.messages.pop_front();
            if let Some(old) = self.sizes.pop_front() {
                self.bytes = self.bytes.saturating_sub(old);
            }
        }
    }
}

/// A conversation's id in the feed, `status` and `conversation.get`: its internal key.
pub(super) fn conversation_key(c: &Conversation) -> String {
    c.context_id.clone()
}

pub(super) fn conversation_doc(c: &Conversation) -> Value {
    json!({
        "id": conversation_key(c),
        "contextId": c.name,
        "kind": "a2a",
        "version": c.version,
        "messages": c.total_messages,
        "est_tokens": 0,
        "turns": c.turns,
        "principal": c.owner.id,
        "skills": [],
        "plan": null,
        "updated": c.updated,
    })
}

/// Cuts `s` to at most `max` bytes, on a character boundary, and gives back the room the
/// rest took (a kept message must not hold the whole of a 2 MiB turn).
fn cut_string(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_message_is_cut_and_counted_as_before() {
        let long = "é".repeat(3000); // 6000 bytes: cut on a character boundary
        let m = Said::new(Speaker::Agent, "t", long.clone(), 1);
        assert_eq!(m.text.len(), 4096);
        assert_eq!(m.text, long[..4096]);
        // What was cut is given back, not held past the 4 KiB kept.
        assert!(m.text.capacity() < 4096 + 64, "{}", m.text.capacity());
        let cut_task = Said::new(Speaker::User, &long, "hi".into(), 1);
        assert_eq!(cut_task.task, long[..4096]);
        // Shown as the JSON object conversation.get has always shown.
        let shown = serde_json::to_value(&m).unwrap();
        assert_eq!(
            shown,
            json!({"role": "agent", "task": "t", "text": &long[..4096], "ts": 1})
        );
        assert_eq!(
            serde_json::to_value(Said::new(Speaker::User, "t", "hi".into(), 2)).unwrap()["role"],
            "user"
        );
        assert_eq!(json_len(&m), shown.to_string().len());

        let mut c = Conversation::new("ctx", "n", &Principal::operator(), 0);
        let size = shown.to_string().len();
        for _ in 0..5 {
            c.keep(m.clone(), 3 * size);
        }
        // The oldest dropped past the byte bound, and the count follows what is kept.
        assert_eq!(c.messages.len(), 3);
        assert_eq!(c.bytes, 3 * size);
        assert_eq!(c.total_messages, 5);
        let kept: usize = c
            .messages
            .iter()
            .map(|m| serde_json::to_string(m).unwrap().len())
            .sum();
        assert_eq!(c.bytes, kept);
    }

    #[test]
    fn the_least_recently_active_conversation_leaves_first() {
        let owner = Principal::operator();
        let key = |n: &str| (owner.id.clone(), n.to_owned());
        let mut table = Conversations::default();
        for n in ["a", "b", "c"] {
            // All in the same millisecond: the order is the order of the turns.
            let c = table.touch_or_insert_with(key(n), || Conversation::new(n, n, &owner, 7));
            c.turns += 1;
        }
        // A second turn in "a" (found, not made again) and an answer in "b".
        let a = table.touch_or_insert_with(key("a"), || unreachable!("a is kept"));
        a.turns += 1;
        assert!(table.touch(&key("b")).is_some());
        assert!(table.touch(&key("gone")).is_none());
        assert_eq!(table.len(), 3);
        assert_eq!(table.get(&key("a")).map(|c| c.turns), Some(2));
        assert_eq!(table.find_key(|c| c.name == "c"), Some(key("c")));
        let order: Vec<String> = std::iter::from_fn(|| table.pop_oldest())
            .map(|c| c.name)
            .collect();
        assert_eq!(order, ["c", "a", "b"]);
        assert_eq!(table.len(), 0);
        assert!(table.by_activity.is_empty());
    }
}
