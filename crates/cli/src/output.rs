//! `-o text|json`: the output flag of the commands that print a report (`explain`, `simulate`,
//! `top`, `validate`, `version`), declared once so that each takes it the same way. (`inventory`
//! prints ResourceSlices and has formats of its own: yaml, json, table.)

/// What a report is printed as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// For people: an account or a table.
    Text,
    /// For programs: one JSON document (its fields are in docs/user-guide.md and the command's
    /// help).
    Json,
}

/// The `-o`/`--output` flag; flatten it into a command's arguments.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct Output {
    /// Output format.
    #[arg(
        short = 'o',
        long = "output",
        env = "TESSERA_OUTPUT",
        value_enum,
        default_value = "text"
    )]
    pub format: OutputFormat,
}

impl Output {
    pub fn json(&self) -> bool {
        self.format == OutputFormat::Json
    }
}
