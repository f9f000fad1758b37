//! Who is calling. Today every listener is a loopback listener with no credential configured,
//! whose local callers are the operator; credentials and sessions arrive with the identity
//! work. Roles and grants are already what the command extension authorizes against.

/// What a principal is, for authorization.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Every method and op, on every object.
    Operator,
    /// A person: every core method on its own tasks, and the user op defaults.
    User,
    /// A peer agent: every core method on its own tasks, and the agent op defaults.
    Agent,
    /// Nobody: refused everywhere, whatever its grants say.
    Anonymous,
}

impl Role {
    pub const fn as_str(self) -> &'static str {
        match self {
            Role::Operator => "operator",
            Role::User => "user",
            Role::Agent => "agent",
            Role::Anonymous => "anonymous",
        }
    }
}

/// The identity a request resolved to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Principal {
    /// `operator`, `user:<name>`, or an agent peer's name.
    pub id: String,
    pub role: Role,
    /// Op names or patterns (`*`, `workflow.*`, `workflow.run:<pattern>`) beyond the role's
    /// defaults.
    pub grants: Vec<String>,
}

impl Principal {
    pub fn operator() -> Self {
        Principal {
            id: "operator".into(),
            role: Role::Operator,
            grants: Vec::new(),
        }
    }

    pub fn new(id: impl Into<String>, role: Role, grants: Vec<String>) -> Self {
        Principal {
            id: id.into(),
            role,
            grants,
        }
    }

    pub fn is_operator(&self) -> bool {
        self.role == Role::Operator
    }

    /// Whether this caller may see what `owner` owns: its own, or everything for an operator.
    pub fn may_see(&self, owner: &Principal) -> bool {
        self.is_operator() || (self.role != Role::Anonymous && self.id == owner.id)
    }

    /// Whether a grant names `op`: exactly, by `*`, or by a `family.*` pattern.
    pub fn granted(&self, op: &str) -> bool {
        self.grants.iter().any(|g| grant_matches(g, op))
    }
}

/// `*` matches every op; `family.*` every op under `family.`; a scoped
/// `workflow.run:<pattern>` grant counts as a grant of `workflow.run`; anything else only
/// itself.
pub fn grant_matches(grant: &str, op: &str) -> bool {
    if grant == "*" || grant == op {
        return true;
    }
    if let Some(family) = grant.strip_suffix(".*") {
        return op
            .strip_prefix(family)
            .is_some_and(|rest| rest.starts_with('.'));
    }
    if let Some((scoped, _pattern)) = grant.split_once(':') {
        return scoped == op;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants() {
        assert!(grant_matches("*", "status"));
        assert!(grant_matches("workflow.*", "workflow.run"));
        assert!(!grant_matches("workflow.*", "workflowx.run"));
        assert!(!grant_matches("workflow.*", "workflow"));
        assert!(grant_matches("workflow.run:deploy-*", "workflow.run"));
        assert!(!grant_matches("workflow.run", "workflow.runs"));
        let anon = Principal::new("x", Role::Anonymous, vec!["*".into()]);
        assert!(!anon.may_see(&anon));
    }
}
