//! Ordered indexes of the task store, so a listing walks only what it may show.
//!
//! Every held task has one entry in each of its buckets: its owner, its state, its owner and
//! state together, its owner and context name together, and (for an operator's listing by
//! `contextId`, which matches a task's name or its internal key) its context name and, when
//! it differs, its key. An entry is `(bucket, status time, status sequence)` in one ordered
//! map, so a bucket is a range of it and reads newest first backwards, as ListTasks orders;
//! its value is the task's state, so a bucket is filtered by state without a lookup. Each
//! bucket's size is counted as entries come and go.
//!
//! Per task that is five or six entries of 25 bytes in the map (about 40 with the map's
//! nodes), and the bucket tables: an owner's (shared by all its tasks) and a context's (one
//! per conversation).
//!
//! The map is changed in batches. An entry added or removed goes to a pending set first
//! (`Pending`), applied to the map when a listing reads it (`TaskIndex::settle`) or when
//! the set is full: an entry added and removed between two batches (a task made and moved
//! at its first status change, or moved twice) never touches the map, and a batch changes
//! the map in key order. The counts are kept at once; only the map waits.
//!
//! The owner's bucket of a context name is also the contextId namespace's entry for it
//! (§7.6: the name's internal key, and whether a held task still uses it): one table for
//! both, which keeps a name while its tasks are held and then while there is room among the
//! unused ones. A context's name and key are each one allocation (`Arc<str>`), held by its
//! tasks' records and shared by every table that names it; each table is keyed by them and
//! looked up by `&str`.

use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroU64;
use std::ops::Bound;
use std::sync::Arc;

use crate::a2a::types::TaskState;
use crate::auth::{Principal, Role};

/// How many task states there are (their wire numbers are `0..STATES`).
pub const STATES: usize = 9;

/// Every task state, by its wire number.
pub const ALL_STATES: [TaskState; STATES] = [
    TaskState::Unspecified,
    TaskState::Submitted,
    TaskState::Working,
    TaskState::Completed,
    TaskState::Failed,
    TaskState::Canceled,
    TaskState::InputRequired,
    TaskState::Rejected,
    TaskState::AuthRequired,
];

/// A state's place in [`ALL_STATES`].
fn slot(s: TaskState) -> usize {
    match s {
        TaskState::Unspecified => 0,
        TaskState::Submitted => 1,
        TaskState::Working => 2,
        TaskState::Completed => 3,
        TaskState::Failed => 4,
        TaskState::Canceled => 5,
        TaskState::InputRequired => 6,
        TaskState::Rejected => 7,
        TaskState::AuthRequired => 8,
    }
}

/// A task's listing position: (status time, status sequence).
pub type At = (u64, u64);

/// An entry's key in the map: (bucket, status time, status sequence).
type Key = (u64, u64, u64);

/// Pending changes past which a change applies them all (so at most this many wait, and
/// applying them is a bounded step: some hundred microseconds).
const PENDING_MAX: usize = 1024;

/// Changes to the entry map not applied yet. Each key is added once and removed once (a
/// key holds the status sequence, new at every move), so an entry added and then removed
/// while pending cancels out.
#[derive(Debug, Default)]
struct Pending {
    /// Entries added since the last batch, not in the map yet.
    added: HashMap<Key, TaskState, KeyHash>,
    /// Entries in the map to remove.
    removed: Vec<Key>,
}

impl Pending {
    fn len(&self) -> usize {
        self.added.len() + self.removed.len()
    }
}

/// Hashes a [`Key`] (three numbers the store makes, none chosen by a caller) with one
/// multiply per number: the pending set is looked up twice per entry, and SipHash, which
/// resists keys chosen to collide, is not needed for these.
#[derive(Clone, Copy, Debug, Default)]
struct KeyHash;

impl std::hash::BuildHasher for KeyHash {
    type Hasher = KeyHasher;
    fn build_hasher(&self) -> KeyHasher {
        KeyHasher(0)
    }
}

#[derive(Debug)]
struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        // The multiply carries input bits up only: the table picks a bucket by the low bits
        // and a tag by the top seven, so the well-mixed top half is turned down into both.
        self.0.rotate_left(26)
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// How many tasks a caller may see, in all and in each state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskCounts {
    /// Tasks in all.
    pub tasks: usize,
    /// Tasks in each state, by the state's place in [`ALL_STATES`].
    pub by_state: [usize; STATES],
}

impl TaskCounts {
    /// The states with at least one task, with their counts.
    pub fn nonzero(&self) -> impl Iterator<Item = (TaskState, usize)> + '_ {
        ALL_STATES
            .iter()
            .zip(self.by_state)
            .filter(|(_, n)| *n > 0)
            .map(|(s, n)| (*s, n))
    }
}

/// A bucket's id in the entry map, and how many entries it has.
#[derive(Clone, Copy, Debug)]
struct Counted {
    id: u64,
    n: usize,
}

