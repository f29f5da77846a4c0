//! Logging: `tracing` events to stderr, one line each, as text or JSON. [`LogArgs`] are the two
//! logging flags every long-running binary flattens into its own.

use clap::ValueEnum;

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The logging flags, the same in every binary.
#[derive(Debug, Clone, clap::Args)]
pub struct LogArgs {
    /// Log format.
    #[arg(long, env = "TESSERA_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// What to log, in `RUST_LOG` syntax: `info`, `debug`, `tessera_node=debug,tessera_prepare=debug,info`
    /// [default: $RUST_LOG, else info].
    #[arg(long, env = "TESSERA_LOG_LEVEL")]
    pub log_level: Option<String>,
}

impl LogArgs {
    /// Installs the global subscriber. Call once, first thing in `main`. A filter that does not
    /// parse falls back to `info` and says so in the log.
    pub fn init(&self) {
        let text = self
            .log_level
            .clone()
            .or_else(|| std::env::var("RUST_LOG").ok())
            .filter(|t| !t.trim().is_empty());
        let (filter, refused) = match text.as_deref().map(tracing_subscriber::EnvFilter::try_new) {
            None => (tracing_subscriber::EnvFilter::new("info"), None),
            Some(Ok(filter)) => (filter, None),
            Some(Err(error)) => (tracing_subscriber::EnvFilter::new("info"), Some(error)),
        };
        init_logging(self.log_format, filter);
        if let Some(error) = refused {
            tracing::warn!(
                "--log-level / TESSERA_LOG_LEVEL `{}` is not a filter ({error}); logging at info",
                text.unwrap_or_default()
            );
        }
    }
}

fn init_logging(format: LogFormat, filter: tracing_subscriber::EnvFilter) {
    // A log line that cannot be written (stderr on a full disk) is lost, and never stops the
    // process: tracing-subscriber would otherwise report it with eprintln!, which panics.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .log_internal_errors(false);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
