//! The runtime cost budget of one evaluation.
//!
//! The `cel` interpreter has no cost hooks, so cost is charged by functions the evaluation calls:
//! the `@cost` ticks that compilation inserts into every comprehension iteration, the `@size`
//! charges it puts around arguments whose size is not bounded by the device or the source, and
//! the library functions of this crate, which charge for the work they do before doing it. The
//! functions are plain `fn` pointers, so the budget lives in a thread-local that [`Meter`] arms
//! for the duration of one evaluation (evaluation never leaves its thread).
//!
//! Once the budget is spent every further charge fails, and the exhaustion is sticky: even if
//! CEL's error absorption (`error || true`) swallows the failing call, [`Meter::finish`] reports
//! the evaluation as over budget.

use std::cell::Cell;

use cel::ExecutionError;

thread_local! {
    static BUDGET: Cell<Budget> = const { Cell::new(Budget::DISARMED) };
}

#[derive(Debug, Clone, Copy)]
struct Budget {
    armed: bool,
    limit: u64,
    spent: u64,
    exceeded: bool,
}

impl Budget {
    const DISARMED: Budget = Budget {
        armed: false,
        limit: 0,
        spent: 0,
        exceeded: false,
    };
}

/// The budget of the evaluation running on this thread; restores the previous one when finished.
pub(crate) struct Meter {
    previous: Budget,
}

/// What an evaluation cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Spent {
    pub cost: u64,
    pub exceeded: bool,
}

impl Meter {
    pub(crate) fn start(limit: u64) -> Meter {
        let previous = BUDGET.with(|b| {
            b.replace(Budget {
                armed: true,
                limit,
                spent: 0,
                exceeded: false,
            })
        });
        Meter { previous }
    }

    pub(crate) fn finish(self) -> Spent {
        let budget = BUDGET.with(|b| b.get());
        Spent {
            cost: budget.spent,
            exceeded: budget.exceeded,
        }
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        BUDGET.with(|b| b.set(self.previous));
    }
}

/// Charges `units` to the running evaluation; fails once the budget is spent. Outside an
/// evaluation (no meter armed) it charges nothing.
pub(crate) fn charge(units: u64) -> Result<(), ExecutionError> {
    BUDGET.with(|b| {
        let mut budget = b.get();
        if !budget.armed {
            return Ok(());
        }
        budget.spent = budget.spent.saturating_add(units);
        if budget.spent > budget.limit {
            budget.exceeded = true;
        }
        b.set(budget);
        if budget.exceeded {
            Err(ExecutionError::function_error(
                "cost",
                "actual cost limit exceeded",
            ))
        } else {
            Ok(())
        }
    })
}

/// Cost of traversing `bytes` bytes of a string, as cel-go charges it (a tenth per byte).
pub(crate) fn string_traversal(bytes: usize) -> u64 {
    1 + (bytes as u64).div_ceil(10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_until_the_limit_then_sticks() {
        let meter = Meter::start(10);
        assert!(charge(4).is_ok());
        assert!(charge(6).is_ok());
        assert!(charge(1).is_err());
        assert!(charge(0).is_err(), "exhaustion is sticky");
        let spent = meter.finish();
        assert_eq!(spent.cost, 11);
        assert!(spent.exceeded);
        assert!(charge(1_000_000).is_ok(), "disarmed after finish");
    }

    #[test]
    fn nested_meters_restore_the_outer_budget() {
        let outer = Meter::start(100);
        charge(50).unwrap();
        {
            let inner = Meter::start(1);
            assert!(charge(2).is_err());
            assert!(inner.finish().exceeded);
        }
        charge(50).unwrap();
        assert_eq!(outer.finish().cost, 100);
    }
}
