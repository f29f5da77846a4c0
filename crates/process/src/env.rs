//! Environment variables of Tessera's binaries: every flag has one, named `TESSERA_` followed by
//! the flag's name in upper case (`--state-dir` ⇒ `TESSERA_STATE_DIR`).
//!
//! Older releases read bare names (`TOPOLOGY`, `STATE_DIR`, `LOG_FORMAT`, ...); those are still
//! accepted, each with a deprecation warning, and a few names that are Kubernetes conventions
//! rather than ours (`NODE_NAME`, `POD_NAMESPACE` and `POD_NAME` from the downward API,
//! `KUBECONFIG`) are accepted without one. clap reads one variable per flag, so an old name is
//! turned into the flag itself before clap parses: [`apply_renamed`] is that step as a function of
//! the command, the environment and the arguments; [`parse`] runs it on the process's own.
//!
//! The new name always wins over the old one, and a flag on the command line over both.

use std::ffi::{OsStr, OsString};

/// A variable an older release read (or a convention), and the `TESSERA_` one that replaced it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Renamed {
    /// The name older releases read.
    pub old: &'static str,
    /// The flag's variable now (`TESSERA_...`).
    pub new: &'static str,
    /// Whether using `old` is deprecated (a warning) or a convention kept on purpose (none).
    pub deprecated: bool,
}

impl Renamed {
    /// An old name, accepted with a warning.
    pub const fn deprecated(old: &'static str, new: &'static str) -> Self {
        Self {
            old,
            new,
            deprecated: true,
        }
    }

    /// A conventional name (downward API, `KUBECONFIG`), accepted without a warning.
    pub const fn convention(old: &'static str, new: &'static str) -> Self {
        Self {
            old,
            new,
            deprecated: false,
        }
    }
}

/// `[Renamed; N]` of deprecated bare names, each replaced by itself with the `TESSERA_` prefix
/// (the usual case): `deprecated_bare_names!["STATE_DIR", "TOPOLOGY"]` is
/// `[Renamed::deprecated("STATE_DIR", "TESSERA_STATE_DIR"), Renamed::deprecated("TOPOLOGY",
/// "TESSERA_TOPOLOGY")]`.
#[macro_export]
macro_rules! deprecated_bare_names {
    ($($old:literal),* $(,)?) => {
        [$($crate::env::Renamed::deprecated($old, concat!("TESSERA_", $old))),*]
    };
}

/// The names every binary built on [`crate::LogArgs`] and [`crate::ClientArgs`] accepts.
pub const COMMON_RENAMED: [Renamed; 2] = [
    Renamed::convention("KUBECONFIG", "TESSERA_KUBECONFIG"),
    Renamed::deprecated("LOG_FORMAT", "TESSERA_LOG_FORMAT"),
];

/// What happened to an old name that was set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OldEnvName {
    /// The old name was used for its flag; it is deprecated.
    Deprecated {
        /// The old name.
        old: &'static str,
        /// Its replacement.
        new: &'static str,
    },
    /// The old name was set but not used: the new name or the flag was given too.
    Ignored {
        /// The old name.
        old: &'static str,
        /// What was used instead (the new variable or the flag).
        instead: String,
    },
}

impl OldEnvName {
    /// Logs the notice as a warning (call after logging is initialised).
    pub fn log(&self) {
        match self {
            OldEnvName::Deprecated { old, new } => tracing::warn!(
                "the environment variable {old} is deprecated and will be removed: set {new} instead"
            ),
            OldEnvName::Ignored { old, instead } => tracing::warn!(
                "the environment variable {old} is ignored because {instead} is set; unset {old}"
            ),
        }
    }
}

/// The values clap's boolean flags read as false from the environment.
const FALSE_VALUES: [&str; 6] = ["n", "no", "f", "false", "off", "0"];

