//! What the host publishes about its own objects (workflows, runs, conversations, activity)
//! so that the `status` op can show each caller the part it may see. The host owns these
//! objects and tells the core through [`crate::Instance::publish_object`] and
//! [`crate::Instance::withdraw_object`]; the core keeps their latest documents, filtered by
//! the same visibility rule as the feed.
//!
//! `status` answers in time bounded by its answer, never by how many objects there are: each
//! kind keeps its objects in publication order twice, once in all and once per owner, so the
//! newest [`STATUS_LIST_MAX`] a caller may see are read off one ordered index, and how many it
//! may see in all is that index's length.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde_json::Value;

use crate::auth::Principal;

/// The most items of each kind (`runs`, `conversations`, `activity`) that one `status`
/// answer lists: the newest the caller may see. `counts` says how many it may see in all.
pub const STATUS_LIST_MAX: usize = 100;

/// The kinds of object the host publishes for `status`; each is also a feed kind (§4.4), and
/// its document is that kind's feed `data`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ObjectKind {
    /// A workflow run: `status.runs`.
    Run,
    /// A conversation: `status.conversations`.
    Conversation,
    /// A model turn in flight: `status.activity`.
    Activity,
}

impl ObjectKind {
    /// Every kind, in the order `status` lists them.
    pub const ALL: [ObjectKind; 3] = [
        ObjectKind::Run,
        ObjectKind::Conversation,
        ObjectKind::Activity,
    ];

    /// The kind's name: its feed kind, singular.
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectKind::Run => "run",
            ObjectKind::Conversation => "conversation",
            ObjectKind::Activity => "activity",
        }
    }

    /// Its list in the `status` document, and its key in `status.counts`.
    pub fn list_name(self) -> &'static str {
        match self {
            ObjectKind::Run => "runs",
            ObjectKind::Conversation => "conversations",
            ObjectKind::Activity => "activity",
        }
    }
}

/// Whether `p` may see an object that `owner` holds (`None`: the operator's alone): the
/// feed's rule (§4.3).
fn visible_to(owner: Option<&str>, p: &Principal) -> bool {
    p.is_operator() || (p.role != crate::auth::Role::Anonymous && owner == Some(p.id.as_str()))
}

/// One published object.
#[derive(Clone, Debug)]
struct Item {
    owner: Option<Arc<str>>,
    doc: Value,
    /// When it was last published: its place in the shelf's order.
    seq: u64,
}

/// The objects of one kind, by id, with two indexes in publication order: all of them, and
/// each owner's. Every change costs O(log n); a page costs O(page).
#[derive(Clone, Debug, Default)]
struct Shelf {
    items: HashMap<Arc<str>, Item>,
    /// Publication sequence → id, of every object.
    all: BTreeMap<u64, Arc<str>>,
    /// Per owner: publication sequence → id, of the objects it holds. An owner whose last
    /// object leaves leaves too.
    by_owner: HashMap<Arc<str>, BTreeMap<u64, Arc<str>>>,
}

impl Shelf {
    fn publish(&mut self, seq: u64, id: &str, owner: Option<&str>, doc: Value) {
        let id: Arc<str> = match self.items.get_key_value(id) {
            Some((k, _)) => k.clone(),
            None => Arc::from(id),
        };
        self.unindex(&id);
        let owner: Option<Arc<str>> = owner.map(|o| match self.by_owner.get_key_value(o) {
            Some((k, _)) => k.clone(),
            None => Arc::from(o),
        });
        self.all.insert(seq, id.clone());
        if let Some(o) = &owner {
            self.by_owner
                .entry(o.clone())
                .or_default()
                .insert(seq, id.clone());
        }
        self.items.insert(id, Item { owner, doc, seq });
    }

    fn withdraw(&mut self, id: &str) -> bool {
        self.unindex(id) && self.items.remove(id).is_some()
    }

    /// Takes `id` out of both indexes (its item stays); whether it was there.
    fn unindex(&mut self, id: &str) -> bool {
        let Some(item) = self.items.get(id) else {
            return false;
        };
        self.all.remove(&item.seq);
        if let Some(o) = &item.owner {
            if let Some(set) = self.by_owner.get_mut(o) {
                set.remove(&item.seq);
                if set.is_empty() {
                    self.by_owner.remove(o);
                }
            }
        }
        true
    }

    /// The index of what `p` may see: everything for an operator, its own for any other
    /// named caller, nothing for an anonymous one.
    fn index_for(&self, p: &Principal) -> Option<&BTreeMap<u64, Arc<str>>> {
        if p.is_operator() {
            Some(&self.all)
        } else if p.role == crate::auth::Role::Anonymous {
            None
        } else {
            self.by_owner.get(p.id.as_str())
        }
    }

