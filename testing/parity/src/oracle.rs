//! The upstream side: one long-running `upstream-allocator` process (tests/parity, Go), asked
//! one JSON line at a time.

use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use anyhow::{Context, bail};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::instance::{Instance, Verdict};

/// A running upstream allocator process. Dropping it closes its stdin, which ends it.
pub struct Oracle {
    child: Child,
    stdin: Option<BufWriter<ChildStdin>>,
    stdout: BufReader<ChildStdout>,
    line: String,
}

impl Oracle {
    /// Starts the binary built by `tests/parity/build`.
    pub fn start(binary: &Path) -> anyhow::Result<Oracle> {
        let mut child = Command::new(binary)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| {
                format!(
                    "starting the upstream allocator {} (build it with tests/parity/build)",
                    binary.display()
                )
            })?;
        let stdin = child.stdin.take().context("no stdin")?;
        let stdout = child.stdout.take().context("no stdout")?;
        Ok(Oracle {
            child,
            stdin: Some(BufWriter::with_capacity(1 << 20, stdin)),
            stdout: BufReader::with_capacity(1 << 20, stdout),
            line: String::new(),
        })
    }

    /// Sends one request and reads the answer.
    pub fn ask<R: Serialize, A: DeserializeOwned>(&mut self, request: &R) -> anyhow::Result<A> {
        let stdin = self.stdin.as_mut().context("oracle closed")?;
        serde_json::to_writer(&mut *stdin, request)?;
        stdin.write_all(b"\n")?;
        stdin.flush().context("writing to the upstream allocator")?;
        self.line.clear();
        if self.stdout.read_line(&mut self.line)? == 0 {
            bail!("the upstream allocator exited");
        }
        let value: serde_json::Value =
            serde_json::from_str(&self.line).context("decoding the upstream allocator's answer")?;
        if let Some(e) = value.get("error").and_then(|e| e.as_str()) {
            bail!("upstream allocator: {e}");
        }
        Ok(serde_json::from_value(value)?)
    }

    /// Upstream's verdict on an instance.
    pub fn allocate(&mut self, instance: &Instance) -> anyhow::Result<Verdict> {
        #[derive(Serialize)]
        struct Request<'a> {
            op: &'static str,
            instance: &'a Instance,
        }
        self.ask(&Request {
            op: "allocate",
            instance,
        })
    }
}

impl Drop for Oracle {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}