/// One owner's buckets: its own at `base`, one per state after it; and its context names.
#[derive(Debug)]
struct Owner {
    /// The owner's id, as the `owners` table holds it (shared with its unused names).
    id: Arc<str>,
    base: u64,
    counts: TaskCounts,
    contexts: HashMap<Arc<str>, Context>,
}

/// One context name of one owner, in one entry: the contextId namespace's binding of the
/// name to its internal key (§7.6), and the owner's listing bucket for the name. It lives
/// while a held task uses it, then while it is one of the `keep` names unused the longest
/// least ([`TaskIndex::remove`]).
#[derive(Debug)]
struct Context {
    /// The internal key the name is bound to.
    key: Arc<str>,
    /// The owner's bucket of the context's tasks: `n` counts the held tasks in it.
    bucket: Counted,
    /// While no held task uses it: its place in `unused` (never 0, so the `Option` is free).
    unused_at: Option<NonZeroU64>,
}

/// What an index entry stands for: the task's fields its buckets are chosen by. The
/// context's name and key are the task's own allocations, which the tables share.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Entry<'a> {
    pub(crate) owner: &'a str,
    pub(crate) name: &'a Arc<str>,
    pub(crate) key: &'a Arc<str>,
    pub(crate) state: TaskState,
    pub(crate) at: At,
}

/// Where a listing walks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// Nothing matches.
    Nothing,
    /// The whole store (the store's own order).
    Everything,
    /// One bucket, of `n` entries.
    Bucket { id: u64, n: usize },
}

/// A listing's walk: where, and the state its entries must also have (when the bucket does
/// not already imply it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    pub(crate) source: Source,
    pub(crate) state: Option<TaskState>,
}

/// What [`TaskIndex::add`] adds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Adding {
    /// A task just made.
    New,
    /// A task read back from the store: [`TaskIndex::shared`] and [`TaskIndex::insert`] in
    /// one pass, each map looked up once (a restart does this for every task it holds). Its
    /// `name` and `key` become the namespace's own allocations where it holds them.
    Restored,
}

/// The task store's ordered indexes and counts, and the contextId namespace.
#[derive(Debug)]
pub(crate) struct TaskIndex {
    /// (bucket, status time, status sequence) to the task's state, as of the last batch.
    entries: BTreeMap<Key, TaskState>,
    /// What changed since the last batch.
    pending: Pending,
    /// How many changes wait at most ([`PENDING_MAX`]; tests make batches small).
    pending_max: usize,
    /// Tasks in each state; the state buckets are ids `0..STATES`.
    states: TaskCounts,
    /// Every owner with a held task or a context name. Rebuilt from the tasks at restore.
    owners: HashMap<Arc<str>, Owner>,
    /// Context names and keys, for an operator's listing by `contextId`.
    contexts: HashMap<Arc<str>, Counted>,
    /// Context names no held task uses any more (or bound before their first task), by
    /// when they became unused, as (owner, name): kept while there is room, so a
    /// conversation outlives its tasks' eviction for a while.
    unused: BTreeMap<u64, (Arc<str>, Arc<str>)>,
    /// Counts names made unused: the first is 1.
    unused_seq: u64,
    /// The next bucket id to give out.
    next: u64,
}

impl Default for TaskIndex {
    fn default() -> Self {
        TaskIndex {
            entries: BTreeMap::new(),
            pending: Pending::default(),
            pending_max: PENDING_MAX,
            states: TaskCounts::default(),
            owners: HashMap::new(),
            contexts: HashMap::new(),
            unused: BTreeMap::new(),
            unused_seq: 0,
            next: STATES as u64,
        }
    }
}

/// Counts one more entry in a named bucket, giving it an id if it is new.
fn enter(map: &mut HashMap<Arc<str>, Counted>, name: &Arc<str>, next: &mut u64) -> u64 {
    // One lookup: the name is hashed once whether or not the bucket exists.
    let c = map.entry(name.clone()).or_insert_with(|| {
        *next += 1;
        Counted {
            id: *next - 1,
            n: 0,
        }
    });
    c.n += 1;
    c.id
}

/// Counts one entry fewer in a named bucket, forgetting it when empty.
fn leave(map: &mut HashMap<Arc<str>, Counted>, name: &str) -> Option<u64> {
    let c = map.get_mut(name)?;
    let id = c.id;
    c.n = c.n.saturating_sub(1);
    if c.n == 0 {
        map.remove(name);
    }
    Some(id)
}

impl TaskIndex {
    /// Makes `owner`'s entry if it has none.
    fn add_owner(&mut self, owner: &str) {
        if !self.owners.contains_key(owner) {
            let base = self.next;
            self.next += 1 + STATES as u64;
            let id: Arc<str> = Arc::from(owner);
            self.owners.insert(
                id.clone(),
                Owner {
                    id,
                    base,
                    counts: TaskCounts::default(),
                    contexts: HashMap::new(),
                },
            );
        }
    }