    fn page(&self, p: &Principal, max: usize) -> Page<'_> {
        let Some(index) = self.index_for(p) else {
            return Page::default();
        };
        let items = index
            .values()
            .rev()
            .take(max)
            .filter_map(|id| self.items.get(id))
            .map(|i| {
                debug_assert!(visible_to(i.owner.as_deref(), p));
                &i.doc
            })
            .collect();
        Page {
            items,
            total: index.len(),
        }
    }
}

/// The part of one kind a caller may see, as `status` lists it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Page<'a> {
    /// The newest documents it may see, newest first (by when they were last published).
    pub items: Vec<&'a Value>,
    /// How many it may see in all.
    pub total: usize,
}

/// The host's objects, by kind and id. Bounded by the host: it withdraws what it forgets.
/// The host writes it only through [`crate::Instance`]'s publishing methods.
#[derive(Clone, Debug, Default)]
pub struct RuntimeView {
    /// `status.workflows`: `{name, …}` for each workflow, with the roles and grants that
    /// may run it decided by `may_run`.
    workflows: Vec<WorkflowEntry>,
    runs: Shelf,
    conversations: Shelf,
    activity: Shelf,
    /// `status.model`: the conversation agent, if any.
    model: String,
    /// The sequence of the last publication, of any kind.
    seq: u64,
}

/// A workflow as `status` lists it.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkflowEntry {
    /// The workflow's name, as a caller starts it.
    pub name: String,
    /// The workflow's entry as `status` shows it (its name, description, steps, command),
    /// rendered by the host that knows the workflow.
    pub doc: Value,
    /// The roles its start admits (empty: every named role).
    pub roles: Vec<crate::auth::Role>,
}

impl WorkflowEntry {
    /// Whether `p` may run this workflow: an operator always; anyone else when the start's
    /// roles admit its role and, if it holds scoped `workflow.run:<pattern>` grants, one of
    /// them matches the name.
    pub fn may_run(&self, p: &Principal) -> bool {
        may_run(p, &self.name, &self.roles)
    }
}

/// The `may_run` rule, shared by `status`, `workflow.run` and the extended card.
pub fn may_run(p: &Principal, workflow: &str, roles: &[crate::auth::Role]) -> bool {
    if p.is_operator() {
        return true;
    }
    if p.role == crate::auth::Role::Anonymous {
        return false;
    }
    if !roles.is_empty() && !roles.contains(&p.role) {
        return false;
    }
    let scoped: Vec<&str> = p
        .grants
        .iter()
        .filter_map(|g| g.strip_prefix("workflow.run:"))
        .collect();
    // A scoped grant replaces the default for the family.
    scoped.is_empty() || scoped.iter().any(|pat| pattern_matches(pat, workflow))
}

