//! How the stand-ins talk MPS: the wire format between a control client
//! (`nvidia-cuda-mps-control` without `-d`), a CUDA client (this library) and the stand-in
//! control daemon (`nvidia-cuda-mps-control -d`, in tessera-fake-driver).
//!
//! The daemon listens on the unix socket `control` in the pipe directory
//! (`CUDA_MPS_PIPE_DIRECTORY`, default `/tmp/nvidia-mps`). A client connects, writes one command
//! line, closes its writing side and reads the answer: a first line `ok` or `error`, then the
//! text the command prints. One connection per command. (NVIDIA's daemon uses its own pipes in
//! the same directory; what matters to Tessera is the directory and the commands, which are the
//! real ones.)

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The pipe directory when `CUDA_MPS_PIPE_DIRECTORY` is not set.
pub const DEFAULT_PIPE_DIRECTORY: &str = "/tmp/nvidia-mps";
/// The log directory when `CUDA_MPS_LOG_DIRECTORY` is not set.
pub const DEFAULT_LOG_DIRECTORY: &str = "/var/log/nvidia-mps";
/// The name of the daemon's socket in the pipe directory.
pub const CONTROL_SOCKET: &str = "control";
/// The command a CUDA client sends when it starts (not one of NVIDIA's control commands).
pub const CLIENT_ATTACH: &str = "tessera_client_attach";

/// The socket of the daemon serving `pipe_directory`.
pub fn control_socket(pipe_directory: &Path) -> PathBuf {
    pipe_directory.join(CONTROL_SOCKET)
}

/// The pipe directory this process uses (`CUDA_MPS_PIPE_DIRECTORY` or the default).
pub fn pipe_directory_from_env() -> PathBuf {
    std::env::var_os("CUDA_MPS_PIPE_DIRECTORY")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_PIPE_DIRECTORY), PathBuf::from)
}

/// The log directory this process uses (`CUDA_MPS_LOG_DIRECTORY` or the default).
pub fn log_directory_from_env() -> PathBuf {
    std::env::var_os("CUDA_MPS_LOG_DIRECTORY")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_LOG_DIRECTORY), PathBuf::from)
}

/// A daemon's answer to one command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// Whether the command succeeded.
    pub ok: bool,
    /// What the command prints (without the status line).
    pub text: String,
}

impl Answer {
    /// The bytes a daemon writes for this answer.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = if self.ok {
            b"ok\n".to_vec()
        } else {
            b"error\n".to_vec()
        };
        out.extend_from_slice(self.text.as_bytes());
        out
    }

    /// Reads an answer a daemon wrote.
    pub fn decode(bytes: &[u8]) -> Result<Answer, MpsError> {
        let text = String::from_utf8_lossy(bytes);
        let (status, body) = text.split_once('\n').unwrap_or((&text, ""));
        let ok = match status {
            "ok" => true,
            "error" => false,
            _ => return Err(MpsError::Protocol(status.to_owned())),
        };
        Ok(Answer {
            ok,
            text: body.to_owned(),
        })
    }
}

/// Talking to the daemon failed.
#[derive(Debug, thiserror::Error)]
pub enum MpsError {
    /// Nothing listens in the pipe directory.
    #[error("no MPS control daemon answers in {}: {source}", path.display())]
    NoDaemon {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The connection broke.
    #[error("talking to the MPS control daemon at {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The daemon wrote something else than an answer.
    #[error("the MPS control daemon answered `{0}`, not `ok` or `error`")]
    Protocol(String),
}

/// Sends `command` to the daemon of `pipe_directory` and returns its answer.
pub fn request(pipe_directory: &Path, command: &str) -> Result<Answer, MpsError> {
    let path = control_socket(pipe_directory);
    let mut stream = UnixStream::connect(&path).map_err(|source| MpsError::NoDaemon {
        path: path.clone(),
        source,
    })?;
    let io = |source| MpsError::Io {
        path: path.clone(),
        source,
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(io)?;
    stream.write_all(command.trim().as_bytes()).map_err(io)?;
    stream.write_all(b"\n").map_err(io)?;
    stream.shutdown(std::net::Shutdown::Write).map_err(io)?;
    let mut bytes = Vec::new();
    stream.read_to_end(&mut bytes).map_err(io)?;
    Answer::decode(&bytes)
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixListener;

    use super::*;

    #[test]
    fn answers_round_trip() {
        for answer in [
            Answer {
                ok: true,
                text: "25.0\n".into(),
            },
            Answer {
                ok: false,
                text: "unknown command\n".into(),
            },
            Answer {
                ok: true,
                text: String::new(),
            },
        ] {
            assert_eq!(Answer::decode(&answer.encode()).unwrap(), answer);
        }
        assert!(matches!(
            Answer::decode(b"hello\n"),
            Err(MpsError::Protocol(_))
        ));
    }

    #[test]
    fn a_request_is_one_line_and_one_answer() {
        let dir = tempfile::tempdir().unwrap();
        let listener = UnixListener::bind(control_socket(dir.path())).unwrap();
        let server = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut command = String::new();
            stream.read_to_string(&mut command).unwrap();
            let answer = Answer {
                ok: true,
                text: format!("got {command}"),
            };
            stream.write_all(&answer.encode()).unwrap();
        });
        let answer = request(dir.path(), "get_server_list").unwrap();
        server.join().unwrap();
        assert_eq!(answer.text, "got get_server_list\n");
        let missing = request(&dir.path().join("nowhere"), "quit").unwrap_err();
        assert!(matches!(missing, MpsError::NoDaemon { .. }), "{missing}");
    }
}