    /// Makes room for `tasks` tasks about to be restored, each perhaps in a context of its
    /// own: the operator's context map is sized once, not rehashed at every doubling.
    /// [`TaskIndex::shrink_to_fit`] gives back what the restored tasks did not use.
    pub(crate) fn reserve(&mut self, tasks: usize) {
        self.contexts.reserve(tasks);
    }

    /// After a restore: the context map holds no more room than its names need.
    pub(crate) fn shrink_to_fit(&mut self) {
        self.contexts.shrink_to_fit();
    }

    /// Adds a task's entries. Its owner's context name is in use from now on, and bound to
    /// the task's key (two keys for one name happen only in a store written by hand: the
    /// newest task's wins, as a continuation of it would use it).
    pub(crate) fn insert(&mut self, e: Entry<'_>) {
        let (mut name, mut key) = (e.name.clone(), e.key.clone());
        self.add(e.owner, &mut name, &mut key, e.state, e.at, Adding::New);
    }

    /// Adds a task's entries, as [`TaskIndex::insert`] does for a new one; for a
    /// [`Adding::Restored`] one, also what [`TaskIndex::shared`] does.
    pub(crate) fn add(
        &mut self,
        owner: &str,
        name: &mut Arc<str>,
        key: &mut Arc<str>,
        state: TaskState,
        at: At,
        adding: Adding,
    ) {
        let restored = adding == Adding::Restored;
        use std::collections::hash_map::Entry as Slot;
        let (ms, seq) = at;
        let s = slot(state);
        self.put((s as u64, ms, seq), state);
        self.states.tasks += 1;
        self.states.by_state[s] += 1;
        let o = match self.owners.get_mut(owner) {
            Some(o) => o,
            None => {
                self.add_owner(owner);
                match self.owners.get_mut(owner) {
                    Some(o) => o,
                    None => return,
                }
            }
        };
        o.counts.tasks += 1;
        o.counts.by_state[s] += 1;
        let next = &mut self.next;
        let c = match o.contexts.entry(name.clone()) {
            Slot::Occupied(held) if restored => {
                *name = held.key().clone();
                let c = held.into_mut();
                if *c.key == **key {
                    *key = c.key.clone();
                } else {
                    c.key = key.clone();
                }
                c
            }
            Slot::Occupied(held) => {
                let c = held.into_mut();
                if c.key != *key {
                    c.key = key.clone();
                }
                c
            }
            Slot::Vacant(new) => {
                *next += 1;
                new.insert(Context {
                    key: key.clone(),
                    bucket: Counted {
                        id: *next - 1,
                        n: 0,
                    },
                    unused_at: None,
                })
            }
        };
        c.bucket.n += 1;
        if let Some(at) = c.unused_at.take() {
            self.unused.remove(&at.get());
        }
        let buckets = [o.base, o.base + 1 + s as u64, c.bucket.id];
        let mut contexts = [0; 2];
        let named = if key == name { 1 } else { 2 };
        for (id, c) in contexts.iter_mut().zip([&*name, &*key]).take(named) {
            *id = enter(&mut self.contexts, c, next);
        }
        for b in buckets.into_iter().chain(contexts.into_iter().take(named)) {
            self.put((b, ms, seq), state);
        }
    }

    /// Removes a task's entries (as [`TaskIndex::insert`] added them). Its context name
    /// stays bound; when no held task uses it any more, it is one of the unused names, kept
    /// while they are `keep` at most (the one unused the longest is forgotten past them).
    pub(crate) fn remove(&mut self, e: Entry<'_>, keep: usize) {
        let (ms, seq) = e.at;
        let s = slot(e.state);
        self.take((s as u64, ms, seq));
        self.states.tasks = self.states.tasks.saturating_sub(1);
        self.states.by_state[s] = self.states.by_state[s].saturating_sub(1);
        let mut buckets = [None; 3];
        let mut unused = None;
        if let Some(o) = self.owners.get_mut(e.owner) {
            o.counts.tasks = o.counts.tasks.saturating_sub(1);
            o.counts.by_state[s] = o.counts.by_state[s].saturating_sub(1);
            buckets[0] = Some(o.base);
            buckets[1] = Some(o.base + 1 + s as u64);
            if let Some(c) = o.contexts.get_mut(&**e.name) {
                c.bucket.n = c.bucket.n.saturating_sub(1);
                buckets[2] = Some(c.bucket.id);
                if c.bucket.n == 0 && c.unused_at.is_none() {
                    // The task's name is the namespace's allocation (shared at create).
                    // `next_unused_at` inline: `c` holds a borrow of the owners table.
                    self.unused_seq += 1;
                    c.unused_at = NonZeroU64::new(self.unused_seq);
                    unused = Some((o.id.clone(), e.name.clone()));
                }
            }
        }
        if let Some((owner, name)) = unused {
            self.push_unused(owner, name, keep);
        }
        for b in buckets.into_iter().flatten() {
            self.take((b, ms, seq));
        }
        for c in [e.name, e.key] {
            if let Some(id) = leave(&mut self.contexts, c) {
                self.take((id, ms, seq));
            }
            if e.key == e.name {
                break;
            }
        }
    }

