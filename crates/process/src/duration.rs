//! Duration flags: `250ms`, `30s`, `5m`, `1h30m` (jiff's "friendly" format, which also takes
//! `90 seconds` and ISO 8601's `PT5M`). The parser is jiff's; this module only adds the rules a
//! flag needs: a duration is positive (a zero interval or lease makes no sense) and at most
//! [`MAX_DURATION`], so no later arithmetic (deadlines, timestamps) can overflow. A number too
//! large for any duration is an error too, never a panic.
//!
//! A bare number (`15`) is read as seconds, as the flags have always taken it.

use std::time::Duration;

use jiff::SignedDuration;

/// The longest duration a flag takes: one year.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// Why a duration flag was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Not a duration at all (or too large for one).
    #[error("`{text}` is not a duration ({reason}); write e.g. 500ms, 30s, 5m or 1h30m")]
    Syntax { text: String, reason: String },
    /// Zero or negative.
    #[error("`{text}`: the duration must be positive")]
    NotPositive { text: String },
    /// Longer than [`MAX_DURATION`].
    #[error("`{text}` is longer than the longest duration taken (8760h, one year)")]
    TooLong { text: String },
}

/// Parses a duration flag (see the module documentation). Usable as a clap `value_parser`.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let trimmed = text.trim();
    let signed = if !trimmed.is_empty() && trimmed.bytes().all(|b| b.is_ascii_digit()) {
        trimmed
            .parse::<i64>()
            .map(SignedDuration::from_secs)
            .map_err(|error| error.to_string())
    } else {
        trimmed
            .parse::<SignedDuration>()
            .map_err(|error| error.to_string())
    }
    .map_err(|reason| DurationError::Syntax {
        text: text.to_owned(),
        reason,
    })?;
    if signed.is_negative() || signed.is_zero() {
        return Err(DurationError::NotPositive {
            text: text.to_owned(),
        });
    }
    let duration = Duration::try_from(signed).map_err(|error| DurationError::Syntax {
        text: text.to_owned(),
        reason: error.to_string(),
    })?;
    if duration > MAX_DURATION {
        return Err(DurationError::TooLong {
            text: text.to_owned(),
        });
    }
    Ok(duration)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_usual_forms_parse() {
        for (text, expected) in [
            ("250ms", Duration::from_millis(250)),
            ("30s", Duration::from_secs(30)),
            ("5m", Duration::from_secs(300)),
            ("1h", Duration::from_secs(3600)),
            ("1h30m", Duration::from_secs(5400)),
            ("90 seconds", Duration::from_secs(90)),
            ("PT5M", Duration::from_secs(300)),
            ("15", Duration::from_secs(15)),
            (" 10s ", Duration::from_secs(10)),
            ("8760h", MAX_DURATION),
        ] {
            assert_eq!(parse_duration(text), Ok(expected), "{text}");
        }
    }

    #[test]
    fn zero_and_negative_durations_are_refused() {
        for text in ["0s", "0", "0ms", "-1s", "-5m"] {
            assert!(
                matches!(parse_duration(text), Err(DurationError::NotPositive { .. })),
                "{text}: {:?}",
                parse_duration(text)
            );
        }
    }

    #[test]
    fn overflow_is_an_error_not_a_panic() {
        for text in [
            "999999999999999999m",
            "999999999999999999999999s",
            "99999999999999999999",
            "9999999999h",
        ] {
            let error = parse_duration(text).unwrap_err();
            assert!(error.to_string().contains(text), "{error}");
        }
        assert!(matches!(
            parse_duration("8761h"),
            Err(DurationError::TooLong { .. })
        ));
    }

    #[test]
    fn text_that_is_no_duration_is_refused_with_an_example() {
        for text in [
            "",
            "s",
            "m",
            "1.5.s",
            "5 minutes and change",
            "1x",
            "ten seconds",
        ] {
            let error = parse_duration(text).unwrap_err();
            assert!(
                matches!(error, DurationError::Syntax { .. }),
                "{text}: {error:?}"
            );
            assert!(error.to_string().contains("e.g. 500ms"), "{error}");
        }
    }
}
