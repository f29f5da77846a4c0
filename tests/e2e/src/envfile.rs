//! `KEY=VALUE` files: the local cluster's `DIR/env` (tests/cluster/README.md, "The env file") and
//! the `DIR/tessera/install.env` that tests/e2e/local-up writes next to it.
//!
//! One entry per line, `#` comments and blank lines ignored, split on the first `=`; a value may
//! be wrapped in single quotes (tests/cluster quotes values that contain spaces).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// A parsed env file and where it came from (for error messages).
#[derive(Debug, Clone, Default)]
pub struct EnvFile {
    path: PathBuf,
    values: BTreeMap<String, String>,
}

impl EnvFile {
    /// Reads and parses `path`.
    pub fn read(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the env file {}", path.display()))?;
        let values = parse(&text)
            .with_context(|| format!("the env file {} is malformed", path.display()))?;
        Ok(Self {
            path: path.to_owned(),
            values,
        })
    }

    /// The value of `key`, or an error naming the file and the key.
    pub fn get(&self, key: &str) -> anyhow::Result<&str> {
        self.values.get(key).map(String::as_str).with_context(|| {
            format!(
                "{} has no {key}; was it written by the expected script (tests/cluster/up, tests/e2e/local-up)?",
                self.path.display()
            )
        })
    }

    /// The value of `key` if present.
    pub fn optional(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(String::as_str)
    }

    /// The value of `key` as a path.
    pub fn path(&self, key: &str) -> anyhow::Result<PathBuf> {
        self.get(key).map(PathBuf::from)
    }

    /// Where the file was read from.
    pub fn source(&self) -> &Path {
        &self.path
    }
}

/// Parses the text of an env file.
pub fn parse(text: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let mut values = BTreeMap::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            bail!("line {}: `{line}` is not KEY=VALUE", number + 1);
        };
        let key = key.trim();
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            bail!(
                "line {}: `{key}` is not a variable name (letters, digits, _)",
                number + 1
            );
        }
        let value = match value.strip_prefix('\'') {
            Some(rest) => rest.strip_suffix('\'').with_context(|| {
                format!(
                    "line {}: the quoted value of {key} is not closed",
                    number + 1
                )
            })?,
            None => value,
        };
        values.insert(key.to_owned(), value.to_owned());
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;

    use super::*;

    #[test]
    fn parses_the_format_tests_cluster_writes() {
        let text = "# written by tests/cluster/up\n\
                    KUBECONFIG=/tmp/c/kubeconfig\n\
                    \n\
                    TESSERA_NODES='tessera-node-1 tessera-node-2'\n\
                    TESSERA_FEATURE_GATES=A=true,B=false\n\
                    EMPTY=\n";
        let values = parse(text).unwrap();
        assert_eq!(values["KUBECONFIG"], "/tmp/c/kubeconfig");
        assert_eq!(values["TESSERA_NODES"], "tessera-node-1 tessera-node-2");
        // Only the first `=` splits.
        assert_eq!(values["TESSERA_FEATURE_GATES"], "A=true,B=false");
        assert_eq!(values["EMPTY"], "");
        assert_eq!(values.len(), 4);
    }

    #[test]
    fn malformed_lines_name_the_line() {
        let error = parse("A=1\nnot a pair\n").unwrap_err().to_string();
        assert!(error.contains("line 2"), "{error}");
        let error = parse("BAD KEY=1\n").unwrap_err().to_string();
        assert!(
            error.contains("`BAD KEY` is not a variable name"),
            "{error}"
        );
        let error = parse("A='open\n").unwrap_err().to_string();
        assert!(error.contains("not closed"), "{error}");
    }

    #[test]
    fn missing_keys_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("env");
        std::fs::write(&path, "A=1\n").unwrap();
        let env = EnvFile::read(&path).unwrap();
        assert_eq!(env.get("A").unwrap(), "1");
        let error = env.get("B").unwrap_err().to_string();
        assert!(
            error.contains(&path.display().to_string()) && error.contains("no B"),
            "{error}"
        );
    }
}