    /// Moves a task's entries from its old state and position to `e`'s (a status change):
    /// what [`TaskIndex::remove`] and [`TaskIndex::insert`] do, with each table looked up
    /// once and no bucket emptied and made again.
    pub(crate) fn moved(&mut self, e: Entry<'_>, was: TaskState, was_at: At) {
        let (from, to) = (slot(was), slot(e.state));
        let ((ms, seq), (was_ms, was_seq)) = (e.at, was_at);
        self.states.by_state[from] = self.states.by_state[from].saturating_sub(1);
        self.states.by_state[to] += 1;
        // (old bucket, new bucket): only the state buckets differ.
        let mut owned = [None; 3];
        if let Some(o) = self.owners.get_mut(e.owner) {
            o.counts.by_state[from] = o.counts.by_state[from].saturating_sub(1);
            o.counts.by_state[to] += 1;
            let context = o.contexts.get(&**e.name).map(|c| c.bucket.id);
            owned = [
                Some((o.base, o.base)),
                Some((o.base + 1 + from as u64, o.base + 1 + to as u64)),
                context.map(|id| (id, id)),
            ];
        }
        let mut named = [None; 2];
        let names = if e.key == e.name { 1 } else { 2 };
        for (b, c) in named.iter_mut().zip([e.name, e.key]).take(names) {
            *b = self.contexts.get(&**c).map(|c| (c.id, c.id));
        }
        let state = Some((from as u64, to as u64));
        for (old, new) in std::iter::once(state).chain(owned).chain(named).flatten() {
            self.take((old, was_ms, was_seq));
            self.put((new, ms, seq), e.state);
        }
    }

    /// Adds an entry (in the next batch).
    fn put(&mut self, key: Key, state: TaskState) {
        self.pending.added.insert(key, state);
        self.settle_if_full();
    }

    /// Removes an entry (in the next batch; at once if it was added since the last one).
    fn take(&mut self, key: Key) {
        if self.pending.added.remove(&key).is_none() {
            self.pending.removed.push(key);
            self.settle_if_full();
        }
    }

    fn settle_if_full(&mut self) {
        if self.pending.len() >= self.pending_max {
            self.settle();
        }
    }

    /// Applies the pending changes to the map, in key order (neighbours in a bucket share
    /// the map's nodes). What reads the map ([`TaskIndex::walk`]) needs this first.
    pub(crate) fn settle(&mut self) {
        if self.pending.len() == 0 {
            return;
        }
        let mut removed = std::mem::take(&mut self.pending.removed);
        removed.sort_unstable();
        for k in &removed {
            self.entries.remove(k);
        }
        let mut added: Vec<(Key, TaskState)> = self.pending.added.drain().collect();
        added.sort_unstable_by_key(|(k, _)| *k);
        for (k, s) in added {
            self.entries.insert(k, s);
        }
        // The pending set's room is kept for the next batch, up to its bound.
        removed.clear();
        self.pending.removed = removed;
    }

    /// Whether every change is in the map ([`TaskIndex::settle`]).
    pub(crate) fn settled(&self) -> bool {
        self.pending.len() == 0
    }

    /// The internal key `owner` has bound to its context name `name`, if any.
    pub(crate) fn context_key(&self, owner: &str, name: &str) -> Option<&Arc<str>> {
        Some(&self.owners.get(owner)?.contexts.get(name)?.key)
    }

    /// The namespace's own allocations of `owner`'s context `name` and of its `key`, where
    /// it holds them: what a task of that context shares rather than holding copies.
    pub(crate) fn shared(
        &self,
        owner: &str,
        name: &str,
        key: &str,
    ) -> (Option<Arc<str>>, Option<Arc<str>>) {
        let found = self
            .owners
            .get(owner)
            .and_then(|o| o.contexts.get_key_value(name));
        match found {
            Some((n, c)) => (Some(n.clone()), (*c.key == *key).then(|| c.key.clone())),
            None => (None, None),
        }
    }

    /// Binds `owner`'s context name `name` to `key` before any task uses it, unused; an
    /// already bound name keeps its key. Past `keep` unused names, the one unused the
    /// longest is forgotten.
    pub(crate) fn bind(&mut self, owner: &str, name: &str, key: &str, keep: usize) {
        if self.context_key(owner, name).is_some() {
            return;
        }
        self.add_owner(owner);
        let Some((owner, _)) = self.owners.get_key_value(owner) else {
            return;
        };
        let owner = owner.clone();
        let name: Arc<str> = Arc::from(name);
        let key = if *name == *key {
            name.clone()
        } else {
            Arc::from(key)
        };
        let id = self.next;
        self.next += 1;
        let unused_at = self.next_unused_at();
        if let Some(o) = self.owners.get_mut(&owner) {
            let bucket = Counted { id, n: 0 };
            let c = Context {
                key,
                bucket,
                unused_at,
            };
            o.contexts.insert(name.clone(), c);
        }
        self.push_unused(owner, name, keep);
    }