/// `*` anywhere in a pattern matches any run of characters.
fn pattern_matches(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let pieces: Vec<&str> = parts.collect();
    let Some((last, middle)) = pieces.split_last() else {
        return rest.is_empty();
    };
    for piece in middle {
        match rest.find(piece) {
            Some(i) => rest = &rest[i + piece.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

impl RuntimeView {
    fn shelf(&self, kind: ObjectKind) -> &Shelf {
        match kind {
            ObjectKind::Run => &self.runs,
            ObjectKind::Conversation => &self.conversations,
            ObjectKind::Activity => &self.activity,
        }
    }

    fn shelf_mut(&mut self, kind: ObjectKind) -> &mut Shelf {
        match kind {
            ObjectKind::Run => &mut self.runs,
            ObjectKind::Conversation => &mut self.conversations,
            ObjectKind::Activity => &mut self.activity,
        }
    }

    /// Publishes `id`'s latest document; it becomes the newest of its kind.
    pub(crate) fn publish(&mut self, kind: ObjectKind, id: &str, owner: Option<&str>, doc: Value) {
        self.seq += 1;
        let seq = self.seq;
        self.shelf_mut(kind).publish(seq, id, owner, doc);
    }

    /// Forgets `id`; whether it was published.
    pub(crate) fn withdraw(&mut self, kind: ObjectKind, id: &str) -> bool {
        self.shelf_mut(kind).withdraw(id)
    }

    pub(crate) fn set_workflows(&mut self, workflows: Vec<WorkflowEntry>) {
        self.workflows = workflows;
    }

    pub(crate) fn set_model(&mut self, model: String) {
        self.model = model;
    }

    /// The workflows the host declared, in its order.
    pub fn workflows(&self) -> &[WorkflowEntry] {
        &self.workflows
    }

    /// The conversation agent `status.model` names (empty: none).
    pub fn model(&self) -> &str {
        &self.model
    }

    /// How many objects of `kind` are published, whoever holds them.
    pub fn len(&self, kind: ObjectKind) -> usize {
        self.shelf(kind).items.len()
    }

    /// Whether nothing of `kind` is published.
    pub fn is_empty(&self, kind: ObjectKind) -> bool {
        self.shelf(kind).items.is_empty()
    }

    /// `id`'s latest document and its owner, if it is published.
    pub fn get(&self, kind: ObjectKind, id: &str) -> Option<(Option<&str>, &Value)> {
        self.shelf(kind)
            .items
            .get(id)
            .map(|i| (i.owner.as_deref(), &i.doc))
    }

    /// The newest `max` documents of `kind` that `p` may see, newest first, and how many it
    /// may see in all: O(`max` + log n), whatever the number of objects and owners.
    pub fn page(&self, kind: ObjectKind, p: &Principal, max: usize) -> Page<'_> {
        self.shelf(kind).page(p, max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Role;

    fn user(grants: &[&str]) -> Principal {
        Principal {
            id: "user:ann".into(),
            role: Role::User,
            grants: grants.iter().map(|g| g.to_string()).collect(),
            rate: None,
        }
    }

    #[test]
    fn scoped_grants_replace_the_default() {
        assert!(may_run(&user(&[]), "deploy", &[]));
        assert!(may_run(&user(&["workflow.run:dep*"]), "deploy", &[]));
        assert!(!may_run(&user(&["workflow.run:dep*"]), "triage", &[]));
        assert!(may_run(&user(&["workflow.run:*-prod"]), "ship-prod", &[]));
        assert!(!may_run(&user(&["workflow.run:a*b*c"]), "abx", &[]));
        assert!(may_run(&user(&["workflow.run:a*b*c"]), "axbyc", &[]));
    }

    #[test]
    fn roles_gate_and_operators_pass() {
        assert!(!may_run(&user(&[]), "deploy", &[Role::Agent]));
        assert!(may_run(&Principal::operator(), "deploy", &[Role::Agent]));
    }

    fn ids(page: &Page<'_>) -> Vec<u64> {
        page.items.iter().map(|d| d.as_u64().unwrap()).collect()
    }

    #[test]
    fn visibility_follows_the_owner() {
        let mut v = RuntimeView::default();
        v.publish(ObjectKind::Run, "a", Some("user:ann"), serde_json::json!(1));
        v.publish(ObjectKind::Run, "b", None, serde_json::json!(2));
        v.publish(ObjectKind::Run, "c", Some("user:bob"), serde_json::json!(3));
        let ann = v.page(ObjectKind::Run, &user(&[]), 10);
        assert_eq!((ids(&ann), ann.total), (vec![1], 1));
        let op = v.page(ObjectKind::Run, &Principal::operator(), 10);
        assert_eq!((ids(&op), op.total), (vec![3, 2, 1], 3));
        let anon = Principal::new("user:ann", Role::Anonymous, vec![]);
        assert_eq!(v.page(ObjectKind::Run, &anon, 10), Page::default());
        // The other kinds are apart.
        assert_eq!(
            v.page(ObjectKind::Conversation, &Principal::operator(), 10)
                .total,
            0
        );
    }

    #[test]
    fn republishing_moves_to_the_front_and_may_change_the_owner() {
        let mut v = RuntimeView::default();
        let op = Principal::operator();
        for i in 0..5u64 {
            v.publish(
                ObjectKind::Run,
                &format!("r{i}"),
                Some("user:ann"),
                serde_json::json!(i),
            );
        }
        v.publish(
            ObjectKind::Run,
            "r1",
            Some("user:ann"),
            serde_json::json!(10),
        );
        let p = v.page(ObjectKind::Run, &op, 3);
        assert_eq!((ids(&p), p.total), (vec![10, 4, 3], 5));
        // r4 passes to bob: ann's index loses it, bob's gains it.
        v.publish(
            ObjectKind::Run,
            "r4",
            Some("user:bob"),
            serde_json::json!(40),
        );
        let ann = v.page(ObjectKind::Run, &user(&[]), 10);
        assert_eq!((ids(&ann), ann.total), (vec![10, 3, 2, 0], 4));
        let bob = Principal::new("user:bob", Role::User, vec![]);
        assert_eq!(ids(&v.page(ObjectKind::Run, &bob, 10)), vec![40]);
        assert_eq!(
            v.get(ObjectKind::Run, "r4"),
            Some((Some("user:bob"), &serde_json::json!(40)))
        );
        // Withdrawn: gone from every index; the owner with nothing left is forgotten.
        assert!(v.withdraw(ObjectKind::Run, "r4"));
        assert!(!v.withdraw(ObjectKind::Run, "r4"));
        assert_eq!(v.page(ObjectKind::Run, &bob, 10), Page::default());
        assert!(!v.runs.by_owner.contains_key("user:bob"));
        assert_eq!(v.len(ObjectKind::Run), 4);
        assert_eq!(v.runs.all.len(), 4);
    }
}
