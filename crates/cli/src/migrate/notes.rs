//! What migrating one object or config changed, and what it could not carry over: the lines
//! `tessera migrate` reports on stderr.

/// What was changed and what could not be carried over, for one object or config.
#[derive(Debug, Default)]
pub struct Notes {
    pub changes: Vec<(String, String)>,
    pub not_carried: Vec<(String, String)>,
}

impl Notes {
    pub fn change(&mut self, path: impl Into<String>, text: String) {
        self.changes.push((path.into(), text));
    }

    pub fn not_carried(&mut self, path: impl Into<String>, text: String) {
        self.not_carried.push((path.into(), text));
    }
}