/// The arguments with every old name that is set and not overridden turned into its flag
/// (appended), and a notice per old name that was set. `command`'s top-level arguments are
/// searched for the one whose `env` is the new name; an old name whose new one no argument
/// carries is a programming error and is skipped (a test of each binary checks its table).
pub fn apply_renamed(
    command: &clap::Command,
    renamed: &[Renamed],
    lookup: impl Fn(&str) -> Option<OsString>,
    mut args: Vec<OsString>,
) -> (Vec<OsString>, Vec<OldEnvName>) {
    let mut notices = Vec::new();
    for entry in renamed {
        let Some(value) = lookup(entry.old) else {
            continue;
        };
        let Some(arg) = command
            .get_arguments()
            .find(|a| a.get_env() == Some(OsStr::new(entry.new)))
        else {
            continue;
        };
        let Some(long) = arg.get_long() else {
            continue;
        };
        let flag = format!("--{long}");
        if lookup(entry.new).is_some() {
            notices.push(OldEnvName::Ignored {
                old: entry.old,
                instead: entry.new.to_owned(),
            });
            continue;
        }
        let given = args.iter().skip(1).any(|a| {
            a.to_str()
                .is_some_and(|a| a == flag || a.starts_with(&format!("{flag}=")))
        });
        if given {
            notices.push(OldEnvName::Ignored {
                old: entry.old,
                instead: flag,
            });
            continue;
        }
        if arg.get_action().takes_values() {
            let mut argument = OsString::from(format!("{flag}="));
            argument.push(&value);
            args.push(argument);
        } else {
            let text = value.to_string_lossy().trim().to_ascii_lowercase();
            if !FALSE_VALUES.contains(&text.as_str()) {
                args.push(flag.into());
            }
        }
        if entry.deprecated {
            notices.push(OldEnvName::Deprecated {
                old: entry.old,
                new: entry.new,
            });
        }
    }
    (args, notices)
}

/// Parses the process's arguments and environment into `P`, old variable names included; the
/// notices are for the caller to [`OldEnvName::log`] once logging is set up.
pub fn parse<P: clap::Parser>(renamed: &[Renamed]) -> (P, Vec<OldEnvName>) {
    let (args, notices) = apply_renamed(
        &P::command(),
        renamed,
        |name| std::env::var_os(name),
        std::env::args_os().collect(),
    );
    (P::parse_from(args), notices)
}

