//! Who is calling. For now every listener is a loopback listener with no credential
//! configured, whose local callers are the operator; principals, roles, grants and
//! credentials arrive with the identity work.

/// The identity a request resolved to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Principal {
    /// `operator`, `user:<name>`, or an agent peer's name.
    pub id: String,
    pub is_operator: bool,
}

impl Principal {
    pub fn operator() -> Self {
        Principal {
            id: "operator".into(),
            is_operator: true,
        }
    }

    /// Whether this caller may see what `owner` owns: its own, or everything for an operator.
    pub fn may_see(&self, owner: &Principal) -> bool {
        self.is_operator || self.id == owner.id
    }
}
