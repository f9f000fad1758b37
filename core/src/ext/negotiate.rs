//! `A2A-Extensions`: what a request asks for, what it activates, what the answer echoes.
//! activated = requested ∩ declared ∩ applicable to the method called.

use super::registry::{declared, Ext, Route};

/// Tokens considered across all header lines; the rest are never examined.
pub const MAX_TOKENS: usize = 32;
/// A longer token names nothing.
pub const MAX_TOKEN_BYTES: usize = 512;

/// A set of agentd's extensions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExtSet(u8);

impl ExtSet {
    /// No extension: what a request without `A2A-Extensions` activates.
    pub const EMPTY: ExtSet = ExtSet(0);

    fn bit(e: Ext) -> u8 {
        match e {
            Ext::Command => 1,
            Ext::Events => 2,
            Ext::TaskAnnotations => 4,
        }
    }

    /// The set with `e` added.
    pub fn with(mut self, e: Ext) -> Self {
        self.0 |= Self::bit(e);
        self
    }

    /// Whether `e` is in the set.
    pub fn contains(self, e: Ext) -> bool {
        self.0 & Self::bit(e) != 0
    }

    /// Whether no extension is in the set (the answer then echoes no header).
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The members in registry order.
    pub fn iter(self) -> impl Iterator<Item = Ext> {
        Ext::ALL.into_iter().filter(move |e| self.contains(*e))
    }

    /// The echo: the members' URIs in registry order, joined by ", "; `None` when empty,
    /// because nothing activated means no header.
    pub fn echo(self) -> Option<String> {
        if self.is_empty() {
            return None;
        }
        Some(self.iter().map(Ext::uri).collect::<Vec<_>>().join(", "))
    }
}

/// The extensions named in every `A2A-Extensions` line, matched exactly. Unknown URIs are
/// dropped, never refused; a line that is not UTF-8 is ignored.
pub fn requested<'a>(lines: impl Iterator<Item = &'a [u8]>) -> ExtSet {
    let mut set = ExtSet::EMPTY;
    let mut considered = 0;
    for line in lines {
        let Ok(text) = core::str::from_utf8(line) else {
            continue;
        };
        // HTTP's optional whitespace around list elements is spaces and tabs only: a URI
        // followed by another kind of space is a different token, not the same URI.
        for token in text
            .split(',')
            .map(|t| t.trim_matches([' ', '\t']))
            .filter(|t| !t.is_empty())
        {
            if considered == MAX_TOKENS {
                return set;
            }
            considered += 1;
            if token.len() > MAX_TOKEN_BYTES {
                continue;
            }
            if let Some(e) = Ext::from_uri(token) {
                set = set.with(e);
            }
        }
    }
    set
}

/// What a request to `route` activates.
pub fn activate(requested: ExtSet, route: Route, events_enabled: bool) -> ExtSet {
    requested
        .iter()
        .filter(|e| declared(*e, events_enabled) && e.applies_to(route))
        .fold(ExtSet::EMPTY, ExtSet::with)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::a2a::CoreMethod;
    use crate::ext::registry::{COMMAND_URI, EVENTS_URI, TASK_ANNOTATIONS_URI};

    #[test]
    fn only_spaces_and_tabs_are_optional_whitespace() {
        let uri = crate::ext::COMMAND_URI;
        let tab = format!("\t{uri} ");
        assert!(requested([tab.as_bytes()].into_iter()).contains(Ext::Command));
        let nbsp = format!("{uri}\u{a0}");
        assert!(!requested([nbsp.as_bytes()].into_iter()).contains(Ext::Command));
    }

    #[test]
    fn header_lines_are_merged_trimmed_and_exact() {
        let line1 = format!(" {COMMAND_URI} ,https://example.com/x,, {COMMAND_URI}/");
        let line2 = TASK_ANNOTATIONS_URI.to_uppercase();
        let line3 = TASK_ANNOTATIONS_URI.to_string();
        let set = requested(
            [
                line1.as_bytes(),
                line2.as_bytes(),
                b"\xff\xfe",
                line3.as_bytes(),
            ]
            .into_iter(),
        );
        assert_eq!(
            set,
            ExtSet::EMPTY.with(Ext::Command).with(Ext::TaskAnnotations)
        );
        let all = format!("{EVENTS_URI}, {TASK_ANNOTATIONS_URI}, {COMMAND_URI}");
        let got = activate(
            requested([all.as_bytes()].into_iter()),
            Route::Core(CoreMethod::SendMessage),
            true,
        );
        assert_eq!(
            got.echo().unwrap(),
            format!("{COMMAND_URI}, {TASK_ANNOTATIONS_URI}")
        );
        let got = activate(
            requested([all.as_bytes()].into_iter()),
            Route::Core(CoreMethod::GetTask),
            true,
        );
        assert_eq!(got.echo().unwrap(), TASK_ANNOTATIONS_URI);
        let got = activate(requested([all.as_bytes()].into_iter()), Route::Events, true);
        assert_eq!(
            got.echo().unwrap(),
            format!("{EVENTS_URI}, {TASK_ANNOTATIONS_URI}")
        );
        let got = activate(
            requested([all.as_bytes()].into_iter()),
            Route::Events,
            false,
        );
        assert_eq!(got.echo().unwrap(), TASK_ANNOTATIONS_URI);
        let got = activate(
            requested([all.as_bytes()].into_iter()),
            Route::Core(CoreMethod::GetExtendedAgentCard),
            true,
        );
        assert_eq!(got.echo(), None);
    }

    #[test]
    fn only_32_tokens_are_considered_and_long_ones_name_nothing() {
        let filler = vec!["https://example.com/x"; 32].join(",");
        let line = format!("{filler},{COMMAND_URI}");
        assert!(requested([line.as_bytes()].into_iter()).is_empty());
        let long = format!("{COMMAND_URI}{}", " ".repeat(0)) + &"x".repeat(600);
        assert!(requested([long.as_bytes()].into_iter()).is_empty());
    }
}