    /// The next place among the unused names (its context's `unused_at`, then
    /// [`TaskIndex::push_unused`]).
    fn next_unused_at(&mut self) -> Option<NonZeroU64> {
        self.unused_seq += 1;
        NonZeroU64::new(self.unused_seq)
    }

    /// Puts `owner`'s name last among the unused ones, at `unused_seq` (its context's
    /// `unused_at` says so already). Past `keep` unused names, the one unused the longest
    /// is forgotten.
    fn push_unused(&mut self, owner: Arc<str>, name: Arc<str>, keep: usize) {
        self.unused.insert(self.unused_seq, (owner, name));
        while self.unused.len() > keep.max(1) {
            let Some((_, (owner, name))) = self.unused.pop_first() else {
                break;
            };
            if let Some(o) = self.owners.get_mut(&owner) {
                o.contexts.remove(&name);
                // An owner lives while it has a context name: each task uses one.
                if o.contexts.is_empty() {
                    self.owners.remove(&owner);
                }
            }
        }
    }

    /// How many context names the namespace holds (used and unused).
    pub(crate) fn context_count(&self) -> usize {
        self.owners.values().map(|o| o.contexts.len()).sum()
    }

    /// How many tasks `principal` may see, in all and by state.
    pub(crate) fn counts(&self, principal: &Principal) -> TaskCounts {
        if principal.is_operator() {
            return self.states.clone();
        }
        if principal.role == Role::Anonymous {
            return TaskCounts::default();
        }
        self.owners
            .get(principal.id.as_str())
            .map(|o| o.counts.clone())
            .unwrap_or_default()
    }

    /// How many tasks are in `state`.
    pub(crate) fn in_state(&self, state: TaskState) -> usize {
        self.states.by_state[slot(state)]
    }

    /// The narrowest walk for what `principal` may see of the tasks in `context` (a name, or
    /// for an operator also an internal key; empty: any) in `state` (any if `None`), with
    /// [`Principal::may_see`]'s visibility: an operator sees all, an anonymous caller
    /// nothing, anyone else the tasks its id owns.
    pub(crate) fn plan(
        &self,
        principal: &Principal,
        context: &str,
        state: Option<TaskState>,
    ) -> Plan {
        const NOTHING: Plan = Plan {
            source: Source::Nothing,
            state: None,
        };
        let bucket = |c: &Counted, state| Plan {
            source: Source::Bucket { id: c.id, n: c.n },
            state,
        };
        if principal.is_operator() {
            return match (context, state) {
                ("", None) => Plan {
                    source: Source::Everything,
                    state: None,
                },
                ("", Some(s)) => Plan {
                    source: Source::Bucket {
                        id: slot(s) as u64,
                        n: self.states.by_state[slot(s)],
                    },
                    state: None,
                },
                (c, state) => self.contexts.get(c).map_or(NOTHING, |c| bucket(c, state)),
            };
        }
        if principal.role == Role::Anonymous {
            return NOTHING;
        }
        let Some(o) = self.owners.get(principal.id.as_str()) else {
            return NOTHING;
        };
        match (context, state) {
            ("", None) => Plan {
                source: Source::Bucket {
                    id: o.base,
                    n: o.counts.tasks,
                },
                state: None,
            },
            ("", Some(s)) => Plan {
                source: Source::Bucket {
                    id: o.base + 1 + slot(s) as u64,
                    n: o.counts.by_state[slot(s)],
                },
                state: None,
            },
            (c, state) => o
                .contexts
                .get(c)
                .map_or(NOTHING, |c| bucket(&c.bucket, state)),
        }
    }

