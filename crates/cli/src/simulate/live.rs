//! The claims of a trace that hold devices, and when each leaves: the replay loop every
//! simulation shares (claims arrive in trace order, the index is the clock, and a claim
//! allocated at arrival `i` with lifetime `l` leaves before arrival `i + l`).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use k8s_openapi::api::resource::v1::AllocationResult;
use tessera_allocator::AllocatedState;

/// The allocations live at the current arrival, with what the caller keeps of each (`T`).
pub(super) struct LiveClaims<T> {
    /// The devices the live claims hold.
    pub state: AllocatedState,
    live: HashMap<usize, (AllocationResult, T)>,
    departures: BinaryHeap<Reverse<(u64, usize)>>,
}

impl<T> LiveClaims<T> {
    pub fn new() -> Self {
        LiveClaims {
            state: AllocatedState::new(),
            live: HashMap::new(),
            departures: BinaryHeap::new(),
        }
    }

    /// How many claims are live.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// Releases the claims whose lifetime ended by `now`, handing what was kept of each to
    /// `released`.
    pub fn depart(&mut self, now: u64, mut released: impl FnMut(T)) -> anyhow::Result<()> {
        while let Some(Reverse((t, i))) = self.departures.peek().copied() {
            if t > now {
                break;
            }
            self.departures.pop();
            if let Some((result, kept)) = self.live.remove(&i) {
                self.state.remove_allocation(&result)?;
                released(kept);
            }
        }
        Ok(())
    }

    /// Records the allocation of the claim arriving at `index`, live for `lifetime` arrivals.
    pub fn arrive(
        &mut self,
        index: usize,
        lifetime: u64,
        result: AllocationResult,
        kept: T,
    ) -> anyhow::Result<()> {
        self.state.add_allocation(&result)?;
        self.live.insert(index, (result, kept));
        self.departures
            .push(Reverse((index as u64 + lifetime, index)));
        Ok(())
    }
}
