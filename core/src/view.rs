//! What the host publishes about its own objects (workflows, runs, conversations, activity)
//! so that the `status` op can show each caller the part it may see. The host owns these
//! objects; the core only keeps their latest documents, filtered by the same visibility rule
//! as the feed.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::auth::Principal;

/// One published object: its document and the principal it belongs to (`None`: the
/// operator's alone).
#[derive(Clone, Debug, PartialEq)]
pub struct ViewItem {
    pub owner: Option<String>,
    pub doc: Value,
}

impl ViewItem {
    fn visible_to(&self, p: &Principal) -> bool {
        p.is_operator()
            || (p.role != crate::auth::Role::Anonymous && self.owner.as_deref() == Some(&p.id))
    }
}

/// The host's objects, by kind and id. Bounded by the host: it removes what it forgets.
#[derive(Clone, Debug, Default)]
pub struct RuntimeView {
    /// `status.workflows`: `{name, …}` for each workflow, with the roles and grants that
    /// may run it decided by `may_run`.
    pub workflows: Vec<WorkflowEntry>,
    pub runs: BTreeMap<String, ViewItem>,
    pub conversations: BTreeMap<String, ViewItem>,
    pub activity: BTreeMap<String, ViewItem>,
    /// `status.model`: the conversation agent, if any.
    pub model: String,
}

/// A workflow as `status` lists it.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkflowEntry {
    pub name: String,
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
    /// The documents of one kind `p` may see, oldest id first.
    pub fn visible<'a>(
        items: &'a BTreeMap<String, ViewItem>,
        p: &'a Principal,
    ) -> impl Iterator<Item = &'a Value> + 'a {
        items
            .values()
            .filter(move |i| i.visible_to(p))
            .map(|i| &i.doc)
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

    #[test]
    fn visibility_follows_the_owner() {
        let mut items = BTreeMap::new();
        items.insert(
            "a".into(),
            ViewItem {
                owner: Some("user:ann".into()),
                doc: serde_json::json!(1),
            },
        );
        items.insert(
            "b".into(),
            ViewItem {
                owner: None,
                doc: serde_json::json!(2),
            },
        );
        let ann_p = user(&[]);
        let ann: Vec<_> = RuntimeView::visible(&items, &ann_p).collect();
        assert_eq!(ann, vec![&serde_json::json!(1)]);
        let op = Principal::operator();
        assert_eq!(RuntimeView::visible(&items, &op).count(), 2);
    }
}