    /// A bucket's entries at or after `since_ms`, newest first, strictly before `after`:
    /// each task's position and state.
    pub(crate) fn walk(
        &self,
        bucket: u64,
        after: Option<At>,
        since_ms: u64,
    ) -> impl Iterator<Item = (At, TaskState)> + '_ {
        debug_assert!(self.settled(), "the index is read after TaskIndex::settle");
        let lo = (bucket, since_ms, 0);
        let hi = match after {
            Some((ms, seq)) => Bound::Excluded((bucket, ms, seq)),
            None => Bound::Included((bucket, u64::MAX, u64::MAX)),
        };
        // An empty range is walked as one (a range whose ends cross would panic).
        let empty = match hi {
            Bound::Excluded(h) => h < lo,
            _ => false,
        };
        let range = if empty {
            self.entries
                .range((Bound::Excluded(lo), Bound::Included(lo)))
        } else {
            self.entries.range((Bound::Included(lo), hi))
        };
        range.rev().map(|(&(_, ms, seq), &s)| ((ms, seq), s))
    }

    /// Entries in the index (for tests and measurement).
    #[cfg(test)]
    pub(crate) fn entries(&mut self) -> usize {
        self.settle();
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::a2a::types::{Message, Part, Role as MessageRole};
    use crate::tasks::{ContextIds, ListFilter, TaskLimits, TaskRecord, TaskStore};

    /// A small deterministic generator (xorshift64*): the test needs no dependency.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    fn principals() -> Vec<Principal> {
        vec![
            Principal::operator(),
            Principal::new("user:alice", Role::User, vec![]),
            Principal::new("agent:bob", Role::Agent, vec![]),
            Principal::new("anonymous", Role::Anonymous, vec![]),
            // Not an operator, though named like one: it sees what its id owns.
            Principal::new("operator", Role::User, vec![]),
        ]
    }

    const NAMES: [&str; 3] = ["a", "b", "c"];

    fn msg() -> Message {
        Message {
            message_id: "m".into(),
            role: MessageRole::User,
            parts: vec![Part::text("hi")],
            ..Message::default()
        }
    }

    /// The counters against the tasks held, read without settling the index (they are kept
    /// at every change, whatever waits for a batch).
    fn check_counts(s: &TaskStore, step: usize) {
        // The batch is bounded: it is applied as it fills, whatever the changes.
        assert!(
            s.index.pending.len() < s.index.pending_max,
            "step {step}: {} changes wait",
            s.index.pending.len()
        );
        let all: Vec<&TaskRecord> = s.order.values().filter_map(|id| s.get(id)).collect();
        for st in ALL_STATES {
            let n = all.iter().filter(|t| t.state == st).count();
            assert_eq!(s.in_state(st), n, "step {step}: {st:?}");
        }
        for p in &principals() {
            let counts = s.counts(p);
            let visible = all.iter().filter(|t| p.may_see(&t.owner));
            assert_eq!(
                counts.tasks,
                visible.clone().count(),
                "step {step}: {}",
                p.id
            );
            for st in ALL_STATES {
                let n = visible.clone().filter(|t| t.state == st).count();
                assert_eq!(counts.by_state[slot(st)], n, "step {step}: {} {st:?}", p.id);
            }
        }
    }

    /// Every filter a caller may ask for, answered by the index (listing, paging and count)
    /// and by a filtered walk of the whole store: they must agree.
    fn check(s: &mut TaskStore, step: usize) {
        // What a listing does first: the changes waiting for a batch are applied.
        s.index.settle();
        let s: &TaskStore = s;
        let all: Vec<&TaskRecord> = s.order.values().filter_map(|id| s.get(id)).collect();
        assert_eq!(
            all.len(),
            s.tasks.len(),
            "step {step}: one position per task"
        );
        let contexts = ["", "a", "b", "ctx-a"];
        let states: Vec<Option<TaskState>> = std::iter::once(None)
            .chain(ALL_STATES.iter().copied().map(Some))
            .collect();
        for st in ALL_STATES {
            let n = all.iter().filter(|t| t.state == st).count();
            assert_eq!(s.in_state(st), n, "step {step}: {st:?}");
        }
        // Every held task's context name is bound, in use, and held once: the task's name
        // is the namespace's allocation.
        for t in &all {
            let o = &s.index.owners[t.owner.id.as_str()];
            let (name, c) = o.contexts.get_key_value(&*t.context_id).unwrap();
            assert!(Arc::ptr_eq(name, &t.context_id), "step {step}: {}", t.id);
            let n = all
                .iter()
                .filter(|u| u.owner.id == t.owner.id && u.context_id == t.context_id)
                .count();
            assert_eq!(
                (c.bucket.n, c.unused_at),
                (n, None),
                "step {step}: {}",
                t.id
            );
        }
        let unused = s.index.owners.values().flat_map(|o| o.contexts.values());
        assert_eq!(
            unused.filter(|c| c.unused_at.is_some()).count(),
            s.index.unused.len(),
            "step {step}"
        );
        assert!(s.index.unused.len() <= s.limits.max_tasks, "step {step}");
        let mut times: Vec<Option<u64>> = vec![None];
        if let Some(t) = all.get(all.len() / 2) {
            times.push(Some(t.status_ms));
            times.push(Some(t.status_ms + 1));
        }
        for p in &principals() {
            let counts = s.counts(p);
            let visible: Vec<&&TaskRecord> = all.iter().filter(|t| p.may_see(&t.owner)).collect();
            assert_eq!(counts.tasks, visible.len(), "step {step}: {}", p.id);
            for st in ALL_STATES {
                let n = visible.iter().filter(|t| t.state == st).count();
                assert_eq!(counts.by_state[slot(st)], n, "step {step}: {} {st:?}", p.id);
            }
            for &context_id in &contexts {
                for &state in &states {
                    for &since_ms in &times {
                        let f = ListFilter {
                            principal: p,
                            context_id,
                            state,
                            since_ms,
                        };
                        let want: Vec<&str> = all
                            .iter()
                            .rev()
                            .filter(|t| f.matches(t))
                            .map(|t| &*t.id)
                            .collect();
                        let got: Vec<&str> = s.listed(&f, None).map(|t| &*t.id).collect();
                        assert_eq!(got, want, "step {step}: {f:?}");
                        assert_eq!(s.counted(&f), want.len(), "step {step}: {f:?}");
                        // From a task's position (matching or not, as a page token's
                        // task may have moved since), the rest of the listing.
                        for (i, t) in all.iter().enumerate().skip(step % 4).step_by(4) {
                            let rest: Vec<&str> = s
                                .listed(&f, Some((t.status_ms, t.status_seq)))
                                .map(|t| &*t.id)
                                .collect();
                            let want: Vec<&str> = all[..i]
                                .iter()
                                .rev()
                                .filter(|t| f.matches(t))
                                .map(|t| &*t.id)
                                .collect();
                            assert_eq!(rest, want, "step {step}: {f:?} after {}", t.id);
                        }
                    }
                }
            }
        }
    }

    /// `steps` random changes, each checked; the index's changes are applied in batches of
    /// `batch` at most (and before each check).
    fn run(seed: u64, steps: usize, batch: usize) {
        let mut rng = Rng(seed);
        let limits = TaskLimits {
            max_tasks: 24,
            ..TaskLimits::DEFAULT
        };
        let mut s = TaskStore::new(limits);
        s.index.pending_max = batch;
        let owners = principals();
        let mut now = 1_000u64;
        let mut made = 0usize;
        for step in 0..steps {
            // Time mostly moves on, sometimes stands still; a status change may come with an
            // earlier clock (it must not move the task back).
            now += rng.below(3) as u64;
            let ids: Vec<String> = s.tasks.keys().map(|id| id.to_string()).collect();
            match rng.below(10) {
                0..=3 => {
                    made += 1;
                    let owner = owners[rng.below(owners.len())].clone();
                    let name = NAMES[rng.below(NAMES.len())];
                    let context = match (owner.is_operator(), rng.below(3)) {
                        (true, _) => ContextIds::plain(name),
                        // A key that is also somebody's name: an operator finds both.
                        (false, 0) => ContextIds {
                            name: name.into(),
                            key: "a".into(),
                        },
                        (false, _) => ContextIds {
                            name: name.into(),
                            key: format!("ctx-{name}"),
                        },
                    };
                    let _ = s.create(format!("t{made}"), context, owner, msg(), now);
                }
                4..=7 if !ids.is_empty() => {
                    let id = &ids[rng.below(ids.len())];
                    let state = ALL_STATES[rng.below(STATES)];
                    let at = now.saturating_sub(rng.below(2) as u64 * 5);
                    let _ = s.set_status(id, state, None, at);
                }
                8 if !ids.is_empty() => {
                    // A task read back from the durable store over the one held.
                    let id = &ids[rng.below(ids.len())];
                    let rec = TaskRecord::from_doc(s.tasks[id.as_str()].to_doc()).unwrap();
                    s.restore(rec);
                }
                _ => {
                    // A restart: every record restored into a new store (in no particular
                    // order), maybe under a smaller bound.
                    let docs: Vec<serde_json::Value> =
                        s.tasks.values().map(|t| t.to_doc()).collect();
                    let max_tasks = if rng.below(2) == 0 { 24 } else { 12 };
                    s = TaskStore::new(TaskLimits {
                        max_tasks,
                        ..limits
                    });
                    s.index.pending_max = batch;
                    for d in docs {
                        s.restore(TaskRecord::from_doc(d).unwrap());
                    }
                    s.enforce_bound();
                }
            }
            check_counts(&s, step);
            // A listing now and then: between two, changes wait in the index's batch (a
            // task made and moved, or moved twice, before a listing reads the tree).
            if rng.below(6) == 0 {
                check(&mut s, step);
            }
        }
        check(&mut s, steps);
        // Everything removed: nothing is left in the index.
        let ids: Vec<String> = s.tasks.keys().map(|id| id.to_string()).collect();
        for id in ids {
            s.remove(&id);
        }
        assert_eq!(s.index.entries(), 0);
        assert!(s.index.contexts.is_empty());
        assert_eq!(s.index.states, TaskCounts::default());
        // What is left is the namespace's unused names, and their owners.
        for o in s.index.owners.values() {
            assert_eq!(o.counts, TaskCounts::default());
            assert!(!o.contexts.is_empty());
            assert!(o.contexts.values().all(|c| c.bucket.n == 0));
        }
        assert_eq!(s.context_count(), s.index.unused.len());
    }

    #[test]
    fn every_bucket_answers_what_a_filtered_walk_answers() {
        for seed in [1, 2, 0x5eed, 0xdead_beef] {
            run(seed, 240, PENDING_MAX);
            // Batches applied in the middle of a task's changes, wherever they fall.
            for batch in [1, 2, 5, 13] {
                run(seed, 240, batch);
            }
        }
    }

    #[test]
    fn a_context_name_and_key_are_one_allocation_each() {
        let mut s = TaskStore::new(TaskLimits::DEFAULT);
        let alice = Principal::new("user:alice", Role::User, vec![]);
        let ctx = || ContextIds {
            name: "a".into(),
            key: "ctx-a".into(),
        };
        s.bind_context("user:alice", "a", "ctx-a");
        s.create("t1".into(), ctx(), alice.clone(), msg(), 1)
            .unwrap();
        s.create("t2".into(), ctx(), alice.clone(), msg(), 2)
            .unwrap();
        let op = Principal::operator();
        s.create("t3".into(), ContextIds::plain("b"), op.clone(), msg(), 3)
            .unwrap();
        let shared = |s: &TaskStore| {
            let (t1, t2, t3) = (&s.tasks["t1"], &s.tasks["t2"], &s.tasks["t3"]);
            let o = &s.index.owners["user:alice"];
            let (name, c) = o.contexts.get_key_value("a").unwrap();
            assert!(Arc::ptr_eq(&t1.context_id, name) && Arc::ptr_eq(&t2.context_id, name));
            assert!(Arc::ptr_eq(&t1.context_key, &c.key) && Arc::ptr_eq(&t2.context_key, &c.key));
            // The listing's tables hold the same allocations.
            let (g, _) = s.index.contexts.get_key_value("ctx-a").unwrap();
            assert!(Arc::ptr_eq(g, &c.key));
            // An operator's context: its key is its name.
            assert!(Arc::ptr_eq(&t3.context_id, &t3.context_key));
            let (name, c) = s.index.owners["operator"]
                .contexts
                .get_key_value("b")
                .unwrap();
            assert!(Arc::ptr_eq(name, &t3.context_id) && Arc::ptr_eq(&c.key, name));
        };
        shared(&s);
        // A restart: the records read back share as the tasks made live did.
        let docs: Vec<serde_json::Value> = s.tasks.values().map(|t| t.to_doc()).collect();
        let mut s = TaskStore::new(TaskLimits::DEFAULT);
        for d in docs {
            s.restore(TaskRecord::from_doc(d).unwrap());
        }
        shared(&s);
        assert_eq!(s.context_key("user:alice", "a"), Some("ctx-a"));
        assert_eq!(s.context_count(), 2);
    }

    #[test]
    fn records_at_one_position_each_keep_a_place() {
        let mut s = TaskStore::new(TaskLimits::DEFAULT);
        let op = Principal::operator();
        s.create("x".into(), ContextIds::plain("c"), op.clone(), msg(), 5)
            .unwrap();
        s.create("y".into(), ContextIds::plain("c"), op.clone(), msg(), 5)
            .unwrap();
        let mut doc = s.tasks["y"].to_doc();
        let x = &s.tasks["x"];
        // A record written by hand, at x's position.
        let mut rec = TaskRecord::from_doc(doc.take()).unwrap();
        rec.id = "z".into();
        rec.status_ms = x.status_ms;
        rec.status_seq = x.status_seq;
        s.restore(rec);
        assert_eq!(s.len(), 3);
        check(&mut s, 0);
    }

    #[test]
    fn an_empty_range_is_walked_without_a_panic() {
        let mut s = TaskStore::new(TaskLimits::DEFAULT);
        let op = Principal::operator();
        s.create("x".into(), ContextIds::plain("c"), op.clone(), msg(), 50)
            .unwrap();
        for context_id in ["", "c"] {
            let f = ListFilter {
                principal: &op,
                context_id,
                state: None,
                since_ms: Some(100),
            };
            assert_eq!(s.list(&f, None).count(), 0);
            let f = ListFilter {
                since_ms: Some(u64::MAX),
                ..f
            };
            assert_eq!(s.list(&f, None).count(), 0);
            // A page token from before the lower bound of the time filter.
            assert_eq!(s.list(&f, Some((10, 0))).count(), 0);
            assert_eq!(s.list(&f, Some((100, 0))).count(), 0);
            assert_eq!(s.count(&f), 0);
        }
    }

    /// A store written by hand may bind one name to two keys: read back, the name is bound
    /// to the key of the task restored last (a continuation would use it), and a task whose
    /// key is the bound one shares the namespace's allocation of it.
    #[test]
    fn a_restored_name_is_bound_to_the_last_restored_key() {
        let alice = Principal::new("user:alice", Role::User, vec![]);
        let doc = |id: &str, key: &str, at: u64| {
            let mut s = TaskStore::new(TaskLimits::DEFAULT);
            let ids = ContextIds {
                name: "n".into(),
                key: key.into(),
            };
            s.create(id.into(), ids, alice.clone(), msg(), at).unwrap();
            s.tasks[id].to_doc()
        };
        let mut s = TaskStore::new(TaskLimits::DEFAULT);
        for (id, key, at) in [("t1", "k1", 10), ("t2", "k2", 20), ("t3", "k2", 30)] {
            s.restore(TaskRecord::from_doc(doc(id, key, at)).unwrap());
            assert_eq!(
                s.index.context_key("user:alice", "n").map(|k| &**k),
                Some(key),
                "after {id}"
            );
        }
        let held = s.index.context_key("user:alice", "n").unwrap();
        assert!(Arc::ptr_eq(held, &s.tasks["t3"].context_key));
        assert!(Arc::ptr_eq(held, &s.tasks["t2"].context_key));
        check(&mut s, 0);
    }
}