/// Checks a binary's table against its command: every new name is some flag's variable, every
/// flag's variable starts with `TESSERA_`. For the binaries' tests.
pub fn check_table(command: &clap::Command, renamed: &[Renamed]) -> Result<(), String> {
    for arg in command.get_arguments() {
        if let Some(env) = arg.get_env() {
            let env = env.to_string_lossy();
            if !env.starts_with("TESSERA_") {
                return Err(format!(
                    "flag {:?} reads {env}, which lacks the TESSERA_ prefix",
                    arg.get_id()
                ));
            }
        } else if arg
            .get_long()
            .is_some_and(|l| l != "help" && l != "version")
        {
            return Err(format!(
                "flag {:?} has no environment variable",
                arg.get_id()
            ));
        }
    }
    for entry in renamed {
        if !command
            .get_arguments()
            .any(|a| a.get_env() == Some(OsStr::new(entry.new)))
        {
            return Err(format!(
                "{} is renamed to {}, which no flag reads",
                entry.old, entry.new
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use clap::{ArgAction, Parser};

    use super::*;

    #[derive(Debug, Parser)]
    struct Flags {
        #[arg(long, env = "TESSERA_STATE_DIR", default_value = "/var/lib/tessera")]
        state_dir: String,
        #[arg(long, env = "TESSERA_DYNAMIC_MIG")]
        dynamic_mig: bool,
        #[arg(long, env = "TESSERA_LEADER_ELECT", default_value_t = true, action = ArgAction::Set)]
        leader_elect: bool,
        #[arg(long, env = "TESSERA_NODE_NAME")]
        node_name: Option<String>,
    }

    const RENAMED: [Renamed; 3] = [
        Renamed::deprecated("STATE_DIR", "TESSERA_STATE_DIR"),
        Renamed::deprecated("DYNAMIC_MIG", "TESSERA_DYNAMIC_MIG"),
        Renamed::convention("NODE_NAME", "TESSERA_NODE_NAME"),
    ];

    fn run(env: &[(&str, &str)], argv: &[&str]) -> (Flags, Vec<OldEnvName>) {
        let env: BTreeMap<String, OsString> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), OsString::from(v)))
            .collect();
        let (args, notices) = apply_renamed(
            &<Flags as clap::CommandFactory>::command(),
            &RENAMED,
            |name| env.get(name).cloned(),
            std::iter::once("bin")
                .chain(argv.iter().copied())
                .map(OsString::from)
                .collect(),
        );
        // Only the old names are in the fake environment, so clap's own env lookup (the real
        // process environment, where none of these is set) does not interfere.
        (Flags::try_parse_from(args).unwrap(), notices)
    }

    #[test]
    fn an_old_name_still_works_and_warns() {
        let (flags, notices) = run(&[("STATE_DIR", "/old"), ("DYNAMIC_MIG", "true")], &[]);
        assert_eq!(flags.state_dir, "/old");
        assert!(flags.dynamic_mig);
        assert_eq!(
            notices,
            vec![
                OldEnvName::Deprecated {
                    old: "STATE_DIR",
                    new: "TESSERA_STATE_DIR"
                },
                OldEnvName::Deprecated {
                    old: "DYNAMIC_MIG",
                    new: "TESSERA_DYNAMIC_MIG"
                },
            ]
        );
    }

    #[test]
    fn a_false_boolean_sets_nothing_and_a_convention_does_not_warn() {
        let (flags, notices) = run(&[("DYNAMIC_MIG", "false"), ("NODE_NAME", "gpu-1")], &[]);
        assert!(!flags.dynamic_mig);
        assert_eq!(flags.node_name.as_deref(), Some("gpu-1"));
        assert_eq!(
            notices,
            vec![OldEnvName::Deprecated {
                old: "DYNAMIC_MIG",
                new: "TESSERA_DYNAMIC_MIG"
            }]
        );
        assert!(flags.leader_elect);
    }

    #[test]
    fn the_new_name_and_the_flag_win_over_the_old_name() {
        let (flags, notices) = run(&[("STATE_DIR", "/old"), ("TESSERA_STATE_DIR", "/new")], &[]);
        // The fake environment is not clap's: the old value must not have been applied.
        assert_eq!(flags.state_dir, "/var/lib/tessera");
        assert_eq!(
            notices,
            vec![OldEnvName::Ignored {
                old: "STATE_DIR",
                instead: "TESSERA_STATE_DIR".into()
            }]
        );
        let (flags, notices) = run(&[("STATE_DIR", "/old")], &["--state-dir=/flag"]);
        assert_eq!(flags.state_dir, "/flag");
        assert_eq!(
            notices,
            vec![OldEnvName::Ignored {
                old: "STATE_DIR",
                instead: "--state-dir".into()
            }]
        );
    }

    #[test]
    fn bare_names_are_deprecated_for_their_prefixed_form() {
        assert_eq!(
            crate::deprecated_bare_names!["STATE_DIR", "TOPOLOGY"],
            [
                Renamed::deprecated("STATE_DIR", "TESSERA_STATE_DIR"),
                Renamed::deprecated("TOPOLOGY", "TESSERA_TOPOLOGY"),
            ]
        );
    }

    #[test]
    fn the_table_check_finds_unprefixed_and_unknown_names() {
        let command = <Flags as clap::CommandFactory>::command();
        check_table(&command, &RENAMED).unwrap();
        let error = check_table(&command, &[Renamed::deprecated("X", "TESSERA_X")]).unwrap_err();
        assert!(error.contains("TESSERA_X"), "{error}");
        #[derive(Debug, Parser)]
        struct Bare {
            #[arg(long, env = "TOPOLOGY")]
            topology: Option<String>,
        }
        let error = check_table(&<Bare as clap::CommandFactory>::command(), &[]).unwrap_err();
        assert!(error.contains("TOPOLOGY"), "{error}");
    }
}
